"""The prefix-conditioned target head (docs/review/head.md): a certified coarse head with a dense fallback.

In greedy speculative decoding the target's head runs on k+1 rows per verification step, and only a prefix of them
matters. `draftscope.head` certifies each row's argmax from an INT8 coarse pass plus an exact refine of a few
candidates (`certify`), decides per step whether the dense head must run (`policy`: the prefix rule, and the
row-wise rule for comparison) and plugs into the kit's speculative loop (`runtime.CertifiedHead`). The output is
bit-identical to dense greedy verification for every admissible accumulation order; the shadow mode counts any
disagreement, which must stay zero.

Modules: `exact` (error constant, monotone roundings), `quant` (INT8 weights, error tables, coarse bounds),
`certify`, `policy`, `runtime` (the decode-loop head, device counters, capture for `head-study`), `capture` and
`study` (`invoke head-study`), `triton_kernels` (coarse GEMV with fused bounds, top-K, refine) and `bench`
(`invoke head-bench`), `graph` and `graph_kernels` (the device-side branch: a CUDA conditional node, and the
predicated dense kernel as the ablation), `vllm_plugin`, `serving` and `vllm_switch` (the vLLM integration).
"""
