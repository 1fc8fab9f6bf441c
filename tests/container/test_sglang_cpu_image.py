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
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from draftscope.ops import images as I

from containerlib import ROOT, base_image, build_image, docker
from support import run_invoke, unavailable

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
    assert found["torch"].split("+")[0] == entry["versions"]["torch"]  # PyPI's CUDA build: 2.13.0+cu130
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


HOST_AMX = "amx_tile" in Path("/proc/cpuinfo").read_text()
BENCH_TOKENS = 48
DRAFT_STEPS = 4
# A preset for a local target (model_path): the check model's shape (sglang_cpu.CHECK_GEOMETRY), head_dim 64.
PRESET = """\
schema_version: 1
name: sglang-cpu-check
display_name: a random Qwen3 SGLang's CPU kernel takes
source: hub
hub: {repo: test/sglang-cpu-check, revision: 0123456789abcdef0123456789abcdef01234567}
architecture: {kind: dense, model_type: qwen3, num_layers: 3, hidden_size: 256, vocab_size: 4096,
               max_position_embeddings: 512}
dflash: {block_size: 4, decay_gamma: 4, target_layer_ids: [1, 2], num_draft_layers: 1, mask_token_id: 3}
training: {seq_length: 128, max_anchors: 16, nproc_per_node: 1}
serving: {tp_size: 1}
status: {tested: false}
"""


def _greedy_reference(image: str, model: Path, prompts: Path, tokens: int) -> dict[str, list[int]]:
    """The target's own greedy token ids for each prompt, from SGLang's CPU engine without a draft, requested as the
    bench stage requests them (`sglang-cpu-check --model --prompts`)."""
    name = f"draftscope-test-sglang-cpu-{uuid.uuid4().hex[:8]}"
    try:
        done = docker(
            "run", "--name", name, "--network", "none", "-v", f"{prompts}:/tmp/prompts.json:ro",
            "-v", f"{model}:/tmp/model:ro", image, "python", "-m", "draftscope", "sglang-cpu-check",
            "--work", "/tmp/check", "--model", "/tmp/model", "--prompts", "/tmp/prompts.json",
            "--max-new-tokens", str(tokens), timeout=900,
        )  # fmt: skip
        exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        assert exit_code == "0", done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout[done.stdout.index("{") :])["greedy"]
    finally:
        docker("rm", "-f", name)


needs_amx = pytest.mark.skipif(not HOST_AMX, reason="SGLang's CPU engine serves a draft with AMX only")


@pytest.fixture(scope="module")
def served(sglang_cpu_image, tmp_path_factory) -> dict:
    """serve and bench through `invoke pipeline` on the real engine, once: a target and a draft model SGLang's CPU
    kernel takes (a seeded random Qwen3 with head_dim 64; the draft a copy of it). Then the target's plain greedy
    tokens on the same engine, requested as bench requests them."""
    from draftscope.pipeline import sglang_cpu

    if not HOST_AMX:
        pytest.skip("SGLang's CPU engine serves a draft with AMX only")
    image, _ = sglang_cpu_image
    tmp_path = tmp_path_factory.mktemp("served")
    target = sglang_cpu.write_check_model(tmp_path / "target", seed=0)
    draft = tmp_path / "draft"
    shutil.copytree(target, draft)
    presets = tmp_path / "presets" / "models"
    presets.mkdir(parents=True)
    (presets / "sglang-cpu-check.yaml").write_text(PRESET)
    workdir = tmp_path / "w"
    began = time.monotonic()
    done = run_invoke(
        "pipeline", "--preset", "sglang-cpu-check", "--stage", "serve,bench", "--runtime", "docker",
        "--workdir", str(workdir), "--opts", "device=cpu", "--opts", f"model_path={target}",
        "--opts", "serve.draft=model", "--opts", f"serve.draft_model={draft}",
        "--opts", f"serve.draft_steps={DRAFT_STEPS}", "--opts", "serve.context_length=512",
        "--opts", f"bench.max_new_tokens={BENCH_TOKENS}",
        env={"DRAFTSCOPE_PRESETS": str(tmp_path / "presets")}, timeout=1800,
    )  # fmt: skip
    print(f"\npipeline serve,bench on sglang-cpu: {time.monotonic() - began:.0f} s\n{done.stdout[-2500:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (workdir / "bench" / "requests.jsonl").read_text().splitlines()]
    reference = _greedy_reference(image, target, ROOT / "examples" / "prompts.json", BENCH_TOKENS)
    return {"workdir": workdir, "target": target, "rows": rows, "reference": reference}


@needs_amx
def test_pipeline_serve_and_bench_run_on_sglang_cpu(served):
    workdir, rows = served["workdir"], served["rows"]
    bench = json.loads((workdir / "bench" / "bench.json").read_text())
    assert bench["algorithm"] == "STANDALONE" and bench["draft"] == "model"
    assert bench["draft_tokens_per_step"] == DRAFT_STEPS
    # Acceptance from SGLang's own per-request counters: every request verified; the rate is SGLang's accepted
    # drafts over its proposed ones, proposed = verify steps × the drafted tokens a step (its definition).
    assert all(r["spec_verify_ct"] for r in rows)
    assert all(r["spec_num_proposed_drafts"] == r["spec_verify_ct"] * DRAFT_STEPS for r in rows)
    correct, proposed = (
        sum(r[k] for r in rows) for k in ("spec_num_correct_drafts", "spec_num_proposed_drafts")
    )
    assert bench["accept_rate"] == pytest.approx(correct / proposed)
    assert 0.0 <= bench["accept_rate"] <= 1.0 and bench["mean_accept_length"] >= 1.0
    assert bench["acceptance"]["accepted_drafts"] <= sum(r["completion_tokens"] for r in rows)
    assert bench["instances"][0]["metrics"], "no sglang:* sample scraped from /metrics"
    # The record: the image's SGLang and the kernel sources' hash it was built from.
    entry = I.lock_entry("sglang-cpu", I.load_lock())
    for stage in ("serve", "bench"):
        record = json.loads((workdir / "stages" / f"{stage}.json").read_text())
        assert record["status"] == "completed", record
        assert record["image"]["name"] == "sglang-cpu"
        assert record["versions"]["sglang"] == "0.5.18"
        assert any(entry["kernel_sources"]["sha256"] in note for note in record["notes"]), record["notes"]
    print(f"accept rate {bench['accept_rate']:.3f}, mean accept length {bench['mean_accept_length']:.3f}")


# How far below the reference's best logit an engine's token may be at a step: a bf16 engine and a float32 reference
# break near-ties differently (the check model's top-two gap is ~1.4 at the median, so a near-tie is rare).
TIE_TOLERANCE = 0.5


def _deficits(target: Path, rows: dict[str, list[int]]) -> dict[str, list[float]]:
    """Teacher-forced through Transformers (float32, this environment) on the same weights, chat template and
    prompts: for each generated token, how far its logit lies below the best one at that step (0 = the argmax)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = {p["id"]: p for p in json.loads((ROOT / "examples" / "prompts.json").read_text())["prompts"]}
    found = {}
    for pid, tokens in rows.items():
        ids = tokenizer.apply_chat_template(prompts[pid]["messages"], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids + tokens])).logits[0].float()
        steps = logits[len(ids) - 1 : len(ids) - 1 + len(tokens)]
        found[pid] = (steps.max(dim=-1).values - steps[torch.arange(len(tokens)), tokens]).tolist()
    return found


@needs_amx
def test_plain_sglang_cpu_greedy_is_the_argmax_of_an_independent_implementation(served):
    """SGLang's plain greedy tokens are, step by step, the argmax of Transformers on the same weights (teacher-forced,
    so one near-tie does not derail the rest), up to TIE_TOLERANCE."""
    deficits = _deficits(served["target"], served["reference"])
    worst = max(max(d) for d in deficits.values())
    print(
        f"\nplain SGLang vs Transformers float32: worst logit deficit {worst:.3f} over {len(deficits)} prompts"
    )
    assert worst <= TIE_TOLERANCE, {pid: max(d) for pid, d in deficits.items()}


@needs_amx
@pytest.mark.xfail(
    strict=True,
    reason="measured here (2026-12): SGLang 0.5.18's CPU engine with a STANDALONE draft emits tokens the target would "
    "not choose from the first verify step on (teacher-forced through Transformers: logit deficits up to 16-25 on "
    "most steps, where plain SGLang's are within 0.5); a copy of the target as the draft accepts ~12%; for head_dim "
    "64 with hidden 192 or 256, fp32 or bf16 weights. Strict: it fails the day speculation keeps the greedy output",
)
def test_speculation_keeps_the_targets_greedy_tokens(served):
    reference, rows = served["reference"], served["rows"]
    assert sorted(reference) == sorted(r["prompt_id"] for r in rows)
    deficits = _deficits(served["target"], {r["prompt_id"]: r["token_ids"] for r in rows})
    print(
        f"\nspeculative SGLang vs Transformers float32: worst logit deficit per prompt {deficits and {p: round(max(d), 2) for p, d in deficits.items()}}"
    )
    differing = [r["prompt_id"] for r in rows if r["token_ids"] != reference[r["prompt_id"]]]
    assert not differing, f"{len(differing)} of {len(rows)} requests differ from plain greedy: {differing}"
    assert max(max(d) for d in deficits.values()) <= TIE_TOLERANCE


def test_the_tiny_target_is_refused_naming_its_head_size(sglang_cpu_image, tmp_path):
    """The kit's tiny target (head_dim 48) is one sgl_kernel refuses: said before any stage, with the fix."""
    done = run_invoke(
        "pipeline", "--preset", "tiny", "--stage", "serve,bench", "--runtime", "docker", "--workdir",
        str(tmp_path / "w"), "--opts", "serve.draft=model", timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    expected = "the target's is 48" if HOST_AMX else "has no amx_tile"
    assert expected in done.stderr
    assert not (tmp_path / "w").exists()
