"""research/: study protocols, reported claims, the kit's own evidence, and SHA256SUMS over all of them.

Layout (relative to research/):

    claims.yaml                         historical results with provenance and status   (claims schema)
    studies/NAME.yaml                   a protocol per study, frozen before its runs     (study schema)
    evidence/NAME/runs/RUN_ID/          run directories, copied in unchanged             (validate_run)
    evidence/NAME/comparisons/X.json    comparisons (+ X.png)                            (comparison schema)
    evidence/NAME/measurements/X.json   a kit task's JSON report, copied in unchanged    (head-bench or head-study
                                                                                          schema, by its content)
    SHA256SUMS                          `sha256sum` format over every file above

Two kinds of study: a comparison study (the default) holds runs and the comparisons of them, judged by its frozen
admission rule; a measurement study (`kind: measurement`) holds the reports of one kit task (`invoke head-bench
--output X.json`, or a `head-study` study.json), made with the options its protocol froze.

`verify` checks every hash (a changed, missing or unlisted file fails, named) and validates every artifact against
its schema; a measurement must also match its study's frozen task and options; then, through git history, that
each study's protocol was committed before its results and each result measured from a clean commit holding it
(analysis/evidence_git.py, which also reads SUPERSEDED.yaml: evidence kept, hash-checked, never counted). `add` copies a run, a comparison or
a measurement in — never over an existing one — and appends only the new files' hashes: existing lines are never
recomputed, so adding cannot bless a file changed since it was summed. A JSON file is told apart by its content: a
head-bench report (`kind: head-bench`) or a head-study study.json is a measurement, anything else a comparison.

Over ~400 lines on purpose: the layout of research/, its hashes and their verification are one contract.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from draftscope.analysis import evidence_git
from draftscope.core import schema as schemas
from draftscope.core.config import load_yaml
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_text, read_json, sha256_file
from draftscope.core.resources import repo_root
from draftscope.core.rundir import FINAL, MANIFEST
from draftscope.core.untrusted import check_file, check_run_id
from draftscope.core.validate import validate_run

SUMS = "SHA256SUMS"
NOT_SUMMED = frozenset({SUMS, "README.md"})  # top-level files that are documentation, not evidence
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


@dataclass(frozen=True)
class Finding:
    ok: bool
    file: str
    detail: str = ""
    tag: str = ""  # `warn` or `superseded` in place of ok (analysis/evidence_git.py)

    def line(self) -> str:
        sep = " " if self.detail.startswith("(") else ": "  # "(schema) …" reads like `invoke validate`
        tag = self.tag or ("ok  " if self.ok else "FAIL")
        return f"{tag} {self.file}" + (sep + self.detail if self.detail else "")


def research_dir(root: Path | str | None = None) -> Path:
    """`root`, else research/ of the checkout, else ./research. A given `root` must look like a research folder
    (SHA256SUMS or studies/ in it): anything else, `/` say, would be walked and hashed whole."""
    if root is not None:
        folder = Path(root)
        if folder.is_dir() and not ((folder / SUMS).is_file() or (folder / "studies").is_dir()):
            raise UserError(
                "not a research folder (no SHA256SUMS and no studies/ in it)",
                field="--root",
                value=str(root),
                fix="pass the research/ folder of a checkout",
            )
        return folder
    checkout = repo_root()
    return checkout / "research" if checkout is not None else Path("research")


COMPARISON, MEASUREMENT = "comparison", "measurement"


def load_study(name: str, root: Path | None = None, kind: str | None = COMPARISON) -> dict:
    """A study protocol, validated; an unknown name lists the known ones. `kind` (None: either) is the kind of
    study the caller needs: `compare --study` needs a comparison study, with its frozen admission rule."""
    folder = research_dir(root) / "studies"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(folder.glob("*.yaml"))) or "none"
        raise UserError(f"no study '{name}'", field="--study", fix=f"write {path} first (known: {known})")
    data = load_yaml(path)
    schemas.check(data, "study", str(path))
    if kind is not None and study_kind(data) != kind:
        raise UserError(
            f"study '{name}' is a {study_kind(data)} study, not a {kind} study",
            field="--study",
            value=name,
            fix=f"name a {kind} study (research/studies/*.yaml)",
        )
    return data


def study_kind(study: dict) -> str:
    return str(study.get("kind", COMPARISON))


# A measurement's task → the schema of its report (the same name).
MEASUREMENT_TASKS = ("head-bench", "head-study")


def measurement_task(doc: object) -> str | None:
    """Which kit task made this JSON document, told by its content: a head-bench report says `kind: head-bench`;
    a head-study study.json has no kind but its fallback counts. None for anything else (a comparison)."""
    if not isinstance(doc, dict):
        return None
    if doc.get("kind") == "head-bench":
        return "head-bench"
    if "kind" not in doc and "fallback_prefix" in doc and "fallback_rowwise" in doc:
        return "head-study"
    return None


def measurement_problem(study: dict, doc: dict) -> str | None:
    """Why a measurement (valid against its schema) does not belong to this study's frozen protocol, or None.

    The task must be the study's; every frozen option must equal the report's (a list option as a list or as the
    command line's comma-separated text); for head-bench the device must be the study's hardware device and the
    repeats the study's repeats."""
    name = study["name"]
    if study_kind(study) != MEASUREMENT:
        return f"study '{name}' is a comparison study: a measurement belongs to a study of kind measurement"
    task, spec = measurement_task(doc), study["measurement"]
    if task != spec["task"]:
        return f"a {task} report, but study '{name}' measures {spec['task']}"
    recorded = _recorded_options(task, doc)
    expected = dict(spec["options"])
    if task == "head-bench":
        expected.setdefault("device", study["hardware"]["device"])
        expected.setdefault("repeats", study["repeats"])
        if expected["device"] != study["hardware"]["device"] or expected["repeats"] != study["repeats"]:
            return f"study '{name}' options contradict its hardware.device or repeats"  # a protocol bug
    for key, want in expected.items():
        if key not in recorded:
            return f"option '{key}' of study '{name}' is not recorded in a {task} report"
        if not _same_option(want, recorded[key]):
            return f"made with {key} {_show(recorded[key])}, but study '{name}' froze {_show(want)}"
    return None


def _recorded_options(task: str, doc: dict) -> dict:
    if task == "head-bench":
        return dict(doc["config"])  # the options as parsed, device included
    return {"k": doc["k"], "group_size": doc["group_size"]}


def _same_option(want: object, got: object) -> bool:
    if isinstance(got, list):
        items = want if isinstance(want, list) else [w for w in str(want).split(",") if w.strip()]
        return len(items) == len(got) and all(_same_option(w, g) for w, g in zip(items, got, strict=True))
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        try:
            return float(str(want).strip()) == float(got)
        except ValueError:
            return False
    return want == got


def _show(value: object) -> str:
    return (
        ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        if isinstance(value, list)
        else str(value)
    )


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


def verify(root: Path, *, strict: bool = False) -> list[Finding]:
    """Hashes first (every listed file, every unlisted one), then each artifact against its schema, then the git
    history (analysis/evidence_git.py: each protocol committed before its results, each result measured from a
    clean commit; `strict` fails where there is no history to check)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError("no research folder", source=str(root), fix="run from a checkout or pass --root")
    return check_hashes(root) + _schema_findings(root) + evidence_git.findings(root, Finding, strict=strict)


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
        protocol = _protocol(root, study.name) if study.name in names else None
        for path in (
            sorted((study / "measurements").glob("*.json")) if (study / "measurements").is_dir() else []
        ):
            out.append(_check_measurement(root, path, protocol))
    return out


def _protocol(root: Path, name: str) -> dict | None:
    """studies/NAME.yaml when it is valid (an invalid one is reported by its own finding), else None."""
    try:
        data = load_yaml(root / "studies" / f"{name}.yaml")
    except UserError:
        return None
    return data if isinstance(data, dict) and not schemas.problems(data, "study") else None


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


def _check_measurement(root: Path, path: Path, protocol: dict | None) -> Finding:
    """A measurement against the schema its content names, then against its study's frozen protocol."""
    rel = path.relative_to(root).as_posix()
    try:
        doc = read_json(path)
    except UserError as exc:
        return Finding(False, rel, exc.message)
    task = measurement_task(doc)
    if task is None:
        return Finding(False, rel, f"neither a {' nor a '.join(MEASUREMENT_TASKS)} report")
    finding = _verdict(rel, task, [f"{p.path}: {p.message}" for p in schemas.problems(doc, task)])
    if finding.ok and protocol is not None:
        problem = measurement_problem(protocol, doc)
        if problem:
            return Finding(False, rel, f"({task}) {problem}")
    return finding


def _verdict(rel: str, schema: str, problems: list[str]) -> Finding:
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Finding(False, rel, f"({schema}) {problems[0]}{more}")
    return Finding(True, rel, f"({schema})")


def add(root: Path, source: Path, study: str, *, scrub: Callable[[Path], object] | None = None) -> list[str]:
    """Copy a run directory, a comparison JSON (with its figure) or a measurement JSON into evidence/STUDY/;
    returns the new files. `scrub`, given each copied run directory and measurement before they are summed, may
    rewrite them in place (the command line passes share's host-path rewrite)."""
    root, source = Path(root), Path(source)
    evidence_git.check_clean_checkout(root)  # outside a git checkout there is nothing to check here
    failures = [f for f in verify(root) if not f.ok]
    if failures:
        raise UserError(
            f"research/ does not verify ({failures[0].file}: {failures[0].detail})",
            source=str(root),
            fix="run `invoke evidence.verify` and restore the named file before adding",
        )
    # An unknown or invalid protocol is refused, naming the known ones; its kind decides what it accepts.
    protocol = load_study(study, root, kind=None)
    doc = read_json(source) if source.is_file() and source.suffix == ".json" else None
    if doc is not None and measurement_task(doc) is not None:
        copied = _add_measurement(root, source, doc, protocol)
    elif (source / MANIFEST).is_file() or doc is not None:
        if study_kind(protocol) != COMPARISON:
            raise UserError(
                f"study '{study}' is a measurement study: it keeps {protocol['measurement']['task']} reports",
                field="--study",
                value=study,
                fix="add runs and comparisons to a comparison study",
            )
        copied = _add_run(root, source, study) if doc is None else _add_comparison(root, source, study)
    else:
        raise UserError("neither a run directory nor a comparison or measurement .json", source=str(source))
    if scrub is not None:
        for target in _scrub_targets(root, study, copied):
            scrub(target)
    sums = read_sums(root)
    for rel in copied:
        sums[rel] = sha256_file(root / rel)
    write_sums(root, sums)
    return copied


def _scrub_targets(root: Path, study: str, copied: list[str]) -> list[Path]:
    """The copied run directories and measurements (comparisons name their runs and are left as made)."""
    runs, measurements = f"evidence/{study}/runs/", f"evidence/{study}/measurements/"
    targets = {root / (runs + rel[len(runs) :].split("/", 1)[0]) for rel in copied if rel.startswith(runs)}
    targets |= {root / rel for rel in copied if rel.startswith(measurements) and rel.endswith(".json")}
    return sorted(targets)


def _add_run(root: Path, source: Path, study: str) -> list[str]:
    report = validate_run(source)
    if not report.ok:
        raise UserError(f"the run does not validate: {report.first_failure()}", source=str(source))
    manifest = read_json(source / MANIFEST, expect=dict)
    if manifest["status"] not in FINAL:
        raise UserError(
            f"the run is still '{manifest['status']}'", source=str(source), fix="add a finished run"
        )
    evidence_git.check_addable(manifest, str(source / MANIFEST))
    dest = (
        root / "evidence" / study / "runs" / check_run_id(manifest["run_id"], source=str(source / MANIFEST))
    )
    for path in sorted(source.rglob("*")):  # copied with links followed: each must stay in the run
        if path.is_symlink() or not path.is_dir():
            check_file(source, path.relative_to(source).as_posix())
    _refuse(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, dest, symlinks=False)  # fails if dest appeared meanwhile: never merged
    return _rel_files(root, dest.rglob("*"))


def _add_comparison(root: Path, source: Path, study: str) -> list[str]:
    doc = read_json(source)
    schemas.check(doc, "comparison", str(source))
    folder = root / "evidence" / study / "comparisons"
    figure = doc.get("figure")
    if figure and (Path(figure).name != figure or figure in (".", "..")):
        raise UserError(
            "must name a file beside the comparison",
            source=str(source),
            field="$.figure",
            value=figure,
            fix="give the figure's file name only, as `invoke compare` writes it",
        )
    files = [source] + ([source.parent / figure] if figure else [])
    for f in files:
        if not f.is_file():
            raise UserError("the comparison's figure is missing", source=str(f))
        _refuse(folder / f.name)
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        with (folder / f.name).open("xb") as out:  # exclusive
            out.write(f.read_bytes())
    return _rel_files(root, (folder / f.name for f in files))


def _add_measurement(root: Path, source: Path, doc: dict, study: dict) -> list[str]:
    task = measurement_task(doc)
    assert task is not None
    schemas.check(doc, task, str(source))
    problem = measurement_problem(study, doc)
    if not problem:
        evidence_git.check_addable(doc, str(source))
    if problem:
        fix = (
            "add a report made with the study's frozen options"
            if study_kind(study) == MEASUREMENT
            else "add it to a measurement study (kind: measurement) of its task"
        )
        raise UserError(problem, source=str(source), fix=fix)
    dest = root / "evidence" / study["name"] / "measurements" / source.name
    _refuse(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("xb") as out:  # exclusive
        out.write(source.read_bytes())
    return _rel_files(root, [dest])


def _refuse(dest: Path) -> None:
    if dest.exists():
        raise UserError(
            "already in the evidence; evidence is never overwritten",
            source=str(dest),
            fix="give the run, comparison or report a new name",
        )


def _rel_files(root: Path, paths: Iterable[Path]) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in paths if p.is_file())
