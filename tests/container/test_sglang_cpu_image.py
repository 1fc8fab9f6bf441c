"""The sglang-cpu image on a real engine: built by the kit's own build task from its lock and SGLang's CPU kernel
sources (the file SGLANG_CPU_SOURCES names, checked against images.lock.json), it holds one SGLang release in both
its Python package and its kernel, and its self-check serves the kit's tiny target on SGLang's CPU engine: one
greedy completion and `/metrics` (`images/sglang-cpu/self-check.sh`, what `make image-sglang-cpu` runs).

`make test-sglang-cpu SGLANG_CPU_SOURCES=FILE`; not in CI (CI has no copy of the sources). Timings are printed: run
with `-s` to see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from draftscope.ops import images as I

from containerlib import ROOT, base_image, build_image, docker
from support import unavailable

pytestmark = [pytest.mark.container, pytest.mark.sglang_cpu, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def sglang_cpu_image(engine) -> tuple[str, float]:
    sources = os.environ.get("SGLANG_CPU_SOURCES")
    if not sources or not Path(sources).is_file():
        unavailable(
            f"SGLANG_CPU_SOURCES={sources!r} names no file (SGLang's CPU kernel sources, images/sglang-cpu)"
        )
    base_image()
    seconds = build_image("sglang-cpu", "--kernel-sources", sources)
    return I.image_reference("sglang-cpu"), seconds


def _python(image: str, code: str, timeout: float = 300) -> str:
    name = f"draftscope-test-sglang-cpu-{uuid.uuid4().hex[:8]}"
    try:
        done = docker(
            "run", "--name", name, "--network", "none", image, "python", "-c", code, timeout=timeout
        )
        exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        assert exit_code == "0", done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout
    finally:
        docker("rm", "-f", name)


def test_one_release_in_the_package_and_the_kernel(sglang_cpu_image):
    image, build_seconds = sglang_cpu_image
    print(f"\nsglang-cpu image build (invoke images.build sglang-cpu): {build_seconds:.0f} s")
    entry = I.lock_entry("sglang-cpu", I.load_lock())
    (facts,) = json.loads(docker("image", "inspect", image).stdout)
    labels, config = facts["Config"]["Labels"], facts["Config"]
    assert labels["io.draftscope.image"] == "sglang-cpu"
    assert labels["io.draftscope.kernel-sources-sha256"] == entry["kernel_sources"]["sha256"]
    assert labels["io.draftscope.kit-wheel-sha256"] == entry["wheel_sha256"]
    assert config["User"] == "10001:10001"
    assert "SGLANG_USE_CPU_ENGINE=1" in config["Env"]
    probe = (
        "import json, importlib.metadata as m, torch, sgl_kernel, sglang;"
        "from sglang.srt.utils.common import cpu_has_amx_support;"
        "print('RESULT ' + json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__,"
        " 'kernel': m.version('sglang-kernel-cpu'), 'kernel_file': sgl_kernel.common_ops.__file__,"
        " 'ops': sorted(n for n in ('extend_attention_cpu', 'decode_attention_cpu', 'convert_weight_packed')"
        "  if hasattr(torch.ops.sgl_kernel, n)), 'amx': cpu_has_amx_support()}))"
    )
    (line,) = [x for x in _python(image, probe).splitlines() if x.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    print(f"in the image: {found}")
    assert found["sglang"] == entry["versions"]["sglang"] == "0.5.18"
    assert found["torch"] == entry["versions"]["torch"]
    # The kernel is the release's own package, built here, loaded from the path SGLang falls back to without a GPU.
    assert found["kernel"] == "0.4.6.post1"
    assert found["kernel_file"].endswith(".so") and "/sgl_kernel/common_ops" in found["kernel_file"]
    assert found["ops"] == ["convert_weight_packed", "decode_attention_cpu", "extend_attention_cpu"]
    host_amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
    assert found["amx"] is host_amx  # SGLang's own test agrees with the host's flags


def test_self_check_serves_a_completion_and_metrics(sglang_cpu_image):
    image, _ = sglang_cpu_image
    began = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "images" / "sglang-cpu" / "self-check.sh"), "docker", image],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    print(f"\n{done.stderr[-1500:]}\nself-check: {time.monotonic() - began:.0f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert result["ok"] is True and result["sglang"] == "0.5.18"
    assert result["completion_tokens"] >= 1
    assert result["metrics"] > 0
    assert "sglang:num_running_reqs" in result["metric_names"]
