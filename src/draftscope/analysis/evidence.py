"""research/: study protocols, reported claims, the kit's own evidence, and SHA256SUMS over all of them.

Layout (relative to research/):

    claims.yaml                         historical results with provenance and status   (claims schema)
    studies/NAME.yaml                   a protocol per study, frozen before its runs     (study schema)
    evidence/NAME/runs/RUN_ID/          run directories, copied in unchanged             (validate_run)
    evidence/NAME/comparisons/X.json    comparisons (+ X.png)                            (comparison schema)
    SHA256SUMS                          `sha256sum` format over every file above

`verify` checks every hash (a changed, missing or unlisted file fails, named) and validates every artifact against
its schema. `add` copies a run or a comparison in — never over an existing one — and appends only the new files'
hashes: existing lines are never recomputed, so adding cannot bless a file changed since it was summed.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from draftscope import schema as schemas
from draftscope.config import load_yaml
from draftscope.errors import UserError
from draftscope.jsonio import atomic_write_text, read_json, sha256_file
from draftscope.resources import repo_root
from draftscope.rundir import FINAL, MANIFEST
from draftscope.validate import validate_run

SUMS = "SHA256SUMS"
NOT_SUMMED = frozenset({SUMS, "README.md"})  # top-level files that are documentation, not evidence
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


@dataclass(frozen=True)
class Finding:
    ok: bool
    file: str
    detail: str = ""

    def line(self) -> str:
        sep = " " if self.detail.startswith("(") else ": "  # "(schema) …" reads like `invoke validate`
        return f"{'ok  ' if self.ok else 'FAIL'} {self.file}" + (sep + self.detail if self.detail else "")


def research_dir(root: Path | str | None = None) -> Path:
    """`root`, else research/ of the checkout, else ./research."""
    if root is not None:
        return Path(root)
    checkout = repo_root()
    return checkout / "research" if checkout is not None else Path("research")


def load_study(name: str, root: Path | None = None) -> dict:
    """A study protocol, validated; an unknown name lists the known ones."""
    folder = research_dir(root) / "studies"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(folder.glob("*.yaml"))) or "none"
        raise UserError(f"no study '{name}'", field="--study", fix=f"write {path} first (known: {known})")
    data = load_yaml(path)
    schemas.check(data, "study", str(path))
    return data


def check_study_inputs(study: dict, prompts_sha256: dict[str, str | None]) -> None:
    """Each run (run id → its prompts hash) must have used the prompt file the study froze."""
    frozen = {i["sha256"] for i in study["inputs"] if i["name"] == "prompts"}
    for run_id, sha in prompts_sha256.items():
        if frozen and sha not in frozen:
            raise UserError(
                f"run {run_id} used prompts with sha256 {sha}, not the study's frozen {sorted(frozen)[0]}",
                field="--study",
                value=study["name"],
                fix="compare runs made from the study's frozen inputs",
            )


def summed_files(root: Path) -> list[str]:
    """Every file under `root` that SHA256SUMS must cover, as sorted POSIX paths relative to `root`."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel not in NOT_SUMMED:
            out.append(rel)
    return out


def read_sums(root: Path) -> dict[str, str]:
    path = root / SUMS
    if not path.is_file():
        raise UserError("no SHA256SUMS", source=str(root), fix="restore it from version control")
    sums: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            raise UserError(f"line {number} is not '<sha256>  <path>'", source=str(path))
        sums[match[2]] = match[1]
    return sums


def write_sums(root: Path, sums: dict[str, str]) -> None:
    atomic_write_text(root / SUMS, "".join(f"{digest}  {rel}\n" for rel, digest in sorted(sums.items())))


def verify(root: Path) -> list[Finding]:
    """Hashes first (every listed file, every unlisted one), then each artifact against its schema."""
    root = Path(root)
    if not root.is_dir():
        raise UserError("no research folder", source=str(root), fix="run from a checkout or pass --root")
    return check_hashes(root) + _schema_findings(root)


def check_hashes(root: Path) -> list[Finding]:
    """SHA256SUMS against the files: one finding per changed, missing or unlisted file, else one `ok`."""
    findings: list[Finding] = []
    try:
        sums = read_sums(root)
    except UserError as exc:
        findings.append(Finding(False, SUMS, exc.message))
        sums = {}
    present = set(summed_files(root))
    for rel in sorted(set(sums) | present):
        if rel not in present:
            findings.append(Finding(False, rel, "listed in SHA256SUMS but missing"))
        elif rel not in sums:
            findings.append(Finding(False, rel, "not listed in SHA256SUMS"))
        elif sha256_file(root / rel) != sums[rel]:
            findings.append(Finding(False, rel, "SHA-256 differs from SHA256SUMS (the file changed)"))
    return findings or [Finding(True, SUMS, f"{len(sums)} file(s) match")]


def _schema_findings(root: Path) -> list[Finding]:
    out: list[Finding] = []
    if (root / "claims.yaml").is_file():
        finding = _check_yaml(root, "claims.yaml", "claims")
        if finding.ok:
            for claim in load_yaml(root / "claims.yaml")["claims"]:
                missing = [e for e in claim["evidence"] if not (root / e).exists()]
                if missing:
                    finding = Finding(
                        False, "claims.yaml", f"claim {claim['id']} cites missing evidence {missing[0]}"
                    )
                    break
        out.append(finding)
    studies = sorted((root / "studies").glob("*.yaml")) if (root / "studies").is_dir() else []
    for path in studies:
        finding = _check_yaml(root, path.relative_to(root).as_posix(), "study")
        if finding.ok and load_yaml(path)["name"] != path.stem:
            finding = Finding(False, finding.file, f"name differs from the file name '{path.stem}'")
        out.append(finding)
    names = {p.stem for p in studies}
    evidence = root / "evidence"
    for study in sorted(evidence.iterdir()) if evidence.is_dir() else []:
        rel = study.relative_to(root).as_posix()
        if study.name not in names:
            out.append(Finding(False, rel, f"no protocol studies/{study.name}.yaml for this evidence"))
        for run in sorted((study / "runs").iterdir()) if (study / "runs").is_dir() else []:
            report = validate_run(run)
            for v in report.verdicts:
                detail = f"({v.schema})" + (f" {v.detail}" if v.detail else "")
                out.append(Finding(v.ok, f"{run.relative_to(root).as_posix()}/{v.file}", detail))
        for comp in (
            sorted((study / "comparisons").glob("*.json")) if (study / "comparisons").is_dir() else []
        ):
            out.append(_check_json(root, comp))
    return out


def _check_yaml(root: Path, rel: str, schema: str) -> Finding:
    try:
        data = load_yaml(root / rel)
    except UserError as exc:
        return Finding(False, rel, exc.message)
    problems = schemas.problems(data, schema)
    return _verdict(rel, schema, [f"{p.path}: {p.message}" for p in problems])


def _check_json(root: Path, path: Path) -> Finding:
    rel = path.relative_to(root).as_posix()
    try:
        data = read_json(path)
    except UserError as exc:
        return Finding(False, rel, exc.message)
    return _verdict(
        rel, "comparison", [f"{p.path}: {p.message}" for p in schemas.problems(data, "comparison")]
    )


def _check_links(root: Path, study: Path, comp: Path) -> Finding:
    """A comparison whose runs are in the same study's evidence must name exactly those runs (manifest hash)."""
    rel = comp.relative_to(root).as_posix()
    doc = read_json(comp)
    for role in ("base", "candidate"):
        run = study / "runs" / doc[role]["run_id"]
        if (run / MANIFEST).is_file() and sha256_file(run / MANIFEST) != doc[role]["manifest_sha256"]:
            return Finding(
                False, rel, f"(comparison) its {role} manifest hash differs from {run.relative_to(root)}"
            )
    return Finding(True, rel, "(comparison)")


def _verdict(rel: str, schema: str, problems: list[str]) -> Finding:
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Finding(False, rel, f"({schema}) {problems[0]}{more}")
    return Finding(True, rel, f"({schema})")


def add(root: Path, source: Path, study: str) -> list[str]:
    """Copy a run directory or a comparison JSON (with its figure) into evidence/STUDY/; returns the new files."""
    root, source = Path(root), Path(source)
    failures = [f for f in verify(root) if not f.ok]
    if failures:
        raise UserError(
            f"research/ does not verify ({failures[0].file}: {failures[0].detail})",
            source=str(root),
            fix="run `invoke evidence.verify` and restore the named file before adding",
        )
    load_study(study, root)  # an unknown or invalid protocol is refused, naming the known ones
    if (source / MANIFEST).is_file():
        copied = _add_run(root, source, study)
    elif source.is_file() and source.suffix == ".json":
        copied = _add_comparison(root, source, study)
    else:
        raise UserError("neither a run directory nor a comparison .json", source=str(source))
    sums = read_sums(root)
    for rel in copied:
        sums[rel] = sha256_file(root / rel)
    write_sums(root, sums)
    return copied


def _add_run(root: Path, source: Path, study: str) -> list[str]:
    report = validate_run(source)
    if not report.ok:
        raise UserError(f"the run does not validate: {report.first_failure()}", source=str(source))
    manifest = read_json(source / MANIFEST)
    if manifest["status"] not in FINAL:
        raise UserError(
            f"the run is still '{manifest['status']}'", source=str(source), fix="add a finished run"
        )
    dest = root / "evidence" / study / "runs" / manifest["run_id"]
    _refuse(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, dest, symlinks=False)  # fails if dest appeared meanwhile: never merged
    return _rel_files(root, dest.rglob("*"))


def _add_comparison(root: Path, source: Path, study: str) -> list[str]:
    doc = read_json(source)
    schemas.check(doc, "comparison", str(source))
    folder = root / "evidence" / study / "comparisons"
    files = [source] + ([source.parent / doc["figure"]] if doc.get("figure") else [])
    for f in files:
        if not f.is_file():
            raise UserError("the comparison's figure is missing", source=str(f))
        _refuse(folder / f.name)
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        with (folder / f.name).open("xb") as out:  # exclusive
            out.write(f.read_bytes())
    return _rel_files(root, (folder / f.name for f in files))


def _refuse(dest: Path) -> None:
    if dest.exists():
        raise UserError(
            "already in the evidence; evidence is never overwritten",
            source=str(dest),
            fix="give the run or comparison a new name",
        )


def _rel_files(root: Path, paths: Iterable[Path]) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in paths if p.is_file())
