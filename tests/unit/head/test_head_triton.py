"""The head's Triton kernels against the PyTorch reference (on CPU, under TRITON_INTERPRET=1) and compiled for sm_80
and sm_90a without a GPU.

Triton chooses between its interpreter and the real JIT when a kernel is defined, once per process; so each mode
runs in a subprocess of its own, on inputs made here, and the comparisons run here against the references and a
float64 ground truth. What "match" means, kernel by kernel:

- coarse: the logits differ from the reference's only by the fp32 summation order, so both lie within
  E_fp = γ_{D+G+1}·Σ_g ‖h_g‖₁·q_linf of the exact coarse sum and `|c − c_ref| ≤ 2·E_fp` (the tolerance the bound
  terms already cover); U must be ≥ the exact dot product everywhere, and U − c and A must be ≥ the reference's
  (the kernel sums them in fp32 and pads) and within 1e-4 relative of them;
- top-K: the same values as torch.topk and, ties going to the lowest index, the same indices as a stable sort;
- refine: f within 2·γ_D·A of the reference's f, and A ≥ the reference's float64 sum (an upper bound).

In the interpreter the bf16 tensor-core dot runs as an fp32 dot (Triton 3.9's interpreter multiplies bf16 dot
operands as raw bits); the bf16 MMA path is covered by the compile test, and by the GPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from draftscope.core.errors import MissingDependency, UserError  # noqa: E402
from draftscope.head import triton_kernels as tk  # noqa: E402
from draftscope.head.certify import certify, dense_tokens, refine  # noqa: E402
from draftscope.head.exact import gamma  # noqa: E402
from draftscope.head.quant import QuantizedHead, coarse, group_norms  # noqa: E402

INTERPRET_CHILD = """
import sys, torch
from draftscope.head.quant import QuantizedHead
from draftscope.head import triton_kernels as tk
cases = torch.load(sys.argv[1])
out = {"coarse": [], "topk": [], "refine": []}
for case in cases["coarse"]:
    head = QuantizedHead.build(case["weight"], case["group_size"])
    b = tk.coarse_triton(head, case["hidden"])
    out["coarse"].append({"logits": b.logits, "upper": b.upper, "a_bound": b.a_bound})
for case in cases["topk"]:
    out["topk"].append(tk.topk_triton(case["upper"], case["k"], block=case["block"]))
for case in cases["refine"]:
    out["refine"].append(tk.refine_triton(case["weight"], case["hidden"], case["ids"]))
torch.save(out, sys.argv[2])
"""

COMPILE_CHILD = """
import json, sys
from draftscope.head import triton_kernels as tk
names = sys.argv[1].split(",")
report = {}
for arch in (80, 90):
    report[arch] = {
        name: {"target": r["target"], "ptx": len(r["ptx"]), "mma": "mma" in r["ptx"],
               "entry": f".entry {name.removesuffix('_fp32')}_kernel(" in r["ptx"],
               "cubin_magic": r["cubin"][:4].hex(), "cubin": len(r["cubin"])}
        for name, r in tk.compile_kernels(arch, names).items()
    }
print(json.dumps(report))
"""

COMPILED = [
    "coarse",
    "topk_keys",
    "topk_merge",
    "refine",
]  # coarse_fp32 too in compile_kernels(), not here (time)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, **extra}


# --- inputs -------------------------------------------------------------------------------------------------


def _head_weight(vocab: int, hidden: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, hidden, generator=gen) * 0.05).to(torch.bfloat16)


def _coarse_cases() -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    nan_rows = torch.randn(3, 200, generator=gen).to(torch.bfloat16)
    nan_rows[2, 7] = float("nan")
    return [
        # per-row scales, bf16 rows, V not a multiple of the 64-token block, D = 200 not of the 128-column step
        {"id": "per-row", "weight": _head_weight(300, 200, 2), "group_size": None, "hidden": nan_rows},
        # 5 groups of 40 columns (a group smaller than the step: masked), 5 rows
        {
            "id": "groups",
            "weight": _head_weight(300, 200, 3),
            "group_size": 40,
            "hidden": torch.randn(5, 200, generator=gen).to(torch.bfloat16),
        },
        # fp32 activations take the IEEE fp32 dot
        {
            "id": "fp32-rows",
            "weight": _head_weight(130, 64, 4),
            "group_size": 32,
            "hidden": torch.randn(2, 64, generator=gen),
        },
    ]


def _topk_cases() -> list[dict]:
    gen = torch.Generator().manual_seed(5)
    special = torch.randn(5, 300, generator=gen, dtype=torch.float64)
    special[1] = torch.round(special[1] * 2) / 2  # many exact ties, at the boundary too
    special[2] = 1.0 + torch.randperm(300, generator=gen).double() * 1e-13  # all one fp32 value: the fallback
    special[3, :8] = 9.0 + torch.arange(8).double() * 1e-12  # 8 fp32 ties at the top, within the KP − k spare
    special[4, [3, 30]] = float("nan")
    special[4, 10] = float("inf")
    special[4, 20] = float("-inf")
    return [
        # 128 keys in blocks of 32, KP 16: three merge levels
        {
            "id": "merge-levels",
            "upper": torch.randn(1, 128, generator=gen, dtype=torch.float64),
            "k": 5,
            "block": 32,
        },
        {"id": "ties-nan-fp32", "upper": special, "k": 5, "block": 512},
        # the decode path's K + 2 = 66 (KP 128), fp32 input
        {"id": "k66-fp32", "upper": torch.randn(1, 300, generator=gen), "k": 66, "block": tk.TOPK_BLOCK},
    ]


def _refine_cases() -> list[dict]:
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 300, (3, 11), generator=gen)
    ids[:, -1] = ids[:, 0]  # the bonus row's repeated candidate
    return [
        {
            "id": "bf16",
            "weight": _head_weight(300, 200, 7),
            "hidden": torch.randn(3, 200, generator=gen).to(torch.bfloat16),
            "ids": ids,
        },
        {
            "id": "fp32-rows",
            "weight": _head_weight(300, 300, 8),
            "hidden": torch.randn(3, 300, generator=gen),
            "ids": ids,
        },
    ]


# Slow: every test but two starts Triton in a subprocess (its interpreter, or its compiler for two archs).
pytestmark = pytest.mark.slow

CASES = {"coarse": _coarse_cases(), "topk": _topk_cases(), "refine": _refine_cases()}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Every kernel's outputs on CASES, computed in a subprocess under TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("triton_interpret")
    torch.save(CASES, folder / "in.pt")
    proc = subprocess.run(
        [sys.executable, "-c", INTERPRET_CHILD, str(folder / "in.pt"), str(folder / "out.pt")],
        env=_env(TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(folder / "out.pt")


def _stats(diff: torch.Tensor, scale: torch.Tensor) -> str:
    ratio = (diff / scale).nan_to_num(0)
    return f"max |Δ| {diff.max():.3e}, mean |Δ| {diff.mean():.3e}, max |Δ|/tolerance {ratio.max():.3f}"


# --- without triton, and on CPU without the interpreter ------------------------------------------------------


def test_module_imports_without_triton_and_names_the_install():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "from draftscope.head import triton_kernels as tk\n"
        "from draftscope.core.errors import MissingDependency\n"
        "for call in (tk.kernels, lambda: tk.compile_kernels(80)):\n"
        "    try:\n        call()\n    except MissingDependency as e:\n        print('missing:', e.render())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("'triton' is not installed" in ln and "pip install" in ln for ln in lines)
    assert issubclass(MissingDependency, UserError)


def test_cpu_tensors_without_the_interpreter_are_a_user_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    head = QuantizedHead.build(_head_weight(70, 32, 0))
    with pytest.raises(UserError, match="TRITON_INTERPRET=1"):
        tk.coarse_triton(head, torch.zeros(1, 32))
    with pytest.raises(UserError, match="TRITON_INTERPRET=1"):
        tk.refine_triton(head.weight, torch.zeros(1, 32), torch.zeros(1, 3, dtype=torch.long))


# --- coarse -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(CASES["coarse"])), ids=[c["id"] for c in CASES["coarse"]])
def test_coarse_matches_reference_and_bounds_hold(interpreted, index):
    case = CASES["coarse"][index]
    got = interpreted["coarse"][index]
    head = QuantizedHead.build(case["weight"], case["group_size"])
    hidden = case["hidden"]
    ref = coarse(head, hidden)
    finite = torch.isfinite(hidden).all(dim=1)
    l1, _ = group_norms(hidden, head.group_size)
    e_fp = gamma(head.hidden + head.groups + 1) * (l1 @ head.q_linf.double().T)

    diff = (got["logits"].double() - ref.logits.double()).abs()[finite]
    assert bool((diff <= 2 * e_fp[finite]).all()), "logits: " + _stats(diff, 2 * e_fp[finite])

    exact = hidden.double() @ head.weight.double().T
    assert bool((got["upper"][finite] >= exact[finite]).all()), "U below the exact dot product"
    err_got = got["upper"] - got["logits"].double()
    err_ref = ref.upper - ref.logits.double()
    rel = (err_got / err_ref)[finite]
    assert bool((rel >= 1 - 1e-12).all()) and bool((rel <= 1 + 1e-4).all()), (
        f"U − c vs reference: {rel.aminmax()}"
    )
    rel_a = (got["a_bound"] / ref.a_bound)[finite]
    assert bool((rel_a >= 1).all()) and bool((rel_a <= 1 + 1e-4).all()), f"A vs reference: {rel_a.aminmax()}"
    assert bool(torch.isnan(got["upper"][~finite]).all()), "a row with a NaN must give NaN bounds"


def test_coarse_bounds_certify_like_the_reference(interpreted):
    case = CASES["coarse"][0]
    head = QuantizedHead.build(case["weight"], case["group_size"])
    got = interpreted["coarse"][0]
    from draftscope.head.quant import Coarse

    bounds = Coarse(got["logits"], got["upper"], got["a_bound"])
    hidden = case["hidden"]
    draft = torch.tensor([5, -1, 7])
    with_kernel = certify(head, hidden, draft, k=8, bounds=bounds)
    reference = certify(head, hidden, draft, k=8)
    assert torch.equal(with_kernel.certified, reference.certified)
    assert torch.equal(with_kernel.tokens[reference.certified], reference.tokens[reference.certified])
    dense = dense_tokens(head.weight, hidden)
    assert bool(with_kernel.certified.any()), "nothing certified: the check would be vacuous"
    assert torch.equal(with_kernel.tokens[with_kernel.certified], dense[with_kernel.certified])
    assert not bool(with_kernel.certified[2])  # the NaN row


# --- top-K --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(CASES["topk"])), ids=[c["id"] for c in CASES["topk"]])
def test_topk_same_as_torch_ties_to_lowest_index(interpreted, index):
    case = CASES["topk"][index]
    values, ids = interpreted["topk"][index]
    upper, k = case["upper"], case["k"]
    ref_values = torch.topk(upper, k, dim=1).values
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0, equal_nan=True)
    stable = torch.sort(upper, dim=1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(ids, stable), f"indices differ from the stable order:\n{ids}\n{stable}"
    top_sets = torch.topk(upper, k, dim=1).indices
    for row in range(upper.shape[0]):
        kth = ref_values[row, -1]
        if not bool(torch.isnan(kth)) and int((upper[row] == kth).sum()) == 1:  # no tie at the boundary
            assert set(ids[row].tolist()) == set(top_sets[row].tolist())


# --- refine -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(CASES["refine"])), ids=[c["id"] for c in CASES["refine"]])
def test_refine_matches_reference_and_a_is_an_upper_bound(interpreted, index):
    case = CASES["refine"][index]
    f, a = interpreted["refine"][index]
    weight, hidden, ids = case["weight"], case["hidden"], case["ids"]
    f_ref, a_ref = refine(weight, hidden, ids)
    d = hidden.shape[1]
    w = weight[ids].double()
    a_exact = torch.einsum("nd,nmd->nm", hidden.double().abs(), w.abs())
    diff = (f - f_ref).abs()
    assert bool((diff <= 2 * gamma(d) * a_exact).all()), "f: " + _stats(diff, 2 * gamma(d) * a_exact)
    assert bool((a >= a_ref).all()), f"A below the reference by up to {(a_ref - a).max():.3e}"
    assert bool((a >= a_exact).all())
    assert bool((a <= a_ref * (1 + 2 * gamma(d + 1))).all()), f"A too loose: {(a / a_ref).max():.6f}"


# --- compiled for sm_80 and sm_90a, no GPU -------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("triton")
    cache = tmp_path_factory.mktemp("triton_cache")  # a fresh cache: the compiler really runs
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_CHILD, ",".join(COMPILED)],
        env=_env(TRITON_CACHE_DIR=str(cache), TRITON_DEFAULT_FP_FUSION="1"),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize(("arch", "sm"), [(80, "sm_80"), (90, "sm_90a")])
def test_kernels_compile_for_sm80_and_sm90a(compiled, arch, sm):
    report = compiled[arch]
    assert sorted(report) == sorted(COMPILED)
    for name, r in report.items():
        assert r["target"] == sm, f"{name}: PTX targets {r['target']}"
        assert r["entry"] and r["ptx"] > 1000, f"{name}: no kernel entry in the PTX"
        assert r["cubin_magic"] == "7f454c46" and r["cubin"] > 1000, f"{name}: ptxas produced no ELF cubin"
    assert report["coarse"]["mma"], "the bf16 coarse dot should lower to tensor-core MMA instructions"
