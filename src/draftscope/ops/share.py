"""`invoke share RUN --output BUNDLE.tar.gz`: a run packed for an issue report or a reviewer, text left out.

Prompts and generated text stay local (docs/use/run-directories.md), so the bundle is built from an allow
list, not by deleting from a copy: under `<run_id>/` it holds

    manifest.json   the manifest as recorded (status, reason, images, hardware, versions, input hashes)
    config.json     the frozen config (the manifest's `config`)
    summary.json    when the run wrote one
    worker.json     the worker's facts (backend, load time, versions), when present
    records.jsonl   every record without its text: generated token ids (they decode to the generated text) and
                    any text field are removed; a torn last line is left out
    hardware.json   the run's hardware and the packing host's (`invoke doctor`, without paths)
    SHARE.json      what was packed, what was removed, rewritten or left out and why, the kit that packed it
    SHA256SUMS      `sha256sum -c` format, for every file above

Paths of the host are not shared either: they name the user and the directory layout, and nothing needs them
(inputs are identified by their SHA-256, `invoke reproduce` works from the run directory). In every member above,
each absolute path, whole string or inside one (`--flag=/p`, `KEY=/p`, `SRC:TARGET:ro`, a message), becomes

    <run>/REST      inside the run directory (where it is now, and where its steps recorded it)
    ~/REST          under the home directory of the user who packs
    …/NAME          anywhere else: the file name is kept, its directories are dropped

Kept as they are: the containers' own paths (the mount targets RUN_MOUNT, CACHE_MOUNT, MODELS_MOUNT, INPUTS_MOUNT,
the image's scripts and the container HOME of `runtime.container`), a path of one component (`/tmp`), relative
paths and URLs. A JSON member without a path to rewrite keeps its bytes; one with paths is written again as the
kit writes JSON. SHARE.json's `paths` counts the rewrites per member; `--keep-paths` packs the paths verbatim.

`--include-text` keeps the records whole and adds everything else of the run (prompt copies under inputs/, logs/,
captured head calls); those added files are packed byte for byte (a prompt copy keeps its hash), paths included.
Archive members get fixed modes, owners and times, and gzip no timestamp: only the packing time and host in
SHARE.json and hardware.json differ between two bundles of one run packed by one user.

Over ~400 lines on purpose: the allow list, the stripping of records and the archive writer are one policy (what
leaves the machine), reviewed together.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import platform
import posixpath
import re
import sys
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.core.errors import UserError
from draftscope.core.jsonio import parse_json, read_json
from draftscope.core.outputs import check_output_path
from draftscope.core.provenance import now
from draftscope.core.rundir import RESERVE, SUPERVISOR
from draftscope.core.untrusted import check_file, check_run_id
from draftscope.ops import doctor
from draftscope.pipeline.base import INPUTS_MOUNT, MODELS_MOUNT
from draftscope.runtime.container import HOME_ENV
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT

# Record fields that hold text or token ids, wherever they appear in a record (`extra` included). Token ids are
# text: anyone with the tokenizer decodes them.
TEXT_FIELDS = frozenset(
    {
        "generated_token_ids",
        "generated_text",
        "token_ids",
        "input_ids",
        "output_ids",
        "output_token_ids",
        "prompt_token_ids",
        "text",
        "prompt",
        "prompt_text",
        "output_text",
        "completion",
        "messages",
        "content",
    }
)
# Files packed as they are (when present); records.jsonl is packed redacted.
AS_IS = ("manifest.json", "summary.json", "worker.json")
RECORDS = "records.jsonl"
# Internal bookkeeping of a run directory (space set aside for the final status): never packed nor listed.
SKIP = (RESERVE, SUPERVISOR)  # the disk reserve; an unfinished run's lock (pid, host)
ARCHIVE_MODE = 0o644

# Paths: what a rewritten host path becomes (module docstring).
RUN_MARK = "<run>"
HOME_MARK = "~"
ELIDED = "…"
# The containers' side of every mount, and the container HOME: no host's directories.
CONTAINER_PATHS = (RUN_MOUNT, CACHE_MOUNT, MODELS_MOUNT, INPUTS_MOUNT, HOME_ENV["HOME"])
# Manifest fields whose lists are argv: each element is one word, so a path in it may hold spaces.
ARGV_KEYS = frozenset({"command_line", "argv", "command"})
# Where a path inside a string ends; before it, only a separator (so `tok/s`, `a/b`, `~/x`, `<run>/x`, `…/x` and
# the `//` of a URL are not paths).
_END = r"\s:;,=\"'`()\[\]{}<>|"
_BEFORE = r"(?<![\w.~/\\<>…-])"
_FLAG = re.compile(r"(-{1,2}[\w.-]+=|[A-Za-z_]\w*=)(.*)", re.DOTALL)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _container(path: str) -> bool:
    return any(_under(path, c) for c in CONTAINER_PATHS)


class HostPaths:
    """Rewrites the absolute paths of the packing host in JSON values (module docstring); counts what it changed.

    `runs`: the run directory's host paths (where it is now, where its steps recorded it); `home`: the home
    directory of the user who packs. Both are compared after `posixpath.normpath`, the longest first."""

    def __init__(self, runs: list[str], home: str | None) -> None:
        roots: dict[str, str] = {}
        for run in runs:
            if run.startswith("/"):
                roots.setdefault(posixpath.normpath(run), RUN_MARK)
        if home and home.startswith("/"):
            for h in (home, os.path.realpath(home)):
                roots.setdefault(posixpath.normpath(h), HOME_MARK)
        self.roots = sorted(
            ((root, mark) for root, mark in roots.items() if root.strip("/") and not _container(root)),
            key=lambda item: (-len(item[0]), item[1] != RUN_MARK),
        )
        known = "|".join(re.escape(root) for root, _ in self.roots)
        # A known root may hold spaces (`/Users/Ann Lee`); any other path ends at a space.
        generic = rf"/(?![/\s])[^{_END}]*"
        pattern = (
            rf"{_BEFORE}(?:(?:{known})(?![^{_END}/])[^{_END}]*|{generic})" if known else _BEFORE + generic
        )
        self._in_text = re.compile(pattern)
        self.count = 0

    @classmethod
    def for_run(cls, run: Path, manifest: Mapping[str, Any], home: str | None = None) -> HostPaths:
        runs = [os.path.abspath(run), os.path.realpath(run), *_recorded_run_dirs(manifest)]
        return cls(runs, os.path.expanduser("~") if home is None else home)

    def path(self, value: str) -> str:
        """One absolute path, rewritten."""
        norm = posixpath.normpath(value)
        if _container(norm):
            return value
        for root, mark in self.roots:
            if _under(norm, root):
                out = mark + norm[len(root) :]
                break
        else:
            out = value if norm.count("/") <= 1 else f"{ELIDED}/{norm.rsplit('/', 1)[-1]}"
        self.count += out != value
        return out

    def text(self, value: str) -> str:
        """Every absolute path inside a string (a message, a volume spec, `--flag=/p`), rewritten."""
        return self._in_text.sub(lambda m: self.path(m.group()), value)

    def word(self, value: str, argv: bool = False) -> str:
        """A string that may be a path as a whole: an argv word holds one path, spaces and all."""
        if "/" not in value:
            return value
        if value.startswith("/") and not value.startswith("//") and "\n" not in value:
            if argv and ":" in value and "://" not in value:  # SRC:TARGET[:MODE], one word
                return ":".join(self.word(part, argv) for part in value.split(":"))
            if ":" not in value and (argv or not any(c.isspace() for c in value)):
                return self.path(value)
        flag = _FLAG.fullmatch(value)
        if flag:
            return flag.group(1) + self.word(flag.group(2), argv)
        return self.text(value)

    def json(self, value: Any, skip: frozenset[str] = frozenset(), argv: bool = False) -> Any:
        """A JSON value with its paths rewritten; the values of `skip` keys (user text) are left alone."""
        if isinstance(value, str):
            return self.word(value, argv)
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                new_key = self.word(key) if isinstance(key, str) else key
                out[new_key] = item if key in skip else self.json(item, skip, key in ARGV_KEYS)
            return out
        if isinstance(value, list):
            return [self.json(v, skip, argv) for v in value]
        return value

    def member(self, data: bytes) -> tuple[bytes, int]:
        """A JSON file's bytes with paths rewritten, and how many: unchanged bytes when there is none."""
        before = self.count
        try:
            obj = parse_json(data, "member")
        except UserError:  # a damaged or hostile file: its paths are rewritten in the text
            out = self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
        else:
            out = _dumps(self.json(obj))
        changed = self.count - before
        return (out if changed else data), changed


# A run directory's members whose host paths `rewrite_host_paths` rewrites in place (evidence, not a bundle).
SCRUBBED_JSON = ("manifest.json", "summary.json", "worker.json")


def host_path_rewrites(path: Path, home: str | None = None) -> list[tuple[Path, bytes]]:
    """(file, its new bytes) for each file under `path` (a run directory, or one JSON file) in which this module's
    rule would rewrite a host path: the run's JSON members and its logs (as text; bytes, so a progress bar's `\r`
    stays). Records and inputs are never touched: they hold the prompts and tokens, and no host path."""
    home = os.path.expanduser("~") if home is None else home
    path = Path(path)
    if path.is_file():
        out, changed = HostPaths([], home).member(path.read_bytes())
        return [(path, out)] if changed else []
    manifest_file = path / "manifest.json"
    manifest = read_json(manifest_file, expect=dict) if manifest_file.is_file() else {}
    paths = HostPaths.for_run(path, manifest, home)
    found: list[tuple[Path, bytes]] = []
    for name in SCRUBBED_JSON:
        member = path / name
        if member.is_file() and not member.is_symlink():
            out, changed = paths.member(member.read_bytes())
            if changed:
                found.append((member, out))
    for log in sorted((path / "logs").glob("*.log")):
        if log.is_file() and not log.is_symlink():
            text = log.read_bytes().decode("utf-8", "surrogateescape")
            new = paths.text(text)
            if new != text:
                found.append((log, new.encode("utf-8", "surrogateescape")))
    return found


def rewrite_host_paths(path: Path) -> list[Path]:
    """Rewrite, in place, the host paths `host_path_rewrites` finds under `path`; returns the files changed. For
    evidence that is committed (`invoke evidence.add`): what ran stays recorded, where on this machine does not."""
    changed = host_path_rewrites(path)
    for file, data in changed:
        file.write_bytes(data)
    return [file for file, _ in changed]


def _recorded_run_dirs(manifest: Mapping[str, Any]) -> list[str]:
    """Where the run directory was when it ran (it may have moved since): the host side of its mount (`--mount`, or
    an older run's `--volume`), the `--run-dir` of a local step, and an `--output` of the command line that names
    the run."""
    found: list[str] = []
    mount = re.compile(rf"(/.+):{re.escape(RUN_MOUNT)}(?::\w+)?")

    def scan(argv: Any, flag: str, name: str | None) -> None:
        if not isinstance(argv, list):
            return
        for i, word in enumerate(argv):
            if not isinstance(word, str):
                continue
            value = None
            if word == flag and i + 1 < len(argv) and isinstance(argv[i + 1], str):
                value = argv[i + 1]
            elif word.startswith(flag + "="):
                value = word.split("=", 1)[1]
            elif (m := mount.fullmatch(word)) is not None:
                value = m.group(1)
            elif word.startswith("type=bind,") or word.startswith('"type=bind'):
                value = _bind_source(word, RUN_MOUNT)
            if (
                value
                and value.startswith("/")
                and (name is None or posixpath.basename(value.rstrip("/")) == name)
            ):
                found.append(value)

    for step in manifest.get("steps") or []:
        if isinstance(step, Mapping):
            scan(step.get("argv"), "--run-dir", None)
    run_id = manifest.get("run_id")
    if isinstance(run_id, str) and run_id:
        scan(manifest.get("command_line"), "--output", run_id)
    return found


def _bind_source(spec: str, target: str) -> str | None:
    """The source of a `--mount type=bind,source=S,target=T` value (one CSV record) when T is `target`."""
    try:
        row = next(csv.reader([spec]))
    except (csv.Error, StopIteration):
        return None
    fields = dict(item.split("=", 1) for item in row if "=" in item)
    return fields.get("source") if fields.get("target") == target else None


@dataclass
class Bundle:
    """What `pack` wrote: the archive, its files, and what it removed or left out."""

    output: Path
    files: list[str]
    records: int
    redacted_fields: list[str]
    left_out: list[str]
    torn_lines: int = 0
    include_text: bool = False
    paths: dict[str, int] | None = None  # member → host paths rewritten; None: kept (--keep-paths)

    def lines(self) -> list[str]:
        out = [f"{self.output}: {len(self.files)} files ({', '.join(self.files)})"]
        if self.include_text:
            out.append("text included (--include-text): prompts, generated tokens and logs are in the bundle")
        else:
            removed = ", ".join(self.redacted_fields) or "nothing to remove"
            out.append(f"records: {self.records}, text removed ({removed})")
            if self.left_out:
                out.append(f"left out: {', '.join(self.left_out)} (--include-text packs them)")
        if self.torn_lines:
            out.append(f"records: {self.torn_lines} incomplete line(s) left out")
        if self.paths is None:
            out.append("paths kept as recorded (--keep-paths): they name this host's directories")
        elif self.paths:
            where = ", ".join(f"{name} {n}" for name, n in self.paths.items())
            out.append(
                f"paths: {sum(self.paths.values())} of this host rewritten ({where}); --keep-paths keeps them"
            )
        return out


def redact(record: Any) -> tuple[Any, set[str]]:
    """The record without TEXT_FIELDS at any depth, and the names removed."""
    removed: set[str] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if key in TEXT_FIELDS:
                    removed.add(key)
                    continue
                out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(record), removed


def _records(
    path: Path, include_text: bool, paths: HostPaths | None = None
) -> tuple[bytes, int, set[str], int]:
    """(records.jsonl bytes, records kept, fields removed, torn or invalid lines left out); `paths` rewrites
    the host's paths outside the text fields (the text itself is never edited)."""
    out, removed, kept, torn = [], set(), 0, 0
    with path.open("rb") as fh:
        for raw in fh:
            try:
                record = parse_json(raw, str(path)) if raw.endswith(b"\n") else None
            except UserError:
                record = None
            if not isinstance(record, dict):
                torn += bool(raw.strip())  # a killed writer's last line, or a damaged one: never packed
                continue
            if not include_text:
                record, names = redact(record)
                removed |= names
            if paths is not None and b"/" in raw:  # a record without a slash holds no path
                record = paths.json(record, skip=TEXT_FIELDS)
            out.append(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            kept += 1
    return "".join(out).encode("utf-8"), kept, removed, torn


def host_report(collect: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The packing host as `invoke doctor` sees it, without paths (disk location, CDI files) or image IDs."""
    report = (collect or doctor.collect)()
    toolkit = report.get("toolkit") or {}
    return {
        "system": {
            "platform": sys.platform,
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "gpus": report.get("gpus", []),
        "gpu_source": report.get("gpu_source"),
        "unsupported_accelerators": report.get("unsupported_accelerators", []),
        "engines": [{k: e.get(k) for k in ("name", "answers", "version")} for e in report.get("engines", [])],
        "nvidia_container_toolkit": {
            "nvidia_ctk": toolkit.get("nvidia_ctk"),
            "runtime": bool(toolkit.get("runtime")),
            "cdi_specs": len(toolkit.get("cdi_specs") or []),
        },
        "memory": report.get("memory"),
        "verdict": report.get("verdict", []),
    }


def _read_manifest(run: Path) -> dict[str, Any]:
    if not (run / "manifest.json").is_file():
        hint = (
            "a pipeline workdir has no manifest: share the benchmark runs, or attach stages/*.json"
            if (run / "pipeline.json").is_file()
            else "give a run directory that `invoke benchmark` or `invoke reproduce` created"
        )
        raise UserError("not a run directory (no manifest.json)", source=str(run), fix=hint)
    for name in (*AS_IS, RECORDS):  # what is packed byte for byte: the run's own files, never another's
        check_file(run, name)
    manifest = read_json(run / "manifest.json")
    if not isinstance(manifest, dict):
        raise UserError("manifest.json is not a JSON object", source=str(run))
    return manifest


def top_folder(run: Path, manifest: Mapping[str, Any]) -> str:
    """The archive's top folder: the run id (the folder's name when the manifest has none), in the run id's form —
    a planted `../x` or `/abs` would make the bundle's members land outside the folder it is unpacked in."""
    if "run_id" in manifest:
        return check_run_id(manifest["run_id"], source=str(run / "manifest.json"))
    return check_run_id(Path(os.path.abspath(run)).name, source=str(run), field="the run directory's name")


# The bundle is one format, a gzip'd tar (`tar xzf`), so its name says so; a name that says another format (a .zip
# that no zip tool opens) is refused rather than written.
SUFFIXES = (".tar.gz", ".tgz")
_OTHER_SUFFIXES = (".tar.bz2", ".tar.xz", ".tar.zst", ".tar", ".zip", ".gz", ".tbz2", ".txz", ".7z")


def _check_suffix(output: Path) -> None:
    name = output.name
    if name.lower().endswith(SUFFIXES):
        return
    stem = next((name[: -len(s)] for s in _OTHER_SUFFIXES if name.lower().endswith(s)), name) or "bundle"
    raise UserError(
        "the bundle is a gzip'd tar archive, and this name does not end .tar.gz or .tgz",
        field="--output",
        value=str(output),
        fix=f"name it {output.with_name(stem + '.tar.gz')} (unpack with tar xzf)",
    )


def _check_output(run: Path, output: Path) -> None:
    check_output_path(output, "--output")
    if output.exists() or output.is_symlink():
        raise UserError(
            "the bundle already exists", field="--output", value=str(output), fix="choose a new file name"
        )
    if not output.parent.is_dir():
        raise UserError(
            "the bundle's folder does not exist", field="--output", value=str(output.parent), fix="create it"
        )
    if output.resolve().is_relative_to(run.resolve()):
        raise UserError(
            "the bundle must not be written inside the run directory (a run is never modified)",
            field="--output",
            value=str(output),
            fix="write it next to the run, e.g. --output bundle.tar.gz",
        )
    _check_suffix(output)


def _other_files(run: Path, packed: set[str]) -> list[str]:
    """Every file of the run not packed as such, relative to the run, sorted."""
    found = []
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run).as_posix()
        if path.is_file() and not path.is_symlink() and rel not in packed and path.name not in SKIP:
            found.append(rel)
    return found


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def pack(
    run: Path | str,
    output: Path | str,
    *,
    include_text: bool = False,
    keep_paths: bool = False,
    collect: Callable[[], dict[str, Any]] | None = None,
    home: str | None = None,
) -> Bundle:
    """Write the bundle of `run` to `output` (a new file); nothing in the run directory changes. The host's paths
    are rewritten unless `keep_paths` (module docstring); `home` defaults to the packing user's."""
    run, output = Path(run), Path(output)
    if not run.is_dir():
        raise UserError("no such run directory", source=str(run), fix="give the path of a run directory")
    manifest = _read_manifest(run)
    top = top_folder(run, manifest)
    _check_output(run, output)
    paths = None if keep_paths else HostPaths.for_run(run, manifest, home)
    rewritten: dict[str, int] = {}

    def json_member(name: str, data: bytes) -> bytes:
        if paths is None:
            return data
        data, rewritten[name] = paths.member(data)
        return data

    members: dict[str, bytes] = {}
    for name in AS_IS:
        if (run / name).is_file():
            members[name] = json_member(name, (run / name).read_bytes())
    members["config.json"] = json_member("config.json", _dumps(manifest.get("config")))
    kept = torn = 0
    removed: set[str] = set()
    if (run / RECORDS).is_file():
        before = paths.count if paths else 0
        members[RECORDS], kept, removed, torn = _records(run / RECORDS, include_text, paths)
        if paths is not None:
            rewritten[RECORDS] = paths.count - before
    others = _other_files(run, set(AS_IS) | {RECORDS})
    if include_text:
        for rel in others:
            members[rel] = (run / rel).read_bytes()
    left_out = [] if include_text else others
    worker = _json_or_none(members.get("worker.json"))
    members["hardware.json"] = json_member(
        "hardware.json",
        _dumps(
            {
                "run": manifest.get("hardware"),
                "worker": (worker or {}).get("hardware"),
                "packing_host": host_report(collect),
            }
        ),
    )
    counts = None if paths is None else {name: n for name, n in sorted(rewritten.items()) if n}
    bundle = Bundle(output, [], kept, sorted(removed), left_out, torn, include_text, counts)
    members["SHARE.json"] = _dumps(
        {
            "schema_version": 1,
            "run_id": top,
            "status": manifest.get("status"),
            "packed_at": now(),
            "packed_by": f"draftscope {__version__}",
            "include_text": include_text,
            "records": {"kept": kept, "fields_removed": sorted(removed), "incomplete_lines_left_out": torn},
            "left_out": left_out,
            "paths": {
                "kept": paths is None,
                "rewritten": sum((counts or {}).values()),
                "members": counts or {},
                "rule": (
                    "kept as recorded (--keep-paths)"
                    if paths is None
                    else f"absolute host paths: {RUN_MARK}/… inside the run directory, {HOME_MARK}/… under the"
                    f" home directory, {ELIDED}/NAME elsewhere; container paths, relative paths and the files"
                    " added by --include-text are as recorded"
                ),
            },
            "note": (
                "text included: prompts and generated tokens are in this bundle"
                if include_text
                else "prompt text, generated text and generated token ids are not in this bundle"
            ),
        }
    )
    names = sorted(members)
    sums = "".join(f"{hashlib.sha256(members[n]).hexdigest()}  {n}\n" for n in names)
    members["SHA256SUMS"] = sums.encode()
    bundle.files = [*names, "SHA256SUMS"]
    _write_archive(output, top, members, bundle.files)
    return bundle


def _json_or_none(data: bytes | None) -> Any:
    try:
        return parse_json(data, "member") if data else None
    except UserError:
        return None


def _check_member(name: str) -> None:
    """A member's name is relative, without `..` or empty parts: unpacked, it stays in the top folder."""
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in name:
        raise UserError("would be packed outside the bundle's top folder", field="member", value=name)


def _write_archive(output: Path, top: str, members: Mapping[str, bytes], order: list[str]) -> None:
    """A deterministic .tar.gz, created exclusively; a failure removes the partial file."""
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError("the bundle already exists", field="--output", value=str(output)) from None
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in order:
                _check_member(name)
                data = members[name]
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mode, info.mtime = len(data), ARCHIVE_MODE, 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    except BaseException:
        output.unlink(missing_ok=True)
        raise
