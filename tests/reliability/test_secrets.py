"""Planted secrets: credentials in the environment (HF tokens and variables named like credentials) while a tiny
benchmark, its analysis report and a tiny pipeline (regen + pretokenize) run; then every byte of every output —
manifests, records, logs, stage records, reports, and what the commands printed — is searched for the planted
values. Credentials are passed to steps by name only, so none may appear anywhere.

The benchmark also carries a description full of shell metacharacters: accepted as data, it must reach no shell.
"""

from __future__ import annotations

import secrets

import pytest

from faultlib import free_port, search
from support import run_invoke, tiny_benchmark

pytest.importorskip("transformers")

pytestmark = pytest.mark.reliability


def planted() -> dict[str, str]:
    tag = secrets.token_hex(12)
    return {
        "HF_TOKEN": f"hf_planted{tag}",
        "HUGGING_FACE_HUB_TOKEN": f"hf_plantedhub{tag}",
        "MY_API_KEY": f"sk-planted-{tag}",
        "OPENAI_API_KEY": f"sk-proj-planted{tag}",
        "AWS_SECRET_ACCESS_KEY": f"plantedAWS{tag}",
        "GITHUB_TOKEN": f"ghp_planted{tag}",
        "DATABASE_PASSWORD": f"planted-pw-{tag}",
    }


def test_planted_secrets_appear_in_no_output(tmp_path, figures):
    env = planted()
    canary = tmp_path / "CANARY"
    shellish = f"$(touch {canary}); `touch {canary}` | touch {canary} && touch {canary} > {canary}"
    run, report, workdir = tmp_path / "run", tmp_path / "report", tmp_path / "w"
    printed = []

    bench = run_invoke(
        *tiny_benchmark("local", "--repeats", "1", "--max-new-tokens", "8", "--warmups", "0"),
        "--output",
        str(run),
        "--opts",
        f"description={shellish}",
        env=env,
        timeout=600,
    )
    printed.append(bench.stdout + bench.stderr)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    analyzed = run_invoke("analyze", str(run), "--report", str(report), env=env, timeout=300)
    printed.append(analyzed.stdout + analyzed.stderr)
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    pipeline = run_invoke(
        "pipeline",
        "--preset",
        "tiny",
        "--runtime",
        "local",
        "--stage",
        "regen,pretokenize",
        "--workdir",
        str(workdir),
        "--opts",
        f"regen.base_port={free_port()}",
        "--opts",
        "data.max_rows=8",
        "--opts",
        "regen.max_tokens=8",
        env=env,
        timeout=600,
    )
    printed.append(pipeline.stdout + pipeline.stderr)
    assert pipeline.returncode == 0, pipeline.stdout[-2000:] + pipeline.stderr[-2000:]
    (tmp_path / "printed.txt").write_text("\n".join(printed))

    hits, files = [], 0
    for folder in (run, report, workdir):
        found, n = search(folder, env.values())
        hits += found
        files += n
    found, n = search(tmp_path, env.values())  # the above again, plus what the commands printed
    hits += [h for h in found if "printed.txt" in h]
    files += 1
    figures.secrets(len(hits), files)
    assert files > 10 and (workdir / "stages" / "pretokenize.json").is_file()
    assert hits == [], hits
    assert not canary.exists(), "a shell ran the description"
