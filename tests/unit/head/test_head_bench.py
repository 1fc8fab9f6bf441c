"""`invoke head-bench` at a tiny shape: the chunked INT8 builder equals `QuantizedHead.build`, the CPU coarse paths
and bounds are sound, and the report's ratios are computed from the measured times."""

from __future__ import annotations

import json
import statistics

import pytest

torch = pytest.importorskip("torch")

from draftscope.core import schema  # noqa: E402
from draftscope.core.errors import UserError  # noqa: E402
from draftscope.head import bench  # noqa: E402
from draftscope.head.cpu_coarse import padded, probe  # noqa: E402
from draftscope.head.exact import gamma  # noqa: E402
from draftscope.head.quant import QuantizedHead, coarse_logits, group_norms  # noqa: E402

FIELDS = ("weight", "q", "scales", "err_l2", "err_linf", "w_linf", "q_linf")


def _weight(vocab: int, hidden: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(vocab, hidden, generator=gen) * 0.05).to(torch.bfloat16)
    w[3] = 0  # an all-zero row: scale 1, q 0
    w[7, : hidden // 4] = 0  # an all-zero group when grouped
    return w


@pytest.mark.parametrize("group_size", [None, 16])
def test_build_chunked_is_identical_to_build(group_size):
    weight = _weight(50, 64)
    expected = QuantizedHead.build(weight, group_size)
    got = bench.build_chunked(weight, group_size, chunk_rows=16)  # 50 = 3·16 + 2: a short last chunk
    assert got.group_size == expected.group_size
    for name in FIELDS:
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs"
    assert torch.equal(bench.head_rows(got, 20).q, QuantizedHead.build(weight[:20], group_size).q)


def test_build_chunked_rejects_what_build_rejects():
    with pytest.raises(ValueError, match="does not divide"):
        bench.build_chunked(_weight(10, 64), 24)
    bad = _weight(10, 64)
    bad[9, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        bench.build_chunked(bad, None, chunk_rows=4)


@pytest.mark.parametrize("impl", sorted(bench.CPU_COARSE))
def test_cpu_coarse_paths_are_covered_by_their_bounds(impl):
    head = QuantizedHead.build(_weight(500, 128, seed=1))
    hidden = torch.randn(5, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    c = bench.CPU_COARSE[impl](head, hidden, torch.ones(head.vocab, dtype=torch.bfloat16))
    ref = coarse_logits(head, hidden).double()
    l1, _ = group_norms(hidden, head.group_size)
    e_fp = gamma(head.hidden + head.groups + 1) * (l1 @ head.q_linf.double().T)
    tolerance = 2 * e_fp + c.double().abs() * bench.BF16_OUT_REL  # fp32 order + the bf16 output rounding
    diff = (c.double() - ref).abs()
    assert bool((diff <= tolerance).all()), f"max |Δ|/tolerance {(diff / tolerance).max():.3f}"
    upper, a_out = bench.bounds_torch(head, hidden, c, bench.BF16_OUT_REL)
    exact = hidden.double() @ head.weight.double().T
    assert bool((upper >= exact).all()), f"U below the exact dot product by {(exact - upper).max():.3e}"
    a_exact = hidden.double().abs() @ head.weight.double().abs().T
    assert bool((a_out[:, None] >= a_exact).all())


def test_refine_fp32_is_an_upper_bound_of_the_reference():
    from draftscope.head.certify import refine

    weight = _weight(300, 96, seed=3)
    hidden = torch.randn(4, 96, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ids = torch.randint(0, 300, (4, 9), generator=torch.Generator().manual_seed(5))
    f, a = bench.refine_fp32(weight, hidden, ids)
    f_ref, a_ref = refine(weight, hidden, ids)
    assert bool((a >= a_ref).all())
    assert bool(((f - f_ref).abs() <= 2 * gamma(96) * a_ref).all())


def test_summary_ratios_follow_from_the_times():
    head = QuantizedHead.build(_weight(100, 32))
    timing = {
        "impl": {"coarse": "int8pack"},
        "median_ms": {"dense": 10.0, "coarse": 2.0, "bounds": 0.5, "topk": 0.25, "refine": 0.25, "path": 4.0},
        "min_ms": {},
        "samples_ms": {},
        "candidates_ms": {},
    }
    r = bench.summarize(100, 2, 32, head, timing, [0.0, 0.5])
    assert r["ratio"] == pytest.approx(0.4)
    assert r["expected_ratio"] == {"0": pytest.approx(0.4), "0.5": pytest.approx(0.9)}
    assert r["bytes"]["dense"] == 2 * 100 * 32
    assert r["bytes"]["certified"] == head.bytes_int8 + 2 * 2 * (bench.K + 3) * 32
    assert r["floor_ms"]["dense"] == pytest.approx(10.0)  # the dense head defines the bandwidth
    assert r["floor_ms"]["certified"] == pytest.approx(10.0 * r["floor_ratio"])


def test_main_small_run_prints_one_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    from draftscope.cli.render import console

    report = bench.main(
        device="cpu",
        vocab="300,500",
        hidden=64,
        rows="1,3",
        fallback="0,0.5",
        repeats=3,
        output=out,
        show=console().print,
    )
    printed = capsys.readouterr().out
    assert printed.count("head-bench on cpu") == 1
    for header in ("path/dense", "+0.5·dense", "GB dense→cert.", "bytes ratio", "coarse impl"):
        assert header in printed
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report))
    bench.validate_report(data)
    assert schema.problems(data, "head-bench") == []  # schemas/head-bench.schema.json, as research/ checks it
    assert data["schema_version"] == bench.SCHEMA_VERSION and data["kind"] == "head-bench"
    # Self-describing: the kit, the command, the options as parsed, the machine.
    assert set(data["kit"]) == {"version", "git_commit", "git_dirty"}
    assert isinstance(data["command"], list)
    assert data["config"] == {
        "device": "cpu",
        "vocab": [300, 500],
        "hidden": 64,
        "rows": [1, 3],
        "fallback": [0.0, 0.5],
        "repeats": 3,
        "k": bench.K,
        "group_size": 64,
        "seed": 0,
    }
    device = data["device"]
    assert device["type"] == "cpu" and device["name"] == device["cpu_model"] and device["gpu"] is None
    assert device["torch"] == torch.__version__ and device["threads"] == torch.get_num_threads()
    assert set(device["cpu_features"]) <= set(bench.CPU_FEATURES)
    assert set(device["load_average"]) == {"start", "end"}
    assert any("load average" in note for note in data["notes"])
    assert [(r["vocab"], r["rows"]) for r in data["results"]] == [(300, 1), (300, 3), (500, 1), (500, 3)]
    for r in data["results"]:
        samples = r["samples_ms"]
        assert set(samples) == {"dense", "coarse", "bounds", "topk", "refine", "path"}
        assert all(len(v) == 3 and all(t > 0 for t in v) for v in samples.values())
        med = {k: statistics.median(v) for k, v in samples.items()}
        assert r["median_ms"] == pytest.approx(med)
        assert r["min_ms"] == pytest.approx({k: min(v) for k, v in samples.items()})
        assert r["ratio"] == pytest.approx(med["path"] / med["dense"])
        assert r["expected_ratio"]["0.5"] == pytest.approx((med["path"] + 0.5 * med["dense"]) / med["dense"])
        if probe(
            padded(64)
        ):  # the INT8 × INT8 pass where torch's int8 GEMM is exact here, else the faster other
            assert r["impl"]["coarse"] == bench.INT8X8 and r["candidates_ms"] == {}
        else:
            assert r["impl"]["coarse"] in bench.CPU_COARSE
            assert set(r["candidates_ms"]) == set(bench.CPU_COARSE)
        assert f"{r['ratio']:.2f}×" in printed


def test_the_report_schema_lives_in_schemas_and_a_broken_report_is_a_bug():
    assert not hasattr(bench, "REPORT_SCHEMA")
    assert schema.get_schema("head-bench")["$id"] == schema.BASE_URI + "head-bench.schema.json"
    report = bench.main(device="cpu", vocab="300", hidden=64, rows="1", repeats=1, quiet=True)
    del report["device"]["torch"]
    with pytest.raises(RuntimeError, match=r"head-bench report: \$\.device: 'torch' is required"):
        bench.validate_report(report)


def test_gpu_facts_come_from_torch_and_the_driver(monkeypatch):
    from types import SimpleNamespace

    from draftscope.core import hardware as doctor

    props = SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=141 * 2**30, multi_processor_count=132
    )
    fake = SimpleNamespace(
        cuda=SimpleNamespace(get_device_properties=lambda i: props, device_count=lambda: 1)
    )
    gpu = doctor.Gpu(
        0, "NVIDIA H200", None, (9, 0), 144384, 144000, "570.1", cuda_version="12.8", clocks_sm_max_mhz=1980
    )
    monkeypatch.setattr(doctor, "gpus_from_nvml", lambda: [gpu])
    assert bench._gpu_info(fake) == {
        "name": "NVIDIA H200",
        "capability": [9, 0],
        "memory_mib": 141 * 1024,
        "multiprocessors": 132,
        "count": 1,
        "driver": "570.1",
        "driver_cuda": "12.8",
        "clocks_sm_max_mhz": 1980,
    }
    monkeypatch.setattr(doctor, "gpus_from_nvml", lambda: None)
    monkeypatch.setattr(doctor, "gpus_from_nvidia_smi", lambda: None)
    facts = bench._gpu_info(fake)
    assert facts["driver"] is None and facts["name"] == "NVIDIA H200"  # torch's facts stand alone


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rows": "1,0"}, "rows"),
        ({"vocab": "abc"}, "vocab"),
        ({"fallback": "1.5"}, "fallback"),
        ({"device": "tpu"}, "device"),
        ({"repeats": 0}, "repeats"),
    ],
)
def test_bad_input_is_a_one_line_user_error(kwargs, field):
    with pytest.raises(UserError) as err:
        bench.main(**{"vocab": "300", "hidden": 64, "rows": "1", "repeats": 1, "quiet": True, **kwargs})
    assert err.value.field == field and "\n" not in err.value.render()


def test_cuda_without_a_gpu_is_a_user_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UserError, match="CUDA is not available"):
        bench.main(device="cuda", vocab="300", hidden=64, rows="1", repeats=1, quiet=True)
