#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (the device tool), in parts; each says what it proves. Results
# go under $OUT: a log per part and gpu-check.json (each part's exit code and seconds, the hardware), the pytest
# parts' JUnit XML (passed, failed and skipped tests: a skip on a GPU machine is a check that did not run), and the
# head benchmark's report for research/evidence/.
#
#   bash tests/gpu/gpu_check.sh            run every part (their time limits add up to 8 minutes)
#   bash tests/gpu/gpu_check.sh --dry-run  list the parts, what each proves and the command and tests it runs
#
# The head benchmark's report follows the frozen protocol research/studies/prefix-head-gpu.yaml; the script tries
# `invoke evidence.add` on a copy of research/ (the checkout's is never touched here) and prints the one line that
# files the report into research/evidence/prefix-head-gpu/measurements/ once it is back on the development machine.
#
# The device image has Python 3.12, torch, triton and transformers, no network and no vLLM: the kit's other
# dependencies travel as wheels in .whl/ (see tests/gpu/wheels.txt; download them with the command in its header) and
# the call carries it: run(command="bash tests/gpu/gpu_check.sh", carry=[".whl", ".kit-commit"], timeout_s=480).
# The copy has no .git: before the call, state the commit for the reports' provenance (.kit-commit is ignored, so
# it travels only by `carry`):  { git rev-parse HEAD; git diff --quiet HEAD && echo 0 || echo 1; } > .kit-commit
set -uo pipefail
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; elif [ $# -gt 0 ]; then
  echo "usage: bash tests/gpu/gpu_check.sh [--dry-run]" >&2; exit 2
fi
OUT=${OUT:-/tmp/gpu-out}
STUDY=prefix-head-gpu
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
REPORT=head-bench-cuda-${GPU:-gpu}-$(date -u +%Y%m%dT%H%M%SZ).json
RESULTS=()  # one JSON object per part that ran

part() {  # part NAME LIMIT_S "WHAT IT PROVES" "TESTS (pytest node ids, or -)" COMMAND...: list it, or run it
  local name=$1 limit=$2 proves=$3 tests=$4; shift 4
  if [ "$DRY_RUN" = 1 ]; then
    echo "part $name (at most ${limit} s): $proves"
    echo "  runs: $*"
    [ "$tests" = "-" ] || echo "  tests: $tests"
    return 0
  fi
  local began=$SECONDS code
  echo "== part $name"
  if [ "$(type -t "$1")" = function ]; then
    "$@" 2>&1 | tee "$OUT/$name.log"  # a step of this script's own: quick, no limit of its own
  else
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  fi
  code=${PIPESTATUS[0]}
  RESULTS+=("{\"part\": \"$name\", \"exit_code\": $code, \"seconds\": $((SECONDS - began)), \"log\": \"$name.log\"}")
  echo "== part $name: exit code $code after $((SECONDS - began)) s"
}

if [ "$DRY_RUN" = 0 ]; then
  if [ -f .kit-commit ]; then
    { read -r DRAFTSCOPE_GIT_COMMIT; read -r DRAFTSCOPE_GIT_DIRTY; } < .kit-commit
    export DRAFTSCOPE_GIT_COMMIT DRAFTSCOPE_GIT_DIRTY
  fi
  mkdir -p "$OUT"
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD/src
  else
    export PYTHONPATH=$PWD/src
  fi
  export PYTHONUNBUFFERED=1
fi

hardware() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv &&
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
}

evidence_check() {  # the report against its schema and the study's frozen options: `evidence.add` into a copy
  if [ ! -f "$OUT/$REPORT" ]; then
    echo "no report: head-bench failed (see $OUT/head-bench.log)"; return 1
  fi
  rm -rf /tmp/research-check && cp -r research /tmp/research-check
  if python3 -m invoke evidence.add "$OUT/$REPORT" --study "$STUDY" --root /tmp/research-check; then
    echo "evidence check passed; to file the report, run from the repo root of the development machine:"
    echo "  invoke evidence.add $OUT/$REPORT --study $STUDY"
    echo "(through the device tool, \$OUT's files come back under its files_at: FILES_AT/$REPORT)"
  else
    echo "evidence check FAILED: $OUT/$REPORT would be refused (see above); do not add it"; return 1
  fi
}

part hardware 20 "the GPU, driver, CUDA, torch and triton every other part ran on" - hardware
part head-graph 100 \
  "the certified head captured as CUDA graphs (conditional and predicated) equals the eager certified head and the dense head; the plugin's conditional head on the Triton stages counts on the device" \
  "tests/unit/head/test_head_graph.py::test_captured_heads_match_the_eager_head tests/unit/head/test_head_graph.py::test_the_plugins_conditional_head_on_the_triton_stages_counts_on_the_device" \
  python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/unit/head/test_head_graph.py --junitxml "$OUT/head-graph.xml"
part transformers-cuda 140 \
  "the Transformers backend on CUDA: the tiny target and draft load and run, the speculative loop is exact on the GPU, and --memory-fraction is applied (a fraction too small ends the run out of memory)" \
  "tests/gpu/test_transformers_cuda.py::test_the_runs_complete_validate_and_record_the_gpu tests/gpu/test_transformers_cuda.py::test_the_speculative_loop_is_exact_on_cuda tests/gpu/test_transformers_cuda.py::test_the_memory_cap_is_applied" \
  python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_transformers_cuda.py --junitxml "$OUT/transformers-cuda.xml"
# The head benchmark on CUDA with the options research/studies/prefix-head-gpu.yaml froze (its defaults: rows 1, 8
# and 16 at vocabularies 151936 and 248320), to a new file name (evidence is never overwritten):
part head-bench 190 \
  "the dense bf16 head against the certified path's Triton kernels on this GPU, rows 1/8/16 at V 151936 and 248320 (the frozen protocol prefix-head-gpu)" - \
  python3 -m invoke head-bench --device cuda --repeats 10 --output "$OUT/$REPORT"
part evidence 30 "the head benchmark's report passes evidence.add against the frozen study (on a copy of research/)" - \
  evidence_check
if [ "$DRY_RUN" = 1 ]; then
  echo "not yet a part: the vLLM backend and the prefix-head plugin inside vLLM's GPU engine (the kit plans the tiny models for vLLM's CPU engine only)"
  exit 0
fi
hardware_text=$(python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' < "$OUT/hardware.log")
{
  echo "{\"schema_version\": 1, \"kind\": \"gpu-check\", \"report\": \"$REPORT\", \"hardware\": $hardware_text, \"parts\": ["
  (IFS=,; echo "${RESULTS[*]}")
  echo "]}"
} > "$OUT/gpu-check.json"
echo "gpu_check done: $OUT/gpu-check.json" | tee -a "$OUT/evidence.log"
