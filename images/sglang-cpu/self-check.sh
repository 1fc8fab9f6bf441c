#!/usr/bin/env bash
# The sglang-cpu image's self-check, run after its build (make image-sglang-cpu): the kit's tiny target served by
# SGLang's CPU engine inside the image, with no network, one greedy completion through the OpenAI endpoint and
# /metrics scraped (`python -m draftscope sglang-cpu-check`). Prints the figures as JSON; exits with the check's
# code. Usage: images/sglang-cpu/self-check.sh ENGINE IMAGE
#
# The container is run by name and its exit code read back with inspect: through podman's Docker API (podman 4.3)
# the docker CLI's own exit status and --rm cannot be trusted.
set -euo pipefail
engine=${1:?usage: self-check.sh ENGINE IMAGE} image=${2:?usage: self-check.sh ENGINE IMAGE}
name="draftscope-sglang-cpu-check-$$"
trap '"$engine" rm -f "$name" > /dev/null 2>&1 || true' EXIT
began=$SECONDS
"$engine" run --name "$name" --network none "$image" \
    python -m draftscope sglang-cpu-check --work /tmp/sglang-cpu-check || true
code="$("$engine" inspect -f '{{.State.ExitCode}}' "$name" 2>/dev/null || echo 1)"
echo "sglang-cpu self-check: exit ${code} after $((SECONDS - began)) s (container start included)" >&2
exit "$code"
