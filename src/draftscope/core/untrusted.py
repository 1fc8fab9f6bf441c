"""What a run directory says is data, never an instruction.

A run directory travels: it is shared, attached to an issue, copied from another machine, edited by hand. Whoever
made it chose every byte of its manifest, its records and its supervisor lock. So the commands that read one
(`recover`, `validate`, `analyze`, `compare`, `share`, `reproduce`) take from it no program to run, no argv word
that is not checked against a strict form, and no path outside the run:

- a program comes from the kit's own list (`engine_program`): the container engines the kit drives, looked up on
  PATH by the kit's name for them; a lock naming another program (an absolute path, `sh`) is refused;
- a name that becomes a path (the run id: an archive's top folder, a comparison's file name) must have the run id's
  form (`check_run_id`): no `/`, no `..`, no NUL, no newline, at most 128 characters;
- a file of the run is read only when it is a regular file inside the run (`file_problem`): a named pipe would hang
  the reader, a folder or a link loop would crash it, and a link out of the run would read (or, for the commands
  that write into a run, write) someone else's file.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from draftscope.core.errors import UserError

# The container engines the kit drives, by the name the kit gives them (runtime.container uses the same names):
# the program is looked up on PATH under that name, never taken from what a run directory recorded.
ENGINES = ("docker", "podman")
# The run-manifest schema's `run_id` pattern, matched whole (`re.fullmatch`: a `$` would let a final newline in).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RUN_ID_FIX = (
    "a run id holds letters, digits, '.', '_' and '-' (at most 128 characters): restore the recorded one"
)


def engine_program(name: object, *, source: str, field: str, fix: str) -> str | None:
    """The program of the container engine `name` (a kit-known engine only), or None where it is not installed."""
    if not isinstance(name, str) or name not in ENGINES:
        raise UserError(
            f"names a program that is not a container engine the kit drives ({' or '.join(ENGINES)}); "
            "nothing was run",
            source=source,
            field=field,
            value=name,
            fix=fix,
        )
    return shutil.which(name)


def check_run_id(value: object, *, source: str, field: str = "$.run_id") -> str:
    """`value` when it has the run id's form (it names folders and files); a UserError otherwise."""
    if not isinstance(value, str) or RUN_ID.fullmatch(value) is None:
        raise UserError(
            "is not a run id (it would name a folder or a file outside the place meant for it)",
            source=source,
            field=field,
            value=value,
            fix=RUN_ID_FIX,
        )
    return value


def inside(root: Path, path: Path) -> bool:
    """`path`, links resolved, is `root` or under it (links resolved too)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def file_problem(run: Path, rel: str, *, links: bool = True) -> str | None:
    """Why `run/rel` cannot be read as one of the run's files, or None when it can: a regular file inside the run
    (followed through links that stay inside it, when `links`); None too when it does not exist at all."""
    path = Path(run) / rel
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) and not links:
        return f"{rel} is a symbolic link; this command writes into the run and follows no link"
    if not inside(run, path):
        return f"{rel} is a link pointing out of the run directory (to {os.path.realpath(path)})"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # a link loop, a dangling link, no permission
        return f"{rel} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(mode):
        return f"{rel} is {_kind(mode)}, not a file"
    return None


def check_file(run: Path, rel: str, *, links: bool = True) -> None:
    """`file_problem` as a UserError."""
    problem = file_problem(run, rel, links=links)
    if problem:
        raise UserError(
            problem,
            source=str(run),
            fix="restore the run directory from its original (a run's files are regular files inside it)",
        )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
