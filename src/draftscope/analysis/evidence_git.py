"""research/ through git history: evidence a reviewer can trust.

`invoke evidence.verify` (analysis/evidence.py) adds these checks to its hashes and schemas, for every study with
evidence (evidence/NAME/ beside studies/NAME.yaml):

* order — every commit that touched the protocol studies/NAME.yaml is a strict ancestor of the commit that added
  each result file under evidence/NAME/ (`git log --name-status`, no rename following). A protocol added in the
  same commit as a result, or changed after it, fails, naming the result and both commits. A result not committed
  yet is not judged on order (it will be committed after the protocol, or the protocol is not committed: that fails).
* clean — every run manifest and head-bench report records the kit's commit (`$.kit.git_commit`) and a clean
  tree (`$.kit.git_dirty` false; a head-study study.json records no provenance and is judged by order alone); that commit must be in this repository and already contain every version
  of the protocol: the result was measured from a committed tree that held the frozen protocol.

Evidence made before these rules is listed in research/SUPERSEDED.yaml (path, date, reason) instead of being
rewritten: it is still hash- and schema-checked, each of its history problems is reported as `superseded` (never
as verified evidence), and it does not fail verify. Without git history (an sdist, an export, a shallow clone)
the order cannot be checked: verify says so in a `warn` finding and fails only with `--strict`.

`invoke evidence.add` refuses a checkout with uncommitted changes (`git status --porcelain`, untracked files
included; the new evidence files and SHA256SUMS that earlier adds wrote are allowed, to be committed together) and
a run or report whose `$.kit` says the tree was dirty or does not say (`check_addable`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from datetime import date
from pathlib import Path

from draftscope.core.config import load_yaml
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json

SUPERSEDED = "SUPERSEDED.yaml"
GIT = "git history"


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


class History:
    """The commits that touched and added each file of research/ (paths relative to research/)."""

    def __init__(self, root: Path, top: Path) -> None:
        self.top = top
        prefix = root.resolve().relative_to(top.resolve()).as_posix()
        self.prefix = "" if prefix == "." else prefix + "/"
        self.touched: dict[str, list[str]] = {}  # newest first
        self.added: dict[str, str] = {}  # the earliest commit that added the file
        log = _git(top, "log", "--format=%x00%H", "--name-status", "--no-renames", "--", self.prefix or ".")
        commit = ""
        for line in (log or "").splitlines():
            if line.startswith("\0"):
                commit = line[1:].strip()
                continue
            status, _, path = line.partition("\t")
            if not path.startswith(self.prefix):
                continue
            rel = path[len(self.prefix) :]
            self.touched.setdefault(rel, []).append(commit)
            if status.startswith("A"):
                self.added[rel] = commit  # the log is newest first: the last one seen is the earliest
        self._ancestor: dict[tuple[str, str], bool] = {}

    def is_ancestor(self, a: str, b: str) -> bool:
        """`a` is `b` or an ancestor of it."""
        key = (a, b)
        if key not in self._ancestor:
            self._ancestor[key] = _git(self.top, "merge-base", "--is-ancestor", a, b) is not None
        return self._ancestor[key]

    def has_commit(self, commit: str) -> bool:
        return _git(self.top, "cat-file", "-e", f"{commit}^{{commit}}") is not None


def history(root: Path) -> History | str:
    """The history of research/, or why there is none to read."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return "research/ is not in a git checkout (an sdist, an export or a copy)"
    if (_git(root, "rev-parse", "--is-shallow-repository") or "").strip() == "true":
        return "the checkout is a shallow clone: its history is cut off"
    return History(root, Path(top.strip()))


def dirty_paths(root: Path) -> list[str] | None:
    """The checkout's uncommitted changes (untracked files included, ignored ones not), except what `add` itself
    writes: new files under research/evidence/ and the changed SHA256SUMS, so that several results can be added
    before one commit. None outside a checkout."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    prefix = root.resolve().relative_to(Path(top.strip()).resolve()).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--no-renames")
    changed = []
    for line in (status or "").splitlines():
        code, path = line[:2], line[3:]
        added = code in ("??", "A ") and path.startswith(f"{prefix}evidence/")
        if line.strip() and not added and not (code.strip() == "M" and path == f"{prefix}SHA256SUMS"):
            changed.append(path)
    return changed


def check_clean_checkout(root: Path) -> None:
    changed = dirty_paths(root)
    if changed:
        raise UserError(
            f"the checkout has uncommitted changes ({len(changed)} path(s), first: {changed[0]})",
            source=str(root),
            fix="commit them (the protocol first, in an earlier commit), then measure from the clean tree and add",
        )


def check_addable(doc: dict, source: str) -> None:
    """A run manifest or a measurement report must say it was made from a clean, committed tree (a head-study
    study.json records no provenance, `$.kit`: it is judged by the order of commits alone)."""
    if "kit" not in doc and "fallback_prefix" in doc:
        return
    kit = doc.get("kit") if isinstance(doc.get("kit"), dict) else {}
    if kit.get("git_dirty") is not False or not kit.get("git_commit"):
        said = "a dirty" if kit.get("git_dirty") else "an unrecorded"
        raise UserError(
            f"made from {said} tree: evidence must be measured from a clean commit",
            source=source,
            field="$.kit.git_dirty",
            value=str(kit.get("git_dirty")).lower(),
            fix="commit every change (the study's protocol in an earlier commit), then run it again from the clean "
            "checkout",
        )


def superseded(root: Path) -> tuple[dict[str, dict], list[str]]:
    """SUPERSEDED.yaml: {path: entry} and its problems (each naming the field)."""
    path = root / SUPERSEDED
    if not path.is_file():
        return {}, []
    try:
        data = load_yaml(path)
    except UserError as exc:
        return {}, [exc.message]
    entries = data.get("superseded") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return {}, ["$.superseded: must be a list of {path, date, reason}"]
    out: dict[str, dict] = {}
    for i, entry in enumerate(entries):
        where = f"$.superseded[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"path", "date", "reason"}:
            return {}, [f"{where}: must have exactly path, date and reason"]
        if not isinstance(entry["path"], str) or not (root / entry["path"]).exists():
            return {}, [f"{where}.path: {entry['path']!r} names nothing under research/"]
        if not isinstance(entry["date"], date) or not (
            isinstance(entry["reason"], str) and entry["reason"].strip()
        ):
            return {}, [f"{where}: date must be a YYYY-MM-DD date and reason a sentence"]
        out[entry["path"].rstrip("/")] = entry
    return out, []


def findings(root: Path, make: Callable[..., object], *, strict: bool = False) -> list:
    """The history findings of research/ (`make(ok, file, detail, tag=…)` builds evidence.Finding)."""
    listed, problems = superseded(root)
    out = [make(False, SUPERSEDED, problems[0])] if problems else []
    found = history(root)
    if isinstance(found, str):
        detail = f"not checked: {found}; verify a full clone to check each protocol precedes its results"
        kept = [
            make(True, p, f"{e['date']}: {e['reason'].strip()}", tag="superseded") for p, e in listed.items()
        ]
        return [*out, make(not strict, GIT, detail, tag="" if strict else "warn"), *kept]
    per_path: dict[str, list[str]] = {p: [] for p in listed}
    studies = (
        sorted(p.name for p in (root / "evidence").iterdir() if p.is_dir())
        if (root / "evidence").is_dir()
        else []
    )
    for name in studies:
        counted = False
        for rel, problem in _study_problems(root, found, name):
            owner = _owner(listed, rel)
            if owner is not None:
                per_path[owner].append(f"{rel}: {problem}")
            else:
                out.append(make(False, rel, f"({GIT}) {problem}"))
                counted = True
        results = sum(
            1 for r in found.added if r.startswith(f"evidence/{name}/") and _owner(listed, r) is None
        )
        if not counted and results:
            # Superseded files are reported below; the study's other results passed the rules.
            out.append(
                make(True, f"studies/{name}.yaml", f"({GIT}) committed before its {results} result file(s)")
            )
    for path, entry in listed.items():
        first = f"; first: {per_path[path][0]}" if per_path[path] else ""
        detail = (
            f"{entry['date']}: {entry['reason'].strip()} ({len(per_path[path])} history problem(s){first})"
        )
        out.append(make(True, path, detail, tag="superseded"))
    return out


def _owner(listed: dict[str, dict], rel: str) -> str | None:
    """The superseded entry a result file belongs to (the file itself or its run directory), if any."""
    return next((p for p in listed if rel == p or rel.startswith(p + "/")), None)


def _unit(rel: str) -> str:
    """evidence/NAME/runs/RUN for a file of a run, else the file itself."""
    parts = rel.split("/")
    return "/".join(parts[:4]) if len(parts) > 4 and parts[2] == "runs" else rel


def _study_problems(root: Path, found: History, name: str) -> list[tuple[str, str]]:
    protocol = f"studies/{name}.yaml"
    versions = found.touched.get(protocol, [])
    if not versions:
        return [(protocol, "not committed: commit the protocol before any of its results")]
    problems: list[tuple[str, str]] = []
    units: set[str] = set()  # a run directory is one result: its first file out of order names it
    for rel in sorted(r for r in found.added if r.startswith(f"evidence/{name}/")):
        result, unit = found.added[rel], _unit(rel)
        for version in [] if unit in units else versions:
            if version == result or not found.is_ancestor(version, result):
                how = (
                    f"the same commit as its protocol {protocol}"
                    if version == result
                    else f"not after its protocol's commit {version[:12]}"
                )
                problems.append((unit, f"added in {result[:12]}, {how}"))
                units.add(unit)
                break
    folder = root / "evidence" / name
    made = sorted(folder.glob("runs/*/manifest.json")) + sorted(folder.glob("measurements/*.json"))
    for path in made:
        rel = path.relative_to(root).as_posix()
        try:
            doc = read_json(path, expect=dict)
        except UserError as exc:
            problems.append((rel, exc.message))
            continue
        if "kit" not in doc and "fallback_prefix" in doc:
            continue  # a head-study study.json records no provenance: judged by order alone
        kit = doc.get("kit") if isinstance(doc.get("kit"), dict) else {}
        commit = kit.get("git_commit")
        if kit.get("git_dirty") is not False:
            problems.append(
                (
                    rel,
                    f"$.kit.git_dirty is {str(kit.get('git_dirty')).lower()}: not measured from a clean tree",
                )
            )
        elif not commit or not found.has_commit(commit):
            problems.append((rel, f"$.kit.git_commit {commit} is not a commit of this repository"))
        elif not all(found.is_ancestor(v, commit) for v in versions):
            problems.append(
                (rel, f"$.kit.git_commit {commit[:12]} does not contain its protocol {protocol} as committed")
            )
    return problems
