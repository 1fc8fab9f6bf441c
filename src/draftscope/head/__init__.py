"""The prefix-conditioned target head (HEAD.md): a certified coarse head with a dense fallback.

In greedy speculative decoding the target's head runs on k+1 rows per verification step, and only a prefix of them
matters. `draftscope.head` certifies each row's argmax from an INT8 coarse pass plus an exact refine of a few
candidates (`certify`), decides per step whether the dense head must run (`policy`: the prefix rule, and the
row-wise rule for comparison) and plugs into the kit's speculative loop (`runtime.CertifiedHead`). The output is
bit-identical to dense greedy verification for every admissible accumulation order; the shadow mode counts any
disagreement, which must stay zero.

Modules: `exact` (error constant, monotone roundings), `quant` (INT8 weights, error tables, coarse bounds),
`certify`, `policy`, `runtime` (the decode-loop head, device counters, capture for `head-study`).
"""
