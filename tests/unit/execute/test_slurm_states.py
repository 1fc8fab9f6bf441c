"""Slurm job states → run statuses, and `scontrol show job -o` as Slurm 22.05 prints it (lines captured on the
single-node test cluster: a running job, an array's tasks, a job cancelled for a failed dependency, a timeout)."""

from __future__ import annotations

import pytest

from draftscope.execute.slurm import states
from draftscope.execute.slurm.states import JobState, parse_show_job, stop_cause, summarize

RUNNING = (
    "JobId=2 JobName=job.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 Account=(null) "
    "QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:01 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-30T06:32:49 "
    "AllocNode:Sid=localhost:23890 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 "
    "NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1G,node=1,billing=1 "
    "Command=/tmp/sx/job.sh WorkDir=/tmp/sx StdErr=/tmp/sx/out-2.txt StdIn=/dev/null StdOut=/tmp/sx/out-2.txt Power= "
)
ARRAY = (
    "JobId=7 ArrayJobId=7 ArrayTaskId=1 JobName=wrap JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
    "ExitCode=4:0 RunTime=00:00:03 TimeLimit=UNLIMITED NodeList=vm\n"
    "JobId=10 ArrayJobId=7 ArrayTaskId=0 JobName=wrap JobState=COMPLETED Reason=None Dependency=(null) "
    "ExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED NodeList=vm\n"
)
PENDING_ARRAY = "JobId=12 ArrayJobId=12 ArrayTaskId=0-1 JobName=x JobState=PENDING Reason=None ExitCode=0:0 NodeList=(null)"
NEVER = "JobId=9 JobName=wrap JobState=CANCELLED Reason=DependencyNeverSatisfied ExitCode=0:0 NodeList=(null)"


def test_running_job_fields():
    (job,) = parse_show_job(RUNNING)
    assert (job.job_id, job.state, job.reason, job.exit_code, job.nodes) == (
        "2",
        "RUNNING",
        "None",
        "0:0",
        "vm",
    )
    assert (job.run_time, job.time_limit) == ("00:00:01", "00:01:00")
    assert not job.terminal and job.status is None


def test_array_tasks_are_named_as_squeue_names_them():
    failed, done = parse_show_job(ARRAY)
    assert (failed.job_id, failed.status, done.job_id, done.status) == ("7_1", "failed", "7_0", "completed")
    assert failed.explain() == "job 7_1 failed (exit code 4, on vm)"
    (pending,) = parse_show_job(PENDING_ARRAY)
    assert pending.job_id == "12_[0-1]" and not pending.terminal


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("COMPLETED", "completed"),
        ("TIMEOUT", "timed_out"),
        ("DEADLINE", "timed_out"),
        ("CANCELLED", "interrupted"),
        ("PREEMPTED", "interrupted"),
        ("FAILED", "failed"),
        ("NODE_FAIL", "failed"),
        ("OUT_OF_MEMORY", "failed"),
        ("BOOT_FAIL", "failed"),
        ("PENDING", None),
        ("RUNNING", None),
        ("COMPLETING", None),
        ("SUSPENDED", None),
        ("REQUEUED", None),
    ],
)
def test_state_mapping(state, status):
    assert JobState("1", state).status == status


def test_failures_are_explained_with_slurms_words():
    assert JobState("5", "OUT_OF_MEMORY", "OutOfMemory", "0:125", "gpu3").explain() == (
        "job 5 ran out of memory (OUT_OF_MEMORY) (exit code 0, signal 125, reason OutOfMemory, on gpu3)"
    )
    assert JobState("6", "NODE_FAIL", "NodeDown", "0:0", "gpu4").explain() == (
        "job 6 lost its node (NODE_FAIL) (reason NodeDown, on gpu4)"
    )
    assert JobState("7", "TIMEOUT", "TimeLimit", "0:0", "vm").explain() == (
        "job 7 reached its Slurm time limit (reason TimeLimit, on vm)"
    )


def test_a_job_that_can_never_start_counts_as_not_run():
    pending = JobState("9", "PENDING", "DependencyNeverSatisfied")
    assert pending.dead and pending.status == "interrupted"
    assert "can never start (DependencyNeverSatisfied)" in pending.explain()
    (cancelled,) = parse_show_job(NEVER)
    assert cancelled.status == "interrupted" and cancelled.reason == "DependencyNeverSatisfied"


def test_an_array_ends_with_its_worst_task():
    tasks = [JobState("3_0", "COMPLETED"), JobState("3_1", "TIMEOUT", "TimeLimit"), JobState("3_2", "FAILED")]
    status, reason = summarize(tasks)
    assert status == "failed" and reason.startswith("job 3_2 failed") and "1 more task(s)" in reason
    assert summarize([JobState("3_0", "COMPLETED")]) == ("completed", None)
    assert states.worst(["completed", "interrupted", "timed_out"]) == "timed_out"


def test_why_slurm_stopped_a_running_job():
    # While Slurm stops a job it reads COMPLETING; a time limit shows as Reason=TimeLimit (measured), or a run time
    # at the limit; a scancel as Reason=None.
    limit = JobState("4", "COMPLETING", "TimeLimit", run_time="00:01:06", time_limit="00:01:00")
    assert stop_cause(limit)[0] == "timed_out" and "time limit of 00:01:00" in stop_cause(limit)[1]
    late = JobState("4", "COMPLETING", "None", run_time="00:01:00", time_limit="00:01:00")
    assert stop_cause(late)[0] == "timed_out"
    cancelled = JobState("2", "COMPLETING", "None", run_time="00:00:01", time_limit="00:01:00")
    assert stop_cause(cancelled) == ("interrupted", "job 2 was cancelled (scancel); the step was stopped")
    assert stop_cause(JobState("2", "PREEMPTED", "Preempted"))[1].startswith("job 2 was preempted")
    assert stop_cause(None)[0] == "interrupted"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:01:06", 66),
        ("1-02:00:00", 93600),
        ("05:30", 330),
        ("UNLIMITED", None),
        ("N/A", None),
        (None, None),
    ],
)
def test_slurm_durations(text, seconds):
    assert states.seconds(text) == seconds
