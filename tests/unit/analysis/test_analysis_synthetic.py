"""Synthetic run directories for the analysis tests, made through the kit's own RunDir (so they are schema-valid),
and checks that they are. The other analysis unit tests import `make_run` from here."""

from __future__ import annotations

import json
import random
from pathlib import Path

from draftscope.bench.backends.common import prompt_sha256
from draftscope.core.config import to_dict
from draftscope.core.presets import load_experiment
from draftscope.core.rundir import InputFile, RunDir
from draftscope.core.summary import summarize
from draftscope.core.validate import validate_run

from support import ROOT

PROMPTS = ROOT / "examples" / "prompts.json"


def prompt_list(path: Path = PROMPTS) -> list[dict]:
    return json.loads(Path(path).read_text())["prompts"]


def make_run(
    path: Path,
    *,
    repeats: int = 2,
    speed: float = 1.0,
    noise: float = 0.03,
    seed: int = 0,
    draft: bool = False,
    status: str = "completed",
    skip: tuple[str, ...] = (),
    tokens: int = 12,
    change_token: tuple[str, int] | None = None,
    prompts_file: Path = PROMPTS,
    image: dict | None = None,
) -> Path:
    """A run of the tiny CPU config with made-up timings: latency = base(prompt) × speed × lognormal noise.

    `status` other than completed leaves a partial run (the last prompt missing, summary marked partial).
    `change_token=(prompt_id, position)` alters that generated token in every repeat.
    `image` (reference, id, repo_digests) makes it a docker-runtime run that recorded that image.
    """
    rng = random.Random(seed)
    options = {"repeats": repeats, "max_new_tokens": tokens, "prompts": str(prompts_file)}
    if draft:
        options["draft"] = "tiny"
    if image:
        options["runtime"] = "docker"
    config = to_dict(load_experiment("tiny-cpu", options))
    # Unset vLLM options are left out, as in a preset file (the experiment schema has no null for them).
    config["vllm"] = {k: v for k, v in config["vllm"].items() if v is not None}
    run = RunDir.create(
        path,
        kind="benchmark",
        config=config,
        argv=["test"],
        inputs=[InputFile("prompts", Path(prompts_file))],
    )
    run.update(
        images=[
            {"step": "benchmark", "runtime": "docker", **image}
            if image
            else {"step": "benchmark", "runtime": "local", "reference": None, "id": None, "repo_digests": []}
        ],
        hardware={
            "machine": "x86_64",
            "processor": None,
            "cpu_count": 2,
            "device": "cpu",
            "torch_threads": 2,
        },
    )
    run.set_status("running")
    prompts = [p for p in prompt_list(prompts_file) if p["id"] not in skip]
    if status != "completed":
        prompts = prompts[:-1]
    records = []
    with run.records() as out:
        for repeat in range(repeats):
            for i, p in enumerate(prompts):
                ids = [(7 * i + k) % 500 for k in range(tokens)]
                if change_token and change_token[0] == p["id"]:
                    ids[change_token[1]] = 999
                seconds = (0.05 + 0.004 * i) * speed * rng.lognormvariate(0, noise)
                stamps = [seconds * (k + 1) / tokens for k in range(tokens)]
                record = {
                    "schema_version": 1,
                    "prompt_id": p["id"],
                    "prompt_sha256": prompt_sha256(p["messages"]),
                    "repeat": repeat,
                    "prompt_tokens": 20 + i,
                    "generated_token_ids": ids,
                    "generated_tokens": tokens,
                    "request_seconds": seconds,
                    "request_tok_s": tokens / seconds,
                    "decode_tok_s": (tokens - 1) / (stamps[-1] - stamps[0]),
                    "token_timestamps": stamps,
                    "timing_source": "synthetic",
                    "finish_reason": "length",
                    "acceptance_lengths": [3, 4, 2, 3] if draft else None,
                    "draft_tokens_per_step": 4 if draft else None,
                }
                run.append_record(out, record)
                records.append(record)
    all_ids = [p["id"] for p in prompt_list(prompts_file)]  # as the supervisor does: every prompt of the copy
    run.write_summary(summarize(path.name, records, all_ids, partial=status != "completed"))
    if status == "completed":
        run.complete()
    else:
        run.set_status(status, "time limit of 5 s reached")
    return path


def test_synthetic_runs_are_valid_run_directories(tmp_path):
    for name, kwargs in {"a": {}, "s": {"draft": True}, "p": {"status": "timed_out"}}.items():
        report = validate_run(make_run(tmp_path / name, **kwargs))
        assert report.ok, report.first_failure()
