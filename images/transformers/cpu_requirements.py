"""Requirements for the transformers image's CPU test path, printed to stdout.

    python3 cpu_requirements.py REQUIREMENTS_LOCK TORCH_WHEEL_PATH TORCH_WHEEL_SHA256

The lock is compiled for the GPU image: torch from PyPI is a CUDA build that pulls triton and NVIDIA's CUDA
libraries. The CPU path replaces that stack with a CPU torch wheel: this prints every other entry of the lock
unchanged (still hash-pinned) and adds the wheel's path with its SHA-256, so one `pip install
--require-hashes` checks everything. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys

# The CUDA torch stack: torch itself, triton, and the CUDA libraries torch's wheel depends on. nvidia-ml-py
# (NVML bindings, a kit dependency) is not part of it.
CUDA_TORCH_STACK = re.compile(
    r"^(torch|triton|cuda-[a-z0-9-]+|nvidia-(?!ml-py\b)[a-z0-9-]+)==", re.IGNORECASE
)


def cpu_requirements(lock_text: str, wheel: str, sha256: str) -> str:
    """The lock without the CUDA torch stack, plus `wheel --hash=sha256:…`."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
    if not wheel.endswith(".whl") or "/" not in wheel:
        raise ValueError(f"not a path to a wheel: {wheel!r}")
    out, skipping = [], False
    for line in lock_text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            skipping = bool(CUDA_TORCH_STACK.match(line))
        if not skipping:
            out.append(line)
    out += [
        "# The CPU test path's torch, replacing the CUDA torch stack above.",
        f"{wheel} --hash=sha256:{sha256}",
    ]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    lock, wheel, sha256 = argv
    with open(lock, encoding="utf-8") as fh:
        text = fh.read()
    try:
        sys.stdout.write(cpu_requirements(text, wheel, sha256))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
