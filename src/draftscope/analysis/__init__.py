"""Analysis: run directories → tables, paired comparisons, reports, reproductions and research evidence.

Host side only: numpy, scipy, matplotlib (Agg) and jinja2, and for exports pyarrow and MLflow (the `export`
extra, imported only when used) — never torch. Every module reads run directories as
they are on disk (partial runs included, and labelled so) and writes new files exclusively.

    load.py       run directories → `Run` objects and per-prompt tables
    stats.py      paired ratios, seeded bootstrap confidence intervals, the admission rule
    compare.py    BASE vs CANDIDATE → comparison.json (+ figure)
    figures.py    the PNG figures (matplotlib, Agg)
    report.py     the terminal table and the report folder (report.md, self-contained report.html)
    reproduce.py  re-run a run from its manifest, then compare
    evidence.py   research/: SHA256SUMS, schema checks, adding runs
    export.py     records → one row each: CSV, JSON lines, Parquet (docs/use/exports.md)
    timing.py     TTFT, TPOT and inter-token latencies from the token timestamps, as vLLM defines them
    vllm_bench.py a run as `vllm bench serve --save-result` JSON
    mlflow_log.py a run logged to an MLflow tracking store
"""
