"""Commands on existing run directories: `validate` (every artifact against its schema) and `recover` (finish the
record of a run whose supervisor was killed) (RUNS_TASKS)."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit

from draftscope.bench.recover import recover as finish_run
from draftscope.cli.command import command
from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable
from draftscope.core.rundir import liveness
from draftscope.pipeline.options import PIPELINE

RUN_DIR = Option("run_dir", "the run directory", positional=True)
VALIDATE = OptionTable.of(RUN_DIR).changed("run_dir", help="the run directory (or pipeline workdir) to check")
RECOVER = OptionTable.of(
    OptionTable.of(RUN_DIR).changed("run_dir", help="the run directory whose supervisor was killed"),
    PIPELINE.only("force").changed("force", help="skip the safety checks"),
)


@command(table=VALIDATE)
def validate(c, **values):
    """Validate every artifact of a run directory or pipeline workdir.

    Validate every artifact of a run directory, or of a pipeline workdir, against its schema (a workdir's
    recorded outputs re-hashed too): one verdict line per file."""
    # lazy: ops.validate imports the stage registry (every stage); the command line starts without it
    from draftscope.ops.validate import validate_path

    run_dir = values["run_dir"]
    report = validate_path(run_dir)
    for verdict in report.verdicts:
        print(verdict.line())
    line = _liveness_line(run_dir)
    if line:
        print(line)
    if not report.ok:
        failed = sum(not v.ok for v in report.verdicts)
        raise Exit(f"error: {run_dir}: {failed} of {len(report.verdicts)} file(s) failed validation", code=1)
    print(f"{run_dir}: all {len(report.verdicts)} file(s) valid")


def _liveness_line(run_dir: str) -> str | None:
    """A line about an unfinished run's supervisor, for `validate`: whether it lives, and how to finish its record."""
    try:
        state = liveness(Path(run_dir))
    except (UserError, OSError):
        return None  # no readable manifest: the verdicts say so
    if state.state == "finished":
        return None
    hint = f"; `invoke recover {run_dir}` finishes its record" if state.state == "gone" else ""
    return f"note: {state.describe()}{hint}"


@command(table=RECOVER)
def recover(c, **values):
    """Finish the record of a run whose supervisor was killed outright.

    Finish the record of a run whose supervisor was killed outright (SIGKILL, the OOM killer, a crash): stop
    what its step left running, cut a torn last record, write the summary from the records kept and the status
    `interrupted` with the reason. A live or finished run is refused."""
    run_dir = values["run_dir"]
    manifest = finish_run(Path(run_dir), force=values["force"])
    print(f"{run_dir}: {manifest['status']}: {manifest['reason']}")


RUNS_TASKS = (validate, recover)
