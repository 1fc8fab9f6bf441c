"""The vllm-cpu image on a real engine: built from its lock by the kit's own build task, it holds the environment
images.lock.json records, and the real vLLM engine generates in it on the CPU the same greedy tokens as the host's
CPU engine environment (`.venv-train`, the same lock).

Timings (build, engine load, generation) are printed; run with `-s` to see them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from draftscope.core.jsonio import sha256_file
from draftscope.ops import images as I

from containerlib import ROOT, docker

# The first build installs ~2.9 GB of dependencies (~5–9 min on two loaded cores); the engine loads in ~1–2 min.
pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]

SCRIPT = Path(__file__).with_name("vllm_cpu_generate.py")
TINY = ROOT / "src" / "draftscope" / "assets" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# The speculators/vLLM CPU environment on the host, as `make train-env` builds it (or DRAFTSCOPE_TRAIN_PYTHON).
TRAIN_PYTHON = Path(os.environ.get("DRAFTSCOPE_TRAIN_PYTHON", ROOT / ".venv-train" / "bin" / "python"))
ENGINE_TIMEOUT_S = 600


def run_container(image: str, *args: str, mounts: dict[Path, str], timeout: float) -> tuple[int, str]:
    """`docker run` by name, then the exit code read back and the container removed: under podman 4.3 the CLI's
    own exit status (and `--rm`) cannot be trusted. `--init` so that a stop ends the process cleanly."""
    name = f"draftscope-test-vllm-cpu-{uuid.uuid4().hex[:8]}"
    argv = [
        "run",
        "--name",
        name,
        "--init",
        "--network",
        "none",
        "--shm-size",
        "1g",
        "-e",
        "HF_HUB_OFFLINE=1",
    ]
    for host, target in mounts.items():
        argv += ["-v", f"{host}:{target}"]
    try:
        done = docker(*argv, image, *args, timeout=timeout)
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        return int(code) if code.lstrip("-").isdigit() else -1, done.stdout + done.stderr
    finally:
        docker("rm", "-f", name)


def test_the_image_holds_the_recorded_environment(vllm_cpu_image):
    image, build_seconds = vllm_cpu_image
    print(f"\nvllm-cpu image build (invoke images.build vllm-cpu): {build_seconds:.0f} s")
    entry = I.lock_entry("vllm-cpu", I.load_lock())
    (facts,) = json.loads(docker("image", "inspect", image).stdout)
    labels, config = facts["Config"]["Labels"], facts["Config"]
    assert labels["io.draftscope.image"] == "vllm-cpu"
    assert labels["io.draftscope.kit-wheel-sha256"] == entry["wheel_sha256"]
    wheel = labels["io.draftscope.torch-source"].removeprefix("wheel:")
    assert labels["io.draftscope.torch-wheel-sha256"] == sha256_file(ROOT / ".wheels" / wheel)
    assert labels["org.opencontainers.image.base.name"] == I.base_reference(entry)
    assert config["User"] == "10001:10001"
    assert "VLLM_CPU_KVCACHE_SPACE=1" in config["Env"]

    probe = (
        "import json, subprocess, sys, vllm;"
        "check = json.loads(subprocess.run([sys.executable, '-m', 'draftscope', 'selfcheck'],"
        " capture_output=True, text=True, check=True).stdout);"
        "print('RESULT ' + json.dumps({'selfcheck': check, 'vllm': vllm.__version__}))"
    )
    start = time.monotonic()
    code, output = run_container(image, "python", "-c", probe, mounts={}, timeout=300)
    print(f"selfcheck and import vllm in the image: {time.monotonic() - start:.0f} s")
    assert code == 0, output[-4000:]
    (line,) = [x for x in output.splitlines() if x.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    versions = found["selfcheck"]["versions"]
    assert found["selfcheck"]["ok"] is True
    assert versions["python"].startswith(entry["python"] + ".")
    # vllm-cpu is the distribution's name: vLLM's own version is read from the module.
    assert found["vllm"] == entry["versions"]["vllm"]
    for key in ("torch", "transformers", "speculators"):
        assert versions[key] == entry["versions"][key], key


def _model_folder(parent: Path) -> Path:
    """The tiny target as an engine loads it: config and weights with the tokenizer files beside them."""
    folder = parent / "model"
    folder.mkdir()
    for path in [*(TINY / "target").iterdir(), *(TINY / n for n in TOKENIZER_FILES)]:
        shutil.copy(path, folder / path.name)
    for path in [parent, folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the image's user 10001
    return folder


def _host_train_python() -> Path:
    if TRAIN_PYTHON.is_file():
        return TRAIN_PYTHON
    message = (
        f"no CPU engine environment at {TRAIN_PYTHON}: run `make train-env` (.ci/run does, before this tier)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def test_vllm_generates_in_the_image_the_tokens_it_generates_on_the_host(vllm_cpu_image, tmp_path):
    image, _ = vllm_cpu_image
    host_python = _host_train_python()
    model = _model_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)  # the image's user writes here

    start = time.monotonic()
    code, output = run_container(
        image,
        "python",
        "/opt/test/generate.py",
        "/model",
        "/out/image.json",
        mounts={model: "/model:ro", SCRIPT: "/opt/test/generate.py:ro", out: "/out"},
        timeout=ENGINE_TIMEOUT_S,
    )
    in_image_s = time.monotonic() - start
    assert code == 0, output[-6000:]

    start = time.monotonic()
    host = subprocess.run(
        [str(host_python), str(SCRIPT), str(model), str(out / "host.json")],
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    on_host_s = time.monotonic() - start
    assert host.returncode == 0, host.stdout[-3000:] + host.stderr[-3000:]

    in_image = json.loads((out / "image.json").read_text())
    on_host = json.loads((out / "host.json").read_text())
    print(
        f"\nvLLM on the CPU, tiny target: in the image {in_image_s:.0f} s (engine load"
        f" {in_image['load_seconds']} s, generation {in_image['generate_seconds']} s); on the host {on_host_s:.0f} s"
        f" (load {on_host['load_seconds']} s, generation {on_host['generate_seconds']} s)"
    )
    entry = I.lock_entry("vllm-cpu", I.load_lock())
    assert in_image["device"] == on_host["device"] == "cpu"
    assert in_image["versions"] == on_host["versions"]
    assert in_image["versions"]["vllm"] == entry["versions"]["vllm"]
    assert in_image["versions"]["torch"] == entry["versions"]["torch"]
    assert len(in_image["outputs"]) == len(on_host["outputs"]) == 3
    for mine, theirs in zip(in_image["outputs"], on_host["outputs"], strict=True):
        assert mine["prompt_token_ids"] == theirs["prompt_token_ids"]
        assert len(mine["token_ids"]) == 24
        # A varied continuation, so that agreement is not two engines repeating one token.
        assert len(set(mine["token_ids"])) >= 8, mine["token_ids"]
        assert mine["token_ids"] == theirs["token_ids"], (mine, theirs)
