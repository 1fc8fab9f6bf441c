"""The comparisons `analyze` shows: the `comparison.json` files `invoke compare` wrote for the runs analysed.

Found in the folders compare writes to by default and beside the runs — `comparisons/` under the current directory
and `comparisons/` beside each run directory — plus any file or folder given with `--comparison`. A comparison is
shown when both its runs are among those analysed (same run id and the same manifest SHA-256, so a comparison of
an earlier run of the same name is not mistaken for this one's). A given file that is not a valid comparison is an
error; a found one is skipped with a note.

Speed is read one way throughout: the latency ratio compare measures (median over prompts of candidate / base
request seconds, prefill included), shown as a speedup = base / candidate = 1 / ratio, with its interval inverted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.analysis import verdict
from draftscope.analysis.load import Run
from draftscope.core import schema as schemas
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json

SPEED_MEASURE = (
    "speedup = base / candidate request latency (median over prompts of the paired ratio of request seconds, "
    "prefill included; invoke compare)"
)


@dataclass(frozen=True)
class Shown:
    """One comparison as the report shows it."""

    path: Path
    doc: Mapping[str, Any]

    @property
    def title(self) -> str:
        return f"{self.doc['candidate']['run_id']} vs {self.doc['base']['run_id']}"

    @property
    def speedup(self) -> float | None:
        ratio = self.doc.get("median_ratio")
        return 1.0 / ratio if ratio else None

    @property
    def interval(self) -> tuple[float, float] | None:
        ci = self.doc.get("ci")
        if not ci or not ci.get("low") or not ci.get("high"):
            return None
        return (1.0 / ci["high"], 1.0 / ci["low"])

    def cells(self) -> dict[str, str]:
        """The comparison's figures as text: the same values go to the terminal, report.md and report.html."""
        doc = self.doc
        interval = self.interval
        noise = doc.get("noise_band")
        band = noise.get("half_width") if noise else None
        speedup = self.speedup
        return {
            "pair": self.title,
            "sentence": verdict.sentence(doc),
            "speedup": f"{speedup:.3f}×" if speedup else "—",
            "interval": f"[{interval[0]:.3f}×, {interval[1]:.3f}×] ({doc['confidence']:.0%})"
            if interval
            else "— (fewer than two prompts)",
            "verdict": doc["verdict"]["decision"].replace("_", " "),
            "reason": doc["verdict"]["reason"],
            "threshold": f"{doc['threshold']:.2%}",
            "noise_band": f"±{band:.2%}"
            if band is not None
            else "— (the base run has fewer than two repeats)",
            "noise_wider": "yes" if band is not None and band > doc["threshold"] else "no",
            "latency_ratio": f"{doc['median_ratio']:.4f}" if doc.get("median_ratio") else "—",
            "prompts": str(doc["prompts"].get("joined", "—")),
            "file": self.path.name,
            "notes": "; ".join(doc.get("notes") or ()) or "—",
        }


def _candidates(runs: Sequence[Run], extra: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(files given with --comparison, files found in the default places), each path once."""
    given: list[Path] = []
    for raw in extra:
        path = Path(raw)
        if path.is_dir():
            given.extend(sorted(path.glob("*.json")))
        elif path.is_file():
            given.append(path)
        else:
            raise UserError(
                "no such comparison file or folder",
                field="--comparison",
                value=str(raw),
                fix="give a comparison.json that `invoke compare` wrote, or a folder of them",
            )
    folders = [Path("comparisons"), *(run.path.parent / "comparisons" for run in runs)]
    found: list[Path] = []
    for folder in dict.fromkeys(f.resolve() for f in folders if f.is_dir()):
        found.extend(sorted(folder.glob("*.json")))
    seen = {p.resolve() for p in given}
    return given, [p for p in found if p.resolve() not in seen]


def find_comparisons(runs: Sequence[Run], extra: Iterable[str | Path] = ()) -> tuple[list[Shown], list[str]]:
    """The comparisons of the analysed runs, and notes on found files that were skipped."""
    given, found = _candidates(runs, extra)
    known = {(run.run_id, run.describe()["manifest_sha256"]) for run in runs}
    shown: list[Shown] = []
    notes: list[str] = []
    for path in [*given, *found]:
        explicit = path in given
        try:
            doc = read_json(path, expect=dict)
        except UserError:
            if explicit:
                raise
            continue  # a JSON file of another kind beside the runs
        if doc.get("kind") not in ("comparison", "reproduction"):
            if explicit:
                raise UserError(
                    "not a comparison file (its kind is not 'comparison')",
                    field="--comparison",
                    value=str(path),
                    fix="give a file `invoke compare` wrote",
                )
            continue
        problems = schemas.problems(doc, "comparison")
        if problems:
            if explicit:
                schemas.check(doc, "comparison", str(path))
            notes.append(
                f"{path.name}: not a valid comparison file, skipped ({problems[0].render(str(path))})"
            )
            continue
        pair = [(doc[side]["run_id"], doc[side]["manifest_sha256"]) for side in ("base", "candidate")]
        if all(p in known for p in pair):
            shown.append(Shown(path, doc))
        elif explicit:
            notes.append(f"{path.name}: compares runs that are not analysed here; not shown")
    return shown, notes
