#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (the device tool): gpu-marked tests, the head benchmark on
# CUDA, the Triton kernels compiled for the machine's architecture; results under $OUT for research/evidence/.
# The head benchmark's report follows the frozen protocol research/studies/prefix-head-gpu.yaml; the script tries
# `invoke evidence.add` on a copy of research/ (the checkout's is never touched here) and prints the one line that
# files the report into research/evidence/prefix-head-gpu/measurements/ once it is back on the development machine.
#
# The device image has Python 3.12, torch, triton and transformers, no network: the kit's other dependencies travel
# as wheels in .whl/ (see tests/gpu/wheels.txt; download them with the command in its header) and the call carries
# it: run(command="bash tests/gpu/gpu_check.sh", carry=[".whl", ".kit-commit"], timeout_s=480).
# The copy has no .git: before the call, state the commit for the reports' provenance (.kit-commit is ignored, so
# it travels only by `carry`):  { git rev-parse HEAD; git diff --quiet HEAD && echo 0 || echo 1; } > .kit-commit
set -uo pipefail
if [ -f .kit-commit ]; then
  { read -r DRAFTSCOPE_GIT_COMMIT; read -r DRAFTSCOPE_GIT_DIRTY; } < .kit-commit
  export DRAFTSCOPE_GIT_COMMIT DRAFTSCOPE_GIT_DIRTY
fi
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
# 2. the property test on CUDA tensors is CPU-only by design (numpy ground truth); the head benchmark on CUDA, with
#    the options research/studies/prefix-head-gpu.yaml froze, to a new file name (evidence is never overwritten):
STUDY=prefix-head-gpu
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
REPORT=head-bench-cuda-${GPU:-gpu}-$(date -u +%Y%m%dT%H%M%SZ).json
timeout 200 python3 -m invoke head-bench --device cuda --repeats 10 --output "$OUT/$REPORT" 2>&1 \
  | tee "$OUT/head-bench-cuda.log"
# 3. the report against its schema and the study's frozen options: `evidence.add` into a copy of research/.
if [ -f "$OUT/$REPORT" ]; then
  rm -rf /tmp/research-check && cp -r research /tmp/research-check
  if python3 -m invoke evidence.add "$OUT/$REPORT" --study "$STUDY" --root /tmp/research-check 2>&1 \
      | tee "$OUT/evidence-check.log"; then  # pipefail: the status is evidence.add's
    {
      echo "evidence check passed; to file the report, run from the repo root of the development machine:"
      echo "  invoke evidence.add $OUT/$REPORT --study $STUDY"
      echo "(through the device tool, \$OUT's files come back under its files_at: FILES_AT/$REPORT)"
    } | tee -a "$OUT/evidence-check.log"
  else
    echo "evidence check FAILED: $OUT/$REPORT would be refused (see above); do not add it" | tee -a "$OUT/evidence-check.log"
  fi
else
  echo "no report: head-bench failed (see $OUT/head-bench-cuda.log)" | tee "$OUT/evidence-check.log"
fi
echo "gpu_check done" | tee -a "$OUT/gpu-tests.log"
