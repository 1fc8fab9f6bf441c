"""The standard prompt sets: where each comes from (repository, path, pinned commit, licence, the original file's
SHA-256), which the kit ships converted (`--dataset NAME`), and the deterministic subset a run may take.

A shipped set is a prompt file under `draftscope/assets/datasets/` (in the wheel too), made by `invoke
datasets.import` from the upstream file at the pinned commit; its converted SHA-256 is pinned here and checked
before a run uses it. An upstream file imported by hand is recognised by its SHA-256, and its provenance recorded.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import sha256_file

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "datasets"


@dataclass(frozen=True)
class Upstream:
    """One upstream question file at a pinned commit."""

    format: str
    repository: str
    path: str
    commit: str
    licence: str
    sha256: str  # of the file at `commit`
    not_shipped: str | None = None  # why the kit does not ship it converted (None: it does, SHIPPED)


UPSTREAM: dict[str, Upstream] = {
    "mt-bench": Upstream(
        format="mt-bench",
        repository="https://github.com/lm-sys/FastChat",
        path="fastchat/llm_judge/data/mt_bench/question.jsonl",
        commit="0e6d3e4beaab66f4d3f93db72541a4abab8af28d",
        licence="Apache-2.0",
        sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    ),
    "spec-bench": Upstream(
        format="spec-bench",
        repository="https://github.com/hemingkx/Spec-Bench",
        path="data/spec_bench/question.jsonl",
        commit="fd2c1cd7d2201ef71db4c5f4e455008f017967bf",
        licence="Apache-2.0 (repository); the questions quote other datasets under their own terms",
        sha256="4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
        not_shipped="its translation, summarization, qa and rag questions quote other datasets (news articles among "
        "them) whose own terms the repository's Apache-2.0 licence does not grant; import it yourself",
    ),
    "speed-bench": Upstream(
        format="speed-bench",
        repository="https://huggingface.co/datasets/nvidia/SPEED-Bench",
        path="qualitative (test split), resolved by specdec_bench's prepare_data.py",
        commit="",  # not pinned: the data was not fetched for this kit
        licence="NVIDIA Evaluation Dataset License",
        sha256="",
        not_shipped="its licence is an evaluation licence, not one to redistribute under, and many of its turns are "
        "placeholders for text fetched from other datasets (prepare_data.py); import the prepared file yourself",
    ),
}

# The converted files the kit ships: set name → (file under ASSETS, its SHA-256, prompts).
SHIPPED: dict[str, tuple[str, str, int]] = {
    "mt-bench": ("mt-bench.json", "c648e534aff187d37225557c5f07e9a1fabd796afa0d409390e171cdfab8363f", 80),
}


@dataclass(frozen=True)
class Dataset:
    name: str
    path: Path
    sha256: str
    prompts: int
    upstream: Upstream


def names() -> list[str]:
    return list(SHIPPED)


def shipped(name: str) -> Dataset:
    """A shipped set by name, its file checked against the pinned SHA-256; an unknown name lists the known ones."""
    if name not in SHIPPED:
        why = UPSTREAM[name].not_shipped if name in UPSTREAM else None
        hint = [] if why else difflib.get_close_matches(name, list(SHIPPED), n=1)
        raise UserError(
            f"no shipped prompt set named '{name}'" + (f" (not shipped: {why})" if why else ""),
            field="--dataset",
            value=name,
            fix=(f"did you mean '{hint[0]}'? " if hint else "")
            + f"choose one of: {', '.join(SHIPPED)} (invoke datasets), or import a file with invoke datasets.import "
            "and give it to --prompts",
        )
    file, digest, count = SHIPPED[name]
    path = ASSETS / file
    if not path.is_file() or sha256_file(path) != digest:
        raise UserError(
            "the shipped prompt file is missing or differs from the SHA-256 the kit pins",
            source=str(path),
            field="--dataset",
            value=name,
            fix="reinstall the kit (or restore the file from its checkout)",
        )
    return Dataset(name, path, digest, count, UPSTREAM[name])


def provenance(sha256: str) -> dict[str, Any]:
    """Repository, path, commit and licence of an upstream file known by its SHA-256 ({} for any other file)."""
    for up in UPSTREAM.values():
        if up.sha256 and up.sha256 == sha256:
            return {"repository": up.repository, "path": up.path, "commit": up.commit, "licence": up.licence}
    return {}


def selected(prompts: list[Any], limit: int | None) -> list[Any]:
    """The prompts a run uses: the first `limit` in file order (all when None). Deterministic: the same file and
    limit give the same prompts, and the run's config records the limit (`max_prompts`)."""
    return prompts if limit is None else prompts[:limit]


def check_unique_ids(ids: Sequence[str], source: str) -> None:
    """Refuse a prompt file whose ids repeat (records and comparisons are keyed by id), naming the first few."""
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)  # linear: a prompt file may be large
    if duplicates:
        more = f" (and {len(duplicates) - 5} more)" if len(duplicates) > 5 else ""
        raise UserError(
            f"duplicate prompt ids {duplicates[:5]}{more}",
            source=source,
            field="prompts[].id",
            fix="give every prompt a unique id",
        )
