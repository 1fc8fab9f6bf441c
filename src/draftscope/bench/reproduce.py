"""`invoke reproduce RUN --output NEW`: re-run a recorded run from its directory alone, then compare.

What is reused: the frozen config from `manifest.config`, the prompts copied into `RUN/inputs/` (their hash checked
against the manifest), the same runtime, and — for container runtimes — the same images: an image whose ID or
digest differs from the recorded one is refused unless `--allow-image-drift`, and the drift is then recorded.
The comparison (kind `reproduction`) demands identical greedy token ids; timing is reported as ratios.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from draftscope.analysis.compare import compare_runs, write_comparison
from draftscope.analysis.load import Run, load_run
from draftscope.analysis.output import refuse_existing
from draftscope.bench import supervisor
from draftscope.bench.plan import plan_benchmark
from draftscope.core import schema as schemas
from draftscope.core.config import build
from draftscope.core.errors import UserError
from draftscope.core.jsonio import sha256_file
from draftscope.core.presets import ExperimentConfig
from draftscope.core.untrusted import check_file
from draftscope.runtime import get_runtime

LOCAL_NOTE = "image checks skipped: the local runtime runs in this Python environment, not in an image"
IDENTITY = ("reference", "id", "repo_digests")


def frozen_config(run: Run) -> ExperimentConfig:
    """The run's frozen config, re-validated, with its prompts pointing at the run's own hash-checked copy."""
    if run.manifest["kind"] not in ("benchmark", "reproduce"):
        raise UserError(
            f"a '{run.manifest['kind']}' run cannot be reproduced here",
            source=str(run.path),
            fix="reproduce a benchmark run",
        )
    return config_of(run.path, run.manifest)


def config_of(path: Path, manifest: Mapping[str, Any]) -> ExperimentConfig:
    """A benchmark run's frozen config from its manifest, prompts read from the run's own hash-checked copy."""
    path = Path(path)
    config = dict(manifest["config"])
    schemas.check(config, "experiment", f"{path / 'manifest.json'} $.config")
    entries = [i for i in manifest["inputs"] if i["name"] == "prompts"]
    if not entries:
        raise UserError("the manifest records no prompt file", source=str(path), field="inputs")
    entry = entries[0]
    name = Path(entry["path"]).name
    if name in ("", ".", ".."):
        raise UserError(
            "names no prompt file",
            source=str(path / "manifest.json"),
            field="$.inputs[].path",
            value=entry["path"],
        )
    check_file(path, f"inputs/{name}")  # the run's own copy: no pipe, folder or link out of the run
    copy = path / "inputs" / name
    if not copy.is_file():
        raise UserError(
            "the run has no copy of its prompt file",
            source=str(copy),
            fix="reproduce from a complete run directory (inputs/ included)",
        )
    if sha256_file(copy) != entry["sha256"]:
        raise UserError(
            "the prompt copy no longer has the hash the manifest recorded",
            source=str(copy),
            fix="restore the run directory from its original",
        )
    # Relative when it can be: the new manifest should not carry more of this machine's paths than needed.
    rel = os.path.relpath(copy.absolute())
    config["prompts"] = rel if not rel.startswith("..") else str(copy.absolute())
    return build(ExperimentConfig, config)


def image_checks(run: Run, config: ExperimentConfig, output: Path, *, allow_drift: bool) -> dict[str, Any]:
    """Compare the recorded image of each step with what the engine has now."""
    runtime = get_runtime(config.runtime)
    if not runtime.uses_images:
        return {"image_check": "skipped_local_runtime", "images": [], "notes": [LOCAL_NOTE]}
    steps = {s.name: s for s in plan_benchmark(config, str(output)).steps}
    images, drift = [], []
    for recorded in run.manifest.get("images") or []:
        step = steps.get(recorded["step"])
        if step is None:
            continue
        current = runtime.image_facts(step.image)
        old = {k: recorded.get(k) for k in IDENTITY}
        new = {k: current.get(k) for k in IDENTITY}
        same = _same_image(old, new)
        images.append({"step": recorded["step"], "recorded": old, "current": new, "same": same})
        if not same:
            drift.append(f"step {recorded['step']}: recorded {_ident(old)}, now {_ident(new)}")
    if drift and not allow_drift:
        raise UserError(
            "an image differs from the one the run recorded (" + "; ".join(drift) + ")",
            field="images",
            fix="rebuild or pull the recorded image, or pass --allow-image-drift to reproduce anyway (recorded)",
        )
    notes = [f"image drift allowed: {d}" for d in drift]
    return {"image_check": "drift_allowed" if drift else "matched", "images": images, "notes": notes}


def _same_image(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Same reference and same ID. The ID is the digest of the image's config, which names every layer's
    uncompressed digest: it is the image's content, the same on every engine that built or pulled it. Repository
    digests are not compared: they digest a manifest as one registry or one engine compressed and listed it (a
    re-push of the same image can get another; podman shows, for every name an image has, digests of its own), so
    they are recorded for the reader and identify nothing here."""
    return old.get("reference") == new.get("reference") and old.get("id") == new.get("id")


def _ident(facts: Mapping[str, Any]) -> str:
    digest = (facts.get("repo_digests") or [None])[0]
    return f"{facts.get('reference')} id {facts.get('id')}" + (f" digest {digest}" if digest else "")


def reproduce(
    source: Path,
    output: Path,
    *,
    allow_image_drift: bool = False,
    comparison: Path | None = None,
    threshold: float = 0.01,
    resamples: int = 10_000,
    seed: int = 0,
    argv: list[str],
    say: Callable[[str], None] = print,
) -> tuple[dict[str, Any], Path]:
    """Re-run `source` into `output`, compare, write the comparison; returns (document, its path)."""
    original = load_run(source)
    if original.status != "completed":
        raise UserError(
            f"the run is '{original.status}', not completed",
            source=str(source),
            fix="reproduce a completed run",
        )
    config = frozen_config(original)
    if os.path.lexists(output):  # the run directory would refuse it too, but only after the image checks
        raise UserError(
            "the output directory already exists; runs are never overwritten or merged",
            field="--output",
            value=str(output),
            fix="choose a new --output path",
        )
    checks = image_checks(original, config, Path(output), allow_drift=allow_image_drift)
    for note in checks["notes"]:
        say(note)
    target = (
        Path(comparison)
        if comparison
        else Path("comparisons") / f"{original.run_id}__{Path(output).name}.json"
    )
    for path in (target, target.with_suffix(".png")):
        refuse_existing(path, "--comparison")  # before minutes of running, not after
    notes = [f"reproduction of {original.run_id}", *checks["notes"]]
    manifest = supervisor.run_benchmark(
        config, Path(output), argv=argv, say=say, kind="reproduce", notes=notes
    )
    if manifest["status"] != "completed":
        raise UserError(
            f"the reproduction ended '{manifest['status']}': {manifest.get('reason')}",
            source=str(output),
            fix="its records are kept there; fix the cause and reproduce into a new --output",
        )
    new = load_run(output)
    doc = compare_runs(original, new, threshold=threshold, resamples=resamples, seed=seed, argv=argv)
    # Same frozen config: tokens must agree whatever the label comparison says.
    doc["tokens"]["expected_identical"] = True
    doc["tokens"]["basis"] = "a reproduction of the same frozen config: greedy token ids must be identical"
    doc["kind"] = "reproduction"
    doc["reproduction"] = {
        "source_run": str(source),
        "runtime": config.runtime,
        "image_check": checks["image_check"],
        "images": checks["images"],
        "tokens_identical": doc["tokens"]["first_mismatch"] is None,
    }
    doc["notes"] = [*checks["notes"], *doc["notes"]]
    path = write_comparison(doc, target, flag="--comparison")
    return doc, path
