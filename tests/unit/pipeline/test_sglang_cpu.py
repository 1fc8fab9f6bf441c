"""SGLang's CPU engine as the kit starts it (draftscope.pipeline.sglang_cpu): the argv, the AMX refusal read from
/proc/cpuinfo, and the /metrics reading of the sglang-cpu image's self-check. The engine itself runs in
tests/container/test_sglang_cpu_image.py (make test-sglang-cpu)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftscope.core.errors import UserError
from draftscope.pipeline import sglang_cpu as S
from draftscope.pipeline.sglang import argv_value

XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx512f avx512_bf16\n"


def test_the_plain_server_is_the_cpu_engine_on_loopback_with_metrics():
    argv = S.launch_argv("/models/target", 31000, seed=7)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert argv_value(argv, "--device") == "cpu"
    assert argv_value(argv, "--host") == "127.0.0.1" and argv_value(argv, "--port") == "31000"
    assert argv_value(argv, "--random-seed") == "7"
    assert {"--enable-metrics", "--disable-overlap-schedule", "--disable-radix-cache"} <= set(argv)
    assert argv_value(argv, "--speculative-algorithm") is None
    assert S.CPU_ENV == {"SGLANG_USE_CPU_ENGINE": "1"}


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_a_draft_model_is_a_standalone_chain(steps):
    argv = S.launch_argv("/t", 1, draft="/d", draft_steps=steps, context_length=512)
    assert argv_value(argv, "--speculative-algorithm") == "STANDALONE"
    assert argv_value(argv, "--speculative-draft-model-path") == "/d"
    assert argv_value(argv, "--speculative-eagle-topk") == "1"
    # A chain: K drafted tokens and the target's own, verified in one step.
    assert int(argv_value(argv, "--speculative-num-draft-tokens")) == steps + 1
    assert argv_value(argv, "--speculative-num-steps") == str(steps)
    assert argv_value(argv, "--context-length") == "512"


def test_a_draft_that_drafts_nothing_is_refused():
    with pytest.raises(UserError, match="at least one token"):
        S.launch_argv("/t", 1, draft="/d", draft_steps=0)


def test_amx_refusal_reads_the_cpu_flags():
    assert S.amx_refusal(XEON) is None
    refusal = S.amx_refusal(EPYC)
    assert "AMD EPYC 9B14 has no amx_tile or amx_bf16" in refusal
    assert "torch_native" in refusal
    assert "no amx_tile or amx_bf16" in S.amx_refusal("")  # nothing readable: not assumed to have AMX


@given(
    st.lists(
        st.sampled_from(["fpu", "avx512f", "amx_tile", "amx_bf16", "amx_int8", "amx_tile_x"]), max_size=6
    )
)
def test_amx_refusal_agrees_with_a_flag_set(flags):
    text = "model name\t: X\nflags\t\t: " + " ".join(flags) + "\n"
    assert (S.amx_refusal(text) is None) == ({"amx_tile", "amx_bf16"} <= set(flags))


def test_metric_families_keep_sglang_samples_only():
    page = (
        "# HELP sglang:spec_accept_length The average acceptance length\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="default"} 2.5\n'
        "# HELP python_gc_objects_collected_total Objects collected\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 10.0\n'
    )
    assert S.metric_families(page) == {'sglang:spec_accept_length{model_name="default"}': 2.5}
    with pytest.raises(UserError, match="not a Prometheus text page"):
        S.metric_families("sglang:x{ 1\n")


def test_the_engine_note_names_sglang_the_kernel_and_its_sources(tmp_path, monkeypatch):
    record = tmp_path / "sources.sha256"
    monkeypatch.setattr(S, "KERNEL_SOURCES_RECORD", record)
    assert "kernel sources sha256 unrecorded" in S.engine_note()  # outside the image
    record.write_text("ab" * 32 + "\n")
    note = S.engine_note()
    assert note.startswith("engine measured: sglang ") and "(CPU engine)" in note
    assert note.endswith(f"kernel sources sha256 {'ab' * 32}")


def test_only_servers_on_the_cpu_engine_are_noted():
    from draftscope.pipeline.base import Command

    cpu = Command("server-0", ("python",), env={"SGLANG_USE_CPU_ENGINE": "1"}, port=1)
    gpu = Command("server-0", ("python",), env={"CUDA_VISIBLE_DEVICES": "0"}, port=1)
    assert S.on_cpu_engine([cpu]) and not S.on_cpu_engine([gpu]) and not S.on_cpu_engine([])
