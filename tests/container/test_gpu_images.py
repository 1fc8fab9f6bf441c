"""The real vllm and train images on a real engine (podman): built by the kit's own build task from their
hash-locked wheels (vLLM 0.33.0, PyPI's CUDA torch 2.14.0, the nvidia-* wheels) on the local Debian base, no GPU.

- they say what they hold: labels (kit wheel, lock hashes, CUDA_ARCH), a CycloneDX SBOM naming vLLM and torch,
  the non-root user; their size is printed;
- in each, every argv the kit's plans emit for it parses with the engine's own parser
  (`python -m draftscope argv-check`, a build step too), and each flag renamed in turn in a planned argv is refused;
- the tiny pipeline's CPU stages (regen in the vllm image, then pretokenize → prepare → hsextract (Transformers) →
  train (CPU path) → convert) run inside the train image and give a local run's outputs: byte for byte where the computation is the same code on
  the same numbers, within a stated tolerance where the torch builds differ (CUDA 2.14.0 in the image, CPU 2.13.0 on
  the host: float kernels may round differently).

Timings and sizes are printed; run with `-s` to see them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.ops import argv_check as A
from draftscope.ops import images as I

from containerlib import ROOT, base_image, build_image, docker
from support import INVOKE_PIPELINE

# The first build downloads and installs ~9.5 GB of wheels (~5–8 min here); the train image adds ~200 MB on top.
pytestmark = [pytest.mark.container, pytest.mark.timeout(2400)]

CUDA_ARCH = "9.0"
# regen (the tiny target's loopback server, in the vllm image) feeds the train image's stages, as in `make demo`.
STAGES = "regen,pretokenize,prepare,hsextract,train,convert"
TRAIN_STAGES = STAGES.split(",")[1:]


@pytest.fixture(scope="module")
def gpu_images(engine) -> dict[str, tuple[str, float]]:
    base_image()
    vllm = build_image("vllm", "--cuda-arch", CUDA_ARCH)
    train = build_image("train")
    return {"vllm": (I.image_reference("vllm"), vllm), "train": (I.image_reference("train"), train)}


def run_in(image: str, *args: str, mounts: tuple[str, ...] = (), timeout: float = 600) -> tuple[int, str]:
    """`docker run` by name, the exit code read back, the container removed (podman 4.3's `--rm` exits 0)."""
    name = f"draftscope-test-gpu-image-{uuid.uuid4().hex[:8]}"
    volumes = [f"--volume={m}" for m in mounts]
    try:
        done = docker(
            "run", "--name", name, "--init", "--network", "none", *volumes, image, *args, timeout=timeout
        )
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        return int(code) if code.lstrip("-").isdigit() else -1, done.stdout + done.stderr
    finally:
        docker("rm", "-f", name)


@pytest.mark.parametrize("name", ["vllm", "train"])
def test_the_image_says_what_it_holds(gpu_images, name):
    image, seconds = gpu_images[name]
    (facts,) = json.loads(docker("image", "inspect", image).stdout)
    labels, entry = facts["Config"]["Labels"], I.lock_entry(name, I.load_lock())
    print(f"\n{name}: built in {seconds:.0f} s (cached layers count as built), {facts['Size'] / 1e9:.2f} GB")
    assert labels["io.draftscope.image"] == name
    assert labels["io.draftscope.kit-wheel-sha256"] == entry["wheel_sha256"]
    assert (
        labels["io.draftscope.lock-sha256"]
        == entry["lock_sha256"]
        == I.sha256_file(ROOT / "images" / name / "requirements.lock")
    )
    assert labels["org.opencontainers.image.base.name"] == I.base_reference(entry)
    assert facts["Config"]["User"] == "10001:10001"
    if name == "vllm":
        assert labels["io.draftscope.cuda-arch"] == CUDA_ARCH
    code, out = run_in(image, "cat", "/usr/share/draftscope/sbom.cdx.json", timeout=120)
    assert code == 0, out[-2000:]
    sbom = json.loads(out[out.index("{") :])
    names = {c["name"]: c.get("version") for c in sbom["components"]}
    for package in ("vllm", "torch", "transformers", *(("speculators",) if name == "train" else ())):
        assert names[package] == entry["versions"][package], package


def test_train_shares_the_vllm_layers(gpu_images):
    layers = {
        name: json.loads(docker("image", "inspect", image).stdout)[0]["RootFS"]["Layers"]
        for name, (image, _) in gpu_images.items()
    }
    assert layers["train"][: len(layers["vllm"])] == layers["vllm"]  # stored once, pulled once
    added = len(layers["train"]) - len(layers["vllm"])
    print(f"\ntrain adds {added} layer(s) to vllm's {len(layers['vllm'])}")


@pytest.mark.parametrize("name", ["vllm", "train"])
def test_every_planned_argv_parses_in_the_image(gpu_images, name):
    image, _ = gpu_images[name]
    code, out = run_in(image, "python", "-m", "draftscope", "argv-check", "--image", name)
    print(out[-1500:])
    assert code == 0, out[-4000:]
    total = len(A.planned(name))
    assert f"{name}: {total} of {total} planned commands parse" in out


def _renamed(items: list[dict]) -> tuple[list[dict], set[str]]:
    """For one planned command of each kind: a copy per flag, that flag renamed (`--x` → `--x-renamed`; for vLLM's
    engine kwargs, each key); the unmutated commands stay in. Returns (commands, where-labels expected refused)."""
    out, expected, seen = list(items), set(), set()
    for item in items:
        kind = "vllm-engine-args" if "engine_kwargs" in item else A.classify(item["argv"])[0]
        if kind in seen:
            continue
        seen.add(kind)
        if "engine_kwargs" in item:
            for key in item["engine_kwargs"]:
                kwargs = {(f"{k}_renamed" if k == key else k): v for k, v in item["engine_kwargs"].items()}
                where = f"{item['where']} [{key} renamed]"
                out.append({"where": where, "engine_kwargs": kwargs})
                expected.add(where)
            continue
        argv = item["argv"]
        start = len(argv) - len(A.classify(argv)[1])  # flags of the parsed part only (not the launcher's)
        for i, arg in enumerate(argv):
            if i >= start and arg.startswith("--") and arg != "--":
                where = f"{item['where']} [{arg} renamed]"
                out.append({"where": where, "argv": [*argv[:i], f"{arg}-renamed", *argv[i + 1 :]]})
                expected.add(where)
    return out, expected


@pytest.mark.parametrize("name", ["vllm", "train"])
def test_a_renamed_flag_in_a_plan_fails_the_check(gpu_images, name, tmp_path):
    image, _ = gpu_images[name]
    commands, expected = _renamed(A.to_json(A.planned(name)))
    path = tmp_path / "commands.json"
    path.write_text(json.dumps(commands))
    path.chmod(0o644)
    code, out = run_in(
        image,
        "python",
        "-m",
        "draftscope",
        "argv-check",
        "--image",
        name,
        "--commands",
        "/tmp/commands.json",
        mounts=(f"{path}:/tmp/commands.json:ro",),
    )
    refused = {line.split("\t")[1] for line in out.splitlines() if line.startswith("REFUSED\t")}
    print(f"\n{name}: {len(expected)} renamed flags, {len(refused)} refused")
    assert code == 1, out[-3000:]
    assert refused == expected, sorted(expected ^ refused)[:10]


# --- the tiny pipeline's CPU stages inside the train image ---------------------------------------------------------


def _train_python() -> str:
    found = os.environ.get("DRAFTSCOPE_TRAIN_PYTHON") or str(ROOT / ".venv-train" / "bin" / "python")
    if not Path(found).is_file():
        pytest.fail(
            "the local run needs the speculators environment: make train-env (or DRAFTSCOPE_TRAIN_PYTHON)"
        )
    return found


def _pipeline(python: str, workdir: Path, runtime: str) -> subprocess.CompletedProcess:
    args = [
        "pipeline",
        "--preset",
        "tiny",
        "--runtime",
        runtime,
        "--stage",
        STAGES,
        "--workdir",
        str(workdir),
    ]
    return subprocess.run(
        [python, "-c", INVOKE_PIPELINE, *args], capture_output=True, text=True, timeout=1800, check=False
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tensors(path: Path) -> dict:
    from safetensors.numpy import load_file  # the host's safetensors (the kit's local extra)

    return load_file(str(path))


@pytest.fixture(scope="module")
def two_runs(gpu_images, tmp_path_factory) -> tuple[Path, Path]:
    import time

    root = tmp_path_factory.mktemp("in-image")
    local, image = root / "local", root / "image"
    started = time.monotonic()
    done = _pipeline(_train_python(), local, "local")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    middle = time.monotonic()
    done = _pipeline(sys.executable, image, "docker")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nlocal run {middle - started:.0f} s; in the train image {time.monotonic() - middle:.0f} s")
    return local, image


def test_the_stages_ran_in_the_train_image(two_runs):
    _, image = two_runs
    for stage in STAGES.split(","):
        record = read_json(image / "stages" / f"{stage}.json")
        assert record["status"] == "completed", stage
        expected = "train" if stage in TRAIN_STAGES else "vllm"
        assert record["image"]["reference"] == I.image_reference(expected), stage
    assert read_json(image / "stages" / "train.json")["versions"]["torch"].startswith("2.14.0")


def test_the_outputs_equal_a_local_runs(two_runs):
    local, image = two_runs
    # Greedy regeneration, one request at a time: the same rows. Same tokenizer code and files: byte for byte.
    assert _sha(image / "regen" / "rows.jsonl") == _sha(local / "regen" / "rows.jsonl")
    assert _sha(image / "pretokenize" / "rows.jsonl") == _sha(local / "pretokenize" / "rows.jsonl")
    # speculators' prepare (datasets 5.1.0 in both): the same rows, column by column.
    from datasets import load_from_disk  # the host's datasets, where the kit's dev extra has it

    ours, theirs = load_from_disk(str(image / "prepare")), load_from_disk(str(local / "prepare"))
    assert ours.column_names == theirs.column_names
    for column in ours.column_names:
        assert ours[column] == theirs[column], column
    # Hidden states: the Transformers forward pass in float32 under two torch builds.
    files = sorted(p.name for p in (local / "hidden_states").glob("hs_*.safetensors"))
    assert files and files == sorted(p.name for p in (image / "hidden_states").glob("hs_*.safetensors"))
    worst = 0.0
    for file in files:
        a, b = _tensors(local / "hidden_states" / file), _tensors(image / "hidden_states" / file)
        assert (a["token_ids"] == b["token_ids"]).all()
        worst = max(worst, float(abs(a["hidden_states"] - b["hidden_states"]).max()))
    print(f"\nhidden states: {len(files)} files, token ids identical, max |Δ| {worst:.3g}")
    assert worst < 1e-3
    # The converted draft's config is the same text; its weights went through training under both torch builds.
    assert read_json(image / "draft" / "config.json") == read_json(local / "draft" / "config.json")
    a, b = _tensors(local / "draft" / "model.safetensors"), _tensors(image / "draft" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(a[k].shape == b[k].shape for k in a)
    delta = max(float(abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)
    print(f"draft weights: {len(a)} tensors, max |Δ| {delta:.3g}")
