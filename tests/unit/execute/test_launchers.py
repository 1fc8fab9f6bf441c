"""The launcher interface without a planner and without a cluster: the registry names the launchers, the local one runs
the work here, the Slurm one runs a planner's submission hooks in their documented order (and undoes its part when
a step fails), the in-job side is the Slurm launcher's inside a job and a plain one outside, and a chain of stages
stops at the first that did not complete however it ran. Slurm's commands are the one thing faked (`client`): the
real ones are exercised by tests/slurm."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.execute import injob, options, registry
from draftscope.execute.outcomes import StageOutcome, in_order
from draftscope.execute.plan import InJob, Job, JobChain, Resources
from draftscope.execute.slurm import client
from draftscope.execute.slurm import node as slurm_node
from draftscope.execute.slurm.states import JobState


def test_the_registry_names_every_launcher_and_refuses_others():
    assert registry.NAMES == ("local", "slurm")
    assert registry.get("local").node is None and registry.get("slurm").node is slurm_node
    with pytest.raises(UserError, match="unknown executor 'pbs'") as refused:
        registry.get("pbs")
    assert refused.value.field == "--executor" and "local, slurm" in refused.value.fix
    with pytest.raises(UserError, match="submits no jobs"):
        registry.batch("local")
    # The option table and the flag checks keep their own list (the command line starts without the launchers).
    assert options.EXECUTORS == registry.NAMES


@dataclass
class Work:
    """A planner's work, recording which hooks ran."""

    folder: Path
    calls: list[str] = field(default_factory=list)
    fail_at: str | None = None
    order = None
    resume = "look again later"

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_at:
            raise UserError(f"{name} failed")

    def run_here(self, *, argv, say):
        self._call("run_here")
        return "here"

    def dry_run_here(self):
        return ["# here"]

    @property
    def ledger(self) -> Path:
        return self.folder / "jobs.json"

    def chain(self) -> JobChain:
        job = Job(
            key="only",
            stage="work",
            kind="step",
            name="ex-only",
            resources=Resources(cpus_per_task=1),
            run=InJob("example.kit", "go"),
            script=self.folder / "only.sbatch",
            log=self.folder / "only-%j.out",
            chdir=self.folder,
            fields={"resources": ("--size", ""), "time": ("--limit", "")},
        )
        return JobChain(runtime="local", python="/opt/py", jobs=(job,))

    def preflight(self):
        self._call("preflight")

    def jobs(self, say):
        self._call("jobs")
        return self.chain()

    def dry_run(self, executor):
        return [f"# dry run for {executor}"], self.chain()

    def write(self, chain, argv):
        self._call("write")

    def discard(self):
        self.calls.append("discard")

    def announce(self, submitted):
        self._call("announce")
        return f"submitted {submitted[0].job_id}"

    def poll(self):
        return 0.01

    @contextlib.contextmanager
    def following(self, say):
        self._call("following")
        yield
        self.calls.append("followed")

    def outcome(self, submitted, say):
        self._call("outcome")
        return [(s.job_id, s.status) for s in submitted]


@pytest.fixture
def slurm(monkeypatch):
    """Slurm's commands as a cluster that queues every job and finds it COMPLETED when asked."""
    asked: list[list[str]] = []
    monkeypatch.setattr(client, "require", lambda command="sbatch": command)
    monkeypatch.setattr(client, "test_only", lambda script, **kw: asked.append(["sbatch", "--test-only"]))

    def submit(script, *, dependency, **kw):
        asked.append(["sbatch", str(script)])
        return "41"

    monkeypatch.setattr(client, "submit", submit)
    monkeypatch.setattr(client, "show", lambda job_id: [JobState(job_id, "COMPLETED", exit_code="0:0")])
    monkeypatch.setattr(client, "cancel", lambda ids: asked.append(["scancel", *ids]))
    return asked


def test_the_local_launcher_runs_the_work_here(tmp_path):
    work = Work(tmp_path)
    local = registry.get("local")
    assert local.launch(work, argv=["x"], say=print) == "here" and work.calls == ["run_here"]
    assert local.dry_run_lines(work) == ["# here"]


def test_the_slurm_launcher_runs_the_planners_hooks_in_order(tmp_path, slurm):
    work, said = Work(tmp_path), []
    outcome = registry.get("slurm").launch(work, argv=["invoke", "x"], say=said.append)
    assert work.calls == ["preflight", "jobs", "write", "announce", "following", "followed", "outcome"]
    assert outcome == [("41", "completed")] and said[0] == "submitted 41"
    assert [a[0] for a in slurm] == ["sbatch", "sbatch"] and (tmp_path / "only.sbatch").is_file()
    assert (tmp_path / "jobs.json").is_file()  # the ledger


def test_a_failed_submission_is_undone_and_a_failure_after_it_cancels_the_jobs(tmp_path, slurm, monkeypatch):
    def refused(script, **kw):
        raise UserError("Slurm refused job only")

    with monkeypatch.context() as m:
        m.setattr(client, "submit", refused)
        work = Work(tmp_path)
        with pytest.raises(UserError, match="refused"):
            registry.get("slurm").launch(work, argv=[], say=print)
        assert work.calls[-1] == "discard"
    work = Work(tmp_path / "second", fail_at="announce")
    with pytest.raises(UserError, match="announce failed"):
        registry.get("slurm").launch(work, argv=[], say=print)
    assert slurm[-1] == ["scancel", "41"] and "following" not in work.calls


def test_a_dry_run_prints_one_jobs_submission_bare(tmp_path):
    lines = registry.get("slurm").dry_run_lines(Work(tmp_path))
    assert lines[0] == "# dry run for slurm" and f"# ===== {tmp_path}/only.sbatch" in lines
    assert lines[-2:] == ["# ===== submission", f"sbatch --parsable {tmp_path}/only.sbatch"]


def test_the_in_job_side_is_the_slurm_launchers_in_a_job_and_plain_outside(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_NNODES", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    node = injob.here()
    assert node.name == "slurm" and not node.in_job()
    assert (node.job_id(), node.spread()) == (None, ("1", "0", "draftscope"))
    assert node.record_entry(shards=2) == {"slurm": {"job_id": "none", "nodes": None, "shards": 2}}
    monkeypatch.setenv("SLURM_JOB_ID", "13")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    node = injob.here()
    assert node.in_job() and (node.job_id(), node.own_id(), node.array_job_id()) == ("12_1", "13", "12")
    assert node.script_name("regen") == "regen.sbatch"


def test_a_chain_of_stages_stops_at_the_first_that_did_not_complete():
    ends = {"a": "completed", "b": "skipped", "c": "timed_out", "d": "completed"}
    seen: list[str] = []

    def run(stage: str) -> StageOutcome:
        seen.append(stage)
        return StageOutcome(stage, ends[stage])

    assert [o.status for o in in_order(ends, run)] == ["completed", "skipped", "timed_out"]
    assert seen == ["a", "b", "c"]  # d neither run nor claimed
