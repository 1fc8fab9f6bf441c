#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (the device tool): gpu-marked tests, the head benchmark on
# CUDA, the Triton kernels compiled for the machine's architecture; results under $OUT for research/evidence/.
#
# The device image has Python 3.12, torch, triton and transformers, no network: the kit's other dependencies travel
# as wheels in .whl/ (see tests/gpu/wheels.txt; download them with the command in its header) and the call carries
# it: run(command="bash tests/gpu/gpu_check.sh", carry=[".whl"], timeout_s=480).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/hardware.txt"
# 1. every gpu-marked test (the captured heads, the Triton kernels on CUDA, the Transformers backend on CUDA)
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/unit 2>&1 | tee "$OUT/gpu-tests.log"
# 2. the property test on CUDA tensors is CPU-only by design (numpy ground truth); the head benchmark on CUDA:
timeout 200 python3 -m invoke head-bench --device cuda --repeats 10 --output "$OUT/head-bench-cuda.json" 2>&1 \
  | tee "$OUT/head-bench-cuda.log"
echo "gpu_check done" | tee -a "$OUT/gpu-tests.log"
