"""Run directories: created exclusively, never overwritten; a manifest with a status lifecycle.

Layout of a run directory:

    manifest.json   what ran, frozen config, input hashes, images, hardware, versions, status (+ reason)
    records.jsonl   one JSON object per line, flushed per record (survives a kill)
    summary.json    written last; the run is `completed` only after every artifact validates
    logs/           captured output of each step
    inputs/         copies of the inputs (prompts), so a run can be reproduced from its directory alone
    .supervisor     while the run is unfinished: the lock its supervisor holds (who, where, which step), so that a
                    run whose supervisor was killed outright (SIGKILL, the OOM killer, a crash) can be told from a
                    live one and finished by `invoke recover`; removed once the final status is written

Over ~400 lines on purpose: creation, the status lifecycle and supervision share one manifest and one lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock, so a run's supervisor holds no lock there
    fcntl = None

from draftscope.core import schema as schemas
from draftscope.core.errors import UserError
from draftscope.core.jsonio import JsonlAppender, atomic_write_json, parse_json, read_json, sha256_file
from draftscope.core.layout import BATCH_SUFFIX, CONFIG_SCHEMAS, MANIFEST, RECORDS, SUMMARY, slurm_folder_of  # noqa: F401  (re-exported: the run's file names)
from draftscope.core.outputs import check_output_path
from draftscope.core.provenance import command_line, kit_info, now
from draftscope.core.untrusted import check_file
from draftscope.core.validate import validate_run

# Space set aside at creation and given back right before the final summary and status are written, so that a
# disk filled during the run still has room to record how the run ended.
RESERVE = ".space-reserve"
RESERVE_BYTES = 1 << 20
SUPERVISOR = ".supervisor"


STATUSES = ("created", "running", "completed", "failed", "timed_out", "interrupted")
FINAL = frozenset({"completed", "failed", "timed_out", "interrupted"})
# Which status may follow which. A final status is final: a finished run is never reopened.
TRANSITIONS: Mapping[str, frozenset[str]] = {
    "created": frozenset({"running", "failed", "interrupted", "timed_out"}),
    "running": frozenset(FINAL),
    **{s: frozenset() for s in FINAL},
}


@dataclass(frozen=True)
class InputFile:
    name: str
    path: Path
    sha256: str | None = (
        None  # the hash of the content checked before the run (a file edited since is refused)
    )
    source: Mapping[str, Any] | None = None  # where a prompt set comes from (its file's `source`), recorded


def describe_input(item: InputFile) -> dict[str, Any]:
    path = Path(item.path)
    if not path.is_file():
        raise UserError("input file not found", field=item.name, value=str(path), fix="check the path")
    digest = sha256_file(path)
    if item.sha256 is not None and digest != item.sha256:
        raise UserError(
            "the input file changed after it was checked (edited while the run was being set up)",
            field=item.name,
            value=str(path),
            fix="start the run again once the file is no longer being edited",
        )
    described = {"name": item.name, "path": str(path), "sha256": digest, "bytes": path.stat().st_size}
    if item.source is not None:
        described["source"] = dict(item.source)
    return described


def check_run_name(path: Path) -> None:
    """The folder's name becomes the manifest's `run_id`: check it before anything is created."""
    pattern = schemas.get_schema("run-manifest")["properties"]["run_id"]["pattern"]
    if re.fullmatch(pattern, path.name) is None:
        raise UserError(
            "a run directory's name must start with a letter or digit and hold only letters, digits, '.', '_' "
            "and '-' (at most 128 characters): it becomes the run id",
            field="--output",
            value=path.name,
            fix="choose a name like runs/tiny-plain-1",
        )


def _write_reserve(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # Real blocks, not a sparse file: only allocated space can be given back.
        os.write(fd, bytes(RESERVE_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)


class RunDir:
    """A run directory and its manifest. Use `RunDir.create` for a new run, `RunDir.open` for an existing one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.supervision: Supervision | None = None  # held by the process that created the run

    # -- creation ---------------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        kind: str,
        config: Mapping[str, Any],
        inputs: Iterable[InputFile] = (),
        argv: list[str] | None = None,
        software: Mapping[str, Any] | None = None,
        copy_inputs: bool = True,
    ) -> RunDir:
        """Create `path` exclusively and write the first manifest (status `created`).

        An existing path — file, directory or link, empty or not — is refused and left untouched.
        """
        path = Path(path)
        if kind in CONFIG_SCHEMAS:
            schemas.check(dict(config), CONFIG_SCHEMAS[kind], "config")
        check_run_name(path)
        check_output_path(path, "--output")  # a parent that is a file, read-only, /proc, a link loop: refused
        described = [describe_input(i) for i in inputs]  # fail on bad input before creating anything
        if not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path)  # atomic: exactly one of two concurrent creators succeeds
        except FileExistsError:
            raise UserError(
                "the output directory already exists; runs are never overwritten or merged",
                field="--output",
                value=str(path),
                fix="choose a new --output path",
            ) from None
        supervision: Supervision | None = None
        try:
            # Locked before the first manifest is written: an unfinished run always has had an owner.
            supervision = Supervision.take(path)
            run = cls._populate(path, kind, config, described, argv, software, copy_inputs)
            run.supervision = supervision
            return run
        except BaseException as exc:
            # This call created the folder, so it may remove it: a run that could not be set up leaves nothing.
            if supervision is not None:
                supervision.end()
            shutil.rmtree(path, ignore_errors=True)
            if isinstance(exc, OSError):
                raise UserError(
                    f"the run directory could not be set up: {exc.strerror or exc}",
                    field="--output",
                    value=str(path),
                    fix="free disk space or choose another --output",
                ) from None
            raise

    @classmethod
    def _populate(
        cls,
        path: Path,
        kind: str,
        config: Mapping[str, Any],
        described: list[dict[str, Any]],
        argv: list[str] | None,
        software: Mapping[str, Any] | None,
        copy_inputs: bool,
    ) -> RunDir:
        run = cls(path)
        _write_reserve(path / RESERVE)
        (path / "logs").mkdir()
        if copy_inputs and described:
            (path / "inputs").mkdir()
            for item in described:
                target = path / "inputs" / Path(item["path"]).name
                shutil.copyfile(item["path"], target)
                # From here on the run reads only this copy: it must be what was hashed.
                if sha256_file(target) != item["sha256"]:
                    raise UserError(
                        "the input file changed while it was copied into the run directory",
                        field=item["name"],
                        value=item["path"],
                        fix="start the run again once the file is no longer being edited",
                    )
        stamp = now()
        manifest = {
            "schema_version": 1,
            "kind": kind,
            "run_id": path.name,
            "status": "created",
            "reason": None,
            "created_at": stamp,
            "updated_at": stamp,
            "started_at": None,
            "finished_at": None,
            "kit": kit_info(),
            "command_line": command_line(argv),
            "config": dict(config),
            "inputs": described,
            "images": [],
            "hardware": None,
            "software": dict(software or {}),
            "steps": [],
            "notes": [],
        }
        run.write_manifest(manifest)
        return run

    def input_copy(self, name: str) -> Path:
        """The run's own copy of its input `name` (what the run reads after creation, never the user's file, which
        may be edited or deleted meanwhile)."""
        entries = [i for i in self.manifest()["inputs"] if i["name"] == name]
        if not entries:
            raise UserError(f"the manifest records no input '{name}'", source=str(self.manifest_path))
        return self.path / "inputs" / Path(entries[0]["path"]).name

    def release_reserve(self) -> None:
        """Give back the space set aside at creation (before the final summary and status are written)."""
        (self.path / RESERVE).unlink(missing_ok=True)

    @classmethod
    def open(cls, path: Path) -> RunDir:
        path = Path(path)
        if not (path / MANIFEST).is_file():
            raise UserError(
                "not a run directory (no manifest.json)",
                source=str(path),
                fix="give the folder a benchmark or pipeline run created",
            )
        return cls(path)

    # -- manifest ---------------------------------------------------------------------------------------

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def manifest(self) -> dict[str, Any]:
        return read_json(self.manifest_path)

    def write_manifest(self, manifest: Mapping[str, Any]) -> None:
        schemas.check(manifest, "run-manifest", str(self.manifest_path))
        atomic_write_json(self.manifest_path, manifest)

    def update(self, **fields: Any) -> dict[str, Any]:
        manifest = self.manifest()
        manifest.update(fields)
        manifest["updated_at"] = now()
        self.write_manifest(manifest)
        return manifest

    def set_status(self, status: str, reason: str | None = None) -> dict[str, Any]:
        """Move the run along its lifecycle; a final status needs a reason unless it is `completed`."""
        manifest = self.manifest()
        current = manifest["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        if status not in TRANSITIONS[current]:
            raise UserError(f"a run in status '{current}' cannot become '{status}'", source=str(self.path))
        if status in FINAL - {"completed"} and not reason:
            raise ValueError(f"status {status!r} needs a reason")
        stamp = now()
        manifest.update(status=status, reason=None if status == "completed" else reason, updated_at=stamp)
        if status == "running":
            manifest["started_at"] = stamp
        if status in FINAL:
            manifest["finished_at"] = stamp
        self.write_manifest(manifest)
        if status in FINAL and self.supervision is not None:
            self.supervision.end()
            self.supervision = None
        return manifest

    def note(self, text: str) -> None:
        manifest = self.manifest()
        manifest.setdefault("notes", []).append(text)
        self.update(notes=manifest["notes"])

    # -- artifacts --------------------------------------------------------------------------------------

    def records(self) -> JsonlAppender:
        return JsonlAppender(self.path / RECORDS)

    def append_record(self, appender: JsonlAppender, record: Mapping[str, Any]) -> None:
        schemas.check(dict(record), "record", str(self.path / RECORDS))
        appender.append(dict(record))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Write summary.json with `records_sha256`, the hash of records.jsonl as it is now (core/integrity.py)."""
        if (self.path / RECORDS).is_file():
            summary = {**summary, "records_sha256": sha256_file(self.path / RECORDS)}
        schemas.check(dict(summary), "summary", str(self.path / SUMMARY))
        atomic_write_json(self.path / SUMMARY, summary)

    def complete(self) -> dict[str, Any]:
        """Mark the run completed, but only once every artifact validates against its schema."""
        report = validate_run(self.path, final=True)
        if not report.ok:
            raise UserError(
                f"the run cannot be marked completed: {report.first_failure()}", source=str(self.path)
            )
        return self.set_status("completed")


# -- supervision ------------------------------------------------------------------------------------------


class Supervision:
    """The creating process's exclusive lock on `<run>/.supervisor` (flock: the kernel drops it when the process
    dies, however it dies; over NFS it is a POSIX lock the server drops too). The file says who holds it and which
    step runs, for `invoke recover` and for people. Where flock does not exist (Windows) nothing is locked and a
    run's liveness reads as unknown."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self._fd = path, fd
        self._info: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "since": now()}

    @classmethod
    def take(cls, run: Path) -> Supervision:
        path = Path(run) / SUPERVISOR
        if fcntl is None:
            return cls(path, None)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
        supervision = cls(path, fd)
        supervision._write()
        return supervision

    @classmethod
    def adopt(cls, run: Path) -> Supervision:
        """Take over the lock of a run whose supervisor is gone (`invoke recover`); refused while anyone holds it."""
        path = Path(run) / SUPERVISOR
        if fcntl is None:
            return cls(path, None)
        try:
            # No link followed, no blocking on a named pipe: the lock file is the run's own, and it is written.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise UserError(
                f"the supervisor lock cannot be opened: {exc.strerror}",
                source=str(path),
                fix="it must be a regular file of the run (not a link)",
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UserError(
                "the supervisor lock is not a regular file",
                source=str(path),
                fix="remove it and pass --force",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                "another process holds the run's supervisor lock (its supervisor, or a second recover)",
                source=str(path),
                fix="let it finish; run `invoke validate` on the run afterwards",
            ) from None
        supervision = cls(path, fd)
        # Keep what the dead supervisor wrote (a failed recovery leaves it for the next attempt).
        supervision._info = {**(_lock_info(fd) or supervision._info), "recovering": os.getpid()}
        supervision._write()
        return supervision

    @property
    def info(self) -> dict[str, Any]:
        """What the lock file says: pid, host, since, the step and where it runs, how the run is stopping."""
        return dict(self._info)

    def stopping(self, why: str) -> None:
        """Record how the run is being stopped (a signal, and later what kept it from finishing): the lock file
        then tells the true story if the supervisor cannot write the final status."""
        self._info["stopping"] = {"why": why, "at": now()}
        self._write()

    def step(self, name: str, **where: Any) -> None:
        """Record the step that now runs and where it can be found (`pgid`, or `engine` and `container`)."""
        self._info["step"] = {"name": name, **where}
        self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        data = (json.dumps(self._info, sort_keys=True) + "\n").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def end(self) -> None:
        """The final status is written: the file goes, then the lock."""
        self.path.unlink(missing_ok=True)
        self.release()

    def release(self) -> None:
        """Let go of the lock, the file kept: the run stays unfinished, to be looked at again."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class Liveness:
    """`state`: `finished` (a final status), `live` (its supervisor holds the lock), `gone` (nobody holds it: the
    supervisor died without recording an end) or `unknown` (no lock file: a run from a kit before this check, or a
    platform without flock). `info`: what the lock file says (pid, host, since, step)."""

    state: str
    info: Mapping[str, Any]

    def describe(self) -> str:
        """A sentence about the run's supervisor."""
        who = f"pid {self.info.get('pid')} on {self.info.get('host')}" if self.info.get("pid") else "unknown"
        step = (self.info.get("step") or {}).get("name")
        during = f" during step '{step}'" if step else ""
        return {
            "finished": "the run has finished",
            "live": f"the run is being recovered by pid {self.info['recovering']}"
            if self.info.get("recovering")
            else f"the run is running, supervised by {who}{during}",
            "gone": f"the run's supervisor ({who}) is gone without recording an end{during} — killed by SIGKILL, "
            "the OOM killer or a crash",
            "unknown": "the run is unfinished, and whether its supervisor lives cannot be told (no supervisor lock)",
        }[self.state]


def _lock_info(fd: int) -> dict[str, Any]:
    """What a lock file says, when it is a JSON object; {} otherwise (its fields are checked where they are used)."""
    try:
        return parse_json(os.pread(fd, 1 << 16, 0) or b"{}", "lock file", expect=dict)
    except (UserError, OSError):
        return {}


def liveness(run: Path, status: str | None = None) -> Liveness:
    """Whether an unfinished run still has a supervisor. Takes the lock for an instant when nobody holds it."""
    run = Path(run)
    if status is None:
        check_file(run, MANIFEST)  # a named pipe would hang the reader
        manifest = read_json(run / MANIFEST)
        status = manifest.get("status") if isinstance(manifest, dict) else None
    if status in FINAL:
        return Liveness("finished", {})
    path = run / SUPERVISOR
    if fcntl is None:
        return Liveness("unknown", {})
    # No link followed, no blocking on a named pipe: the run directory may be someone else's, or planted.
    flags = os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDWR | flags)
    except FileNotFoundError:
        return Liveness("unknown", {})
    except OSError:
        # A run someone else owns, or on read-only storage: flock works on a read-only descriptor too.
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError:
            return Liveness("unknown", {})
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Liveness("unknown", {})
        info = _lock_info(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Liveness("live", info)
        return Liveness("gone", info)
    finally:
        os.close(fd)  # drops the lock if this call took it
