"""Helpers of the container tier (import as `from containerlib import …`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/debian-py:ci"
TORCH_PIN = "torch==2.13.0"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
