"""Contract: `invoke export --format vllm-bench` writes only names that `vllm bench serve --save-result` writes.

The names are read from the pinned release's vllm/benchmarks/serve.py (parsed with `ast`, never imported): the
keys of the dict literals assigned to `result`, the string subscripts assigned on `result` and `result_json`, and
the f-string names `process_one_metric` builds (`mean_{metric}_ms`, `p{percentile}_{metric}_ms`) with the metric
names it is called with. Every name the kit writes, for a plain and a speculative run, must be one of them; every
literal name must be written by the kit or listed, with its reason, in `vllm_bench.LEFT_OUT`.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from releases import pinned_release
from test_analysis_synthetic import make_run

from draftscope.analysis import vllm_bench
from draftscope.analysis.load import load_run
from draftscope.bench.backends.vllm import backend as V

pytestmark = pytest.mark.contract

MODULE = "vllm.benchmarks.serve"
RESULT_NAMES = ("result", "result_json")


def _is_result(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in RESULT_NAMES


def upstream_names(tree: ast.Module) -> tuple[set[str], list[re.Pattern[str]]]:
    """(literal names, f-string name patterns) of the result JSON in serve.py."""
    literal: set[str] = set()
    templates: list[ast.JoinedStr] = []
    metrics: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if _is_result(target) and isinstance(node.value, ast.Dict):
                    literal |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                if isinstance(target, ast.Subscript) and _is_result(target.value):
                    key = target.slice
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        literal.add(key.value)
                    elif isinstance(key, ast.JoinedStr):
                        templates.append(key)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "process_one_metric"
            and node.args
        ):
            first = node.args[0]
            if isinstance(first, ast.Constant):
                metrics.add(first.value)
    placeholder = {
        "metric_attribute_name": "|".join(map(re.escape, sorted(metrics))),
        "p_word": r"\d+(?:\.\d+)?",
    }
    patterns = []
    for template in templates:
        parts = []
        for piece in template.values:
            if isinstance(piece, ast.Constant):
                parts.append(re.escape(piece.value))
            else:
                parts.append(f"(?:{placeholder[ast.unparse(piece.value)]})")
        patterns.append(re.compile("".join(parts)))
    return literal, patterns


@pytest.fixture(scope="module")
def names():
    release = pinned_release("vllm", vllm_bench.VLLM_VERSION, platform="manylinux_2_28_x86_64")
    assert release.metadata("Version") == vllm_bench.VLLM_VERSION
    return upstream_names(release.tree(MODULE))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    plain = vllm_bench.result(load_run(make_run(root / "plain", repeats=1)))
    speculative = vllm_bench.result(load_run(make_run(root / "spec", draft=True, repeats=1)))
    return plain, speculative


def test_the_exporter_follows_the_kit_s_vllm_pin():
    assert vllm_bench.VLLM_VERSION == V.PINNED_VERSION


def test_the_parse_finds_the_result_names_it_should(names):
    literal, patterns = names
    # A parse that found nothing would let every name through: names the source is known to write must be there.
    assert {"date", "model_id", "duration", "ttfts", "itls", "spec_decode_acceptance_length"} <= literal
    assert any(p.fullmatch("p99_ttft_ms") for p in patterns)
    assert any(p.fullmatch("std_e2el_ms") for p in patterns)
    assert not any(p.fullmatch("p99_nonsense_ms") for p in patterns)


def test_every_name_the_kit_writes_is_one_vllm_writes(names, written):
    literal, patterns = names
    for doc in written:
        unknown = [k for k in doc if k not in literal and not any(p.fullmatch(k) for p in patterns)]
        assert not unknown, f"names vLLM {vllm_bench.VLLM_VERSION} does not write: {unknown}"
    plain, speculative = written
    assert "spec_decode_acceptance_length" in speculative and "spec_decode_num_drafts" not in plain
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert {f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms", f"p99_{metric}_ms"} <= set(
            plain
        )
    json.dumps(speculative, allow_nan=False)  # JSON as vLLM's json.dump writes it


def test_every_literal_name_is_written_or_left_out_with_a_reason(names, written):
    literal, _ = names
    kit = set(written[0]) | set(written[1])
    assert not set(vllm_bench.LEFT_OUT) & kit
    assert not set(vllm_bench.LEFT_OUT) - literal, "a left-out name that vLLM does not write"
    unaccounted = sorted(literal - kit - set(vllm_bench.LEFT_OUT))
    assert not unaccounted, (
        f"vLLM writes these; map them in vllm_bench.result or list them in LEFT_OUT: {unaccounted}"
    )
