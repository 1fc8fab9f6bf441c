"""The tiny pipeline's CPU stages as real Slurm jobs (`--executor slurm --runtime local`) on a single-node cluster:
a two-shard regen job array merged by a dependent job, then pretokenize after it (issue #10, acceptance 2 and 3);
with the speculators environment (`.venv-train`, `make train-env`; or DRAFTSCOPE_TRAIN_PYTHON), the end-to-end run
goes on through prepare and a two-task hsextract job array followed by its check job.

- the outputs equal a local run's, byte for byte (regen is greedy; one request at a time keeps the order; the
  hidden-state files the two hsextract tasks wrote, and the check job's summary, are a local hsextract's on the
  same prepared rows);
- a resubmission submits only what is not complete;
- a cancelled job leaves no process behind, and the stage records why; Ctrl-C cancels every submitted job;
- a job past its Slurm time limit marks the stage `timed_out`;
- every sbatch / srun option the kit writes exists in this Slurm, and refusals come before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from support import INVOKE_PIPELINE, ROOT, port_is_free, processes_naming, unavailable

pytest.importorskip("transformers")

pytestmark = pytest.mark.slurm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "chat.jsonl"


def free_ports(count: int) -> int:
    """A base port with `count` consecutive free ports (the shards' servers take base + shard)."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count < 65536 and all(port_is_free(base + i) for i in range(count)):
            return base
    raise AssertionError("no free port block")


def train_python() -> str | None:
    """An interpreter with speculators 0.9.0 and datasets (prepare and hsextract need them; they cap transformers
    below the kit's host environment), as `.ci/run` and `make demo` set one up; None without one."""
    found = os.environ.get("DRAFTSCOPE_TRAIN_PYTHON") or str(ROOT / ".venv-train" / "bin" / "python")
    if not Path(found).is_file():
        return None
    code = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"
    probe = subprocess.run(
        [found, "-c", code, "speculators", "datasets", "draftscope"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return found if probe.returncode == 0 else None


def pipeline_argv(workdir: Path, *args: str, opts: list[str], python: str | None = None) -> list[str]:
    argv = [
        python or sys.executable,
        "-c",
        INVOKE_PIPELINE,
        "pipeline",
        "--preset",
        "tiny",
        "--runtime",
        "local",
        "--workdir",
        str(workdir),
        *args,
    ]
    for opt in opts:
        argv += ["--opts", opt]
    return argv


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def long_chat(path: Path, rows: int = 2000) -> Path:
    """Many rows, so that regen is still running when it is cancelled or reaches its time limit."""
    base = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
    with path.open("w") as handle:
        for k in range(rows):
            handle.write(json.dumps({**base[k % len(base)], "id": f"long-{k:05d}"}) + "\n")
    return path


def leftovers(*needles: str) -> list[str]:
    """Live processes whose command line mentions any of the needles (a workdir, a server's port)."""
    return processes_naming(*needles)


def assert_nothing_left(workdir: Path, ports: list[int], timeout: float = 20) -> None:
    needles = [str(workdir), *(f"--port {p}" for p in ports)]
    deadline = time.monotonic() + timeout
    while leftovers(*needles) or not all(port_is_free(p) for p in ports):
        assert time.monotonic() < deadline, f"left running: {leftovers(*needles)}"
        time.sleep(0.2)


def ledger(workdir: Path) -> dict:
    return read_json(workdir / "slurm" / "jobs.json")


def wait_for_rows(folder: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(p.stat().st_size for p in folder.glob("shards/*/rows.jsonl")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no regenerated rows appeared"
        time.sleep(0.2)


def squeue(job_ids: list[str]) -> str:
    return run(["squeue", "-h", "-j", ",".join(job_ids)], timeout=30).stdout.strip()


# --- a run, compared with a local one, then resubmitted -------------------------------------------------------------


def test_a_sharded_run_matches_a_local_run_and_resubmits_only_what_is_incomplete(cluster, tmp_path):
    port = free_ports(3)  # the Slurm run's two regen shards, and the local run beside them
    opts = ["data.max_rows=12", "regen.concurrency=1", f"regen.base_port={port}", "regen.max_tokens=32"]
    slurm_opts = [
        *opts,
        "slurm.stages.regen.shards=2",
        "slurm.stages.hsextract.shards=2",
        "slurm.poll_interval_s=0.5",
    ]
    # prepare and hsextract need speculators and datasets: with the training environment, the run goes on through
    # a two-task hsextract array (the jobs run the submitting interpreter, so both runs use that one).
    python = train_python()
    stages = "regen,pretokenize,prepare,hsextract" if python else "regen,pretokenize"
    if python is None:
        print("no speculators environment (make train-env): prepare and hsextract are left out")
    local, cluster_dir = tmp_path / "local", tmp_path / "slurm"
    # The local run goes on while the jobs run (mostly one core at a time); its regen server on its own port.
    local_opts = [*opts[:2], f"regen.base_port={port + 2}", *opts[3:]]
    reference = start(pipeline_argv(local, "--stage", "regen,pretokenize", opts=local_opts, python=python))

    started = time.monotonic()
    argv = pipeline_argv(
        cluster_dir, "--stage", stages, "--executor", "slurm", opts=slurm_opts, python=python
    )
    done = run(argv)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"slurm run: {seconds:.1f} s")
    finish(reference)
    hsextract_reference = None
    if python:
        # hsextract's local reference reads the rows the Slurm run prepared (prepare is speculators' own step, not
        # compared here), and runs while the resubmissions below do.
        shutil.copytree(cluster_dir / "prepare", local / "prepare")
        hsextract_reference = start(
            pipeline_argv(local, "--stage", "hsextract", opts=local_opts, python=python)
        )

    # Acceptance 3: the deterministic outputs are the local run's, byte for byte.
    for rel in ("regen/rows.jsonl", "regen/errors.jsonl", "pretokenize/rows.jsonl", "pretokenize/stats.json"):
        assert sha256(cluster_dir / rel) == sha256(local / rel), rel
    summary = read_json(cluster_dir / "regen" / "summary.json")
    assert (summary["input"], summary["ok"], [i["rows"] for i in summary["instances"]]) == (12, 12, [6, 6])

    # The records: the local run's command (so either run skips the other's stage), plus the Slurm job.
    jobs = {j["key"]: j for j in ledger(cluster_dir)["submissions"][-1]["jobs"]}
    assert [j["status"] for j in jobs.values()] == ["completed"] * (6 if python else 3)
    regen, merge, pre = jobs["regen"], jobs["regen.merge"], jobs["pretokenize"]
    assert regen["array"] == "0-1" and sorted(t["job_id"] for t in regen["tasks"]) == [
        f"{regen['job_id']}_0",
        f"{regen['job_id']}_1",
    ]
    assert merge["dependency"] == f"afterany:{regen['job_id']}"
    assert pre["dependency"] == f"afterok:{merge['job_id']}"
    for stage, writer in (("regen", merge["job_id"]), ("pretokenize", pre["job_id"])):
        record = read_json(cluster_dir / "stages" / f"{stage}.json")
        assert problems(record, "stage-record") == [] and record["status"] == "completed"
        assert record["slurm"]["job_id"] == writer
    assert read_json(cluster_dir / "stages" / "regen.json")["slurm"]["array_job_id"] == regen["job_id"]
    for name in (
        f"slurm-regen-{regen['job_id']}_0.out",
        f"slurm-regen-{regen['job_id']}_1.out",
        f"slurm-regen.merge-{merge['job_id']}.out",
        f"slurm-pretokenize-{pre['job_id']}.out",
    ):
        assert (cluster_dir / "logs" / name).is_file(), name
    assert_nothing_left(cluster_dir, [port, port + 1], timeout=5)
    # The records hold a local run's command: a local run in the same workdir skips every stage.
    here = run(pipeline_argv(cluster_dir, "--stage", stages, opts=opts, python=python))
    assert here.returncode == 0, here.stdout + here.stderr
    assert [s for s in stages.split(",") if f"{s}: skipped" not in here.stdout] == [], here.stdout

    # A resubmission of a complete pipeline submits nothing; of a partly complete one, only the rest.
    again = run(argv)
    assert again.returncode == 0, again.stderr
    assert [s for s in stages.split(",") if f"{s}: skipped" not in again.stdout] == [], again.stdout
    assert len(ledger(cluster_dir)["submissions"]) == 1
    (cluster_dir / "stages" / "pretokenize.json").unlink()
    rest = run(
        pipeline_argv(
            cluster_dir, "--stage", "regen,pretokenize", "--executor", "slurm", opts=slurm_opts, python=python
        )
    )
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "regen: skipped" in rest.stdout and re.search(
        r"submitted 1 job\(s\): pretokenize \d+", rest.stdout
    )
    assert sha256(cluster_dir / "pretokenize" / "rows.jsonl") == sha256(local / "pretokenize" / "rows.jsonl")
    if hsextract_reference is not None:
        finish(hsextract_reference)
        check_hsextract_array(local, cluster_dir, jobs)


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err


def check_hsextract_array(local: Path, cluster_dir: Path, jobs: dict) -> None:
    """hsextract ran as a two-task job array writing into one folder, then its check job: the files are a local
    run's, byte for byte, and so is the summary the check job wrote."""
    array, check, prepare = jobs["hsextract"], jobs["hsextract.check"], jobs["prepare"]
    assert array["array"] == "0-1" and array["dependency"] == f"afterok:{prepare['job_id']}"
    assert sorted(t["job_id"] for t in array["tasks"]) == [f"{array['job_id']}_0", f"{array['job_id']}_1"]
    assert check["dependency"] == f"afterany:{array['job_id']}"
    names = sorted(p.name for p in (local / "hidden_states").iterdir())
    assert len(names) == 12 and sorted(p.name for p in (cluster_dir / "hidden_states").iterdir()) == names
    for name in names:
        assert sha256(cluster_dir / "hidden_states" / name) == sha256(local / "hidden_states" / name), name
    assert sha256(cluster_dir / "hsextract" / "summary.json") == sha256(local / "hsextract" / "summary.json")
    # each task took its block of the rows (6 + 6) and wrote its own summary and result
    for shard in (0, 1):
        own = read_json(cluster_dir / "hsextract" / "shards" / str(shard) / "summary.json")
        assert (own["rows"], own["files"]) == (6, 6)
        assert (
            read_json(cluster_dir / "slurm" / "shards" / "hsextract" / f"{shard}.json")["status"]
            == "completed"
        )
        assert (cluster_dir / "logs" / f"slurm-hsextract-{array['job_id']}_{shard}.out").is_file()
    record = read_json(cluster_dir / "stages" / "hsextract.json")
    assert problems(record, "stage-record") == [] and record["status"] == "completed"
    assert record["slurm"]["job_id"] == check["job_id"] and record["slurm"]["array_job_id"] == array["job_id"]
    shown = [a.replace(str(cluster_dir), str(local)) for a in record["argv"]]
    assert shown == read_json(local / "stages" / "hsextract.json")["argv"]  # the local run's command
    assert record["counts"]["written"] == 12 and record["counts"]["shards"] == 2
    assert f"Slurm job array {array['job_id']} of 2 task(s)" in record["notes"][-1]


# --- stopping jobs --------------------------------------------------------------------------------------------------


def test_a_cancelled_job_leaves_no_process_and_the_stage_says_why(cluster, tmp_path):
    port = free_ports(2)
    workdir = tmp_path / "w"
    opts = [
        f"data.chat={long_chat(tmp_path / 'chat.jsonl')}",
        f"regen.base_port={port}",
        "slurm.stages.regen.shards=2",
        "slurm.poll_interval_s=0.5",
    ]
    proc = subprocess.Popen(
        pipeline_argv(workdir, "--stage", "regen,pretokenize", "--executor", "slurm", opts=opts),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_rows(workdir / "regen", proc)
    array = next(j for j in ledger(workdir)["submissions"][-1]["jobs"] if j["key"] == "regen")["job_id"]
    cancelled = run(["scancel", array], timeout=30)
    assert cancelled.returncode == 0, cancelled.stderr
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "regen: interrupted" in err and "was cancelled (scancel)" in err
    assert_nothing_left(workdir, [port, port + 1])
    # The merge job (afterany) recorded the stage; pretokenize (afterok) never ran.
    record = read_json(workdir / "stages" / "regen.json")
    assert record["status"] == "interrupted" and record["reason"].startswith("shard ")
    jobs = {j["key"]: j for j in ledger(workdir)["submissions"][-1]["jobs"]}
    assert {t["state"] for t in jobs["regen"]["tasks"]} == {"CANCELLED"}
    assert (
        jobs["pretokenize"]["status"] == "interrupted"
        and not (workdir / "stages" / "pretokenize.json").exists()
    )
    for shard in (0, 1):  # each task recorded how it ended, or (killed at KillWait first) that it had started
        outcome = read_json(workdir / "slurm" / "shards" / "regen" / f"{shard}.json")
        assert outcome["job_id"] == f"{array}_{shard}" and outcome["status"] in ("interrupted", "running"), (
            outcome
        )
        if outcome["status"] == "interrupted":
            assert "was cancelled (scancel)" in outcome["reason"]


def test_ctrl_c_cancels_every_submitted_job(cluster, tmp_path):
    port = free_ports(1)
    workdir = tmp_path / "w"
    opts = [
        f"data.chat={long_chat(tmp_path / 'chat.jsonl')}",
        f"regen.base_port={port}",
        "slurm.poll_interval_s=0.5",
    ]
    proc = subprocess.Popen(
        pipeline_argv(workdir, "--stage", "regen,pretokenize", "--executor", "slurm", opts=opts),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_rows(workdir / "regen", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "interrupted: cancelling job(s)" in out and "regen: interrupted" in err
    ids = [j["job_id"] for j in ledger(workdir)["submissions"][-1]["jobs"]]
    assert len(ids) == 3 and squeue(ids) == ""  # nothing of the chain queued or running
    assert_nothing_left(workdir, [port])
    # The running shard recorded how it ended; the merge job was cancelled before it could start.
    outcome = read_json(workdir / "slurm" / "shards" / "regen" / "0.json")
    assert outcome["status"] == "interrupted" and "was cancelled (scancel)" in outcome["reason"]
    assert not (workdir / "stages" / "regen.json").exists()


def test_a_job_past_its_time_limit_marks_the_stage_timed_out(cluster, tmp_path):
    """Slurm's limits are whole minutes, checked about every 30 s: this takes 60–90 s."""
    port = free_ports(1)
    workdir = tmp_path / "w"
    opts = [
        f"data.chat={long_chat(tmp_path / 'chat.jsonl', rows=6000)}",
        f"regen.base_port={port}",
        "slurm.stages.regen.time_limit_s=30",
        "slurm.poll_interval_s=1",
    ]
    done = run(
        pipeline_argv(workdir, "--stage", "regen,pretokenize", "--executor", "slurm", opts=opts), timeout=280
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "regen: timed_out" in done.stderr and "Slurm time limit of 00:01:00 reached" in done.stderr
    record = read_json(workdir / "stages" / "regen.json")
    assert record["status"] == "timed_out" and problems(record, "stage-record") == []
    jobs = {j["key"]: j for j in ledger(workdir)["submissions"][-1]["jobs"]}
    assert [t["state"] for t in jobs["regen"]["tasks"]] == ["TIMEOUT"] and jobs["regen"][
        "status"
    ] == "timed_out"
    assert "#SBATCH --time=0-00:01:00" in (workdir / "slurm" / "regen.sbatch").read_text()
    assert_nothing_left(workdir, [port])


# --- what the kit asks of Slurm ---------------------------------------------------------------------------------------


def test_every_option_the_kit_writes_exists_in_this_slurm(cluster):
    """sbatch parses a script's #SBATCH lines before it asks slurmctld anything: an unknown option is refused on
    its own ("unrecognized option"), whatever the cluster then thinks of the resources (no GPU here)."""
    from draftscope.execute.slurm import client
    from draftscope.execute.slurm.script import render
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline import registry
    from draftscope.pipeline.batch import jobs
    from draftscope.pipeline.config import load_pipeline_config
    from draftscope.runtime import get_runtime

    def unrecognized(script: str) -> str:
        done = subprocess.run(
            ["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=30
        )
        return "\n".join(line for line in done.stderr.splitlines() if "unrecognized option" in line)

    assert unrecognized("#!/bin/bash\n#SBATCH --no-such-option=1\ntrue\n")  # the check can fail
    resolved = load_pipeline_config(
        preset="qwen38-27b",
        opts=["time_limits.train=3600", "slurm.mem=64G", "slurm.cpus_per_task=8"],
        overrides={"slurm": {"nodes": 2, "partition": "gpu", "account": "a", "qos": "q"}},
    )
    plan = planning.build(resolved, registry.select("all"), Path("/tmp/w"), "docker")
    jp = jobs.build(plan, get_runtime("docker"), python=sys.executable, fetch=True)
    scripts = [render(jp, j) for j in jp.jobs]
    used = set(re.findall(r"^#SBATCH (--[a-z-]+)", "\n".join(scripts), re.M))
    assert {
        "--array",
        "--gres",
        "--exclusive",
        "--time",
        "--mem",
        "--open-mode",
        "--account",
        "--qos",
    } <= used
    assert [unrecognized(script) for script in scripts] == [""] * len(scripts)
    submit = client.submit_argv("-", "afterok:1")  # the submission's own options, the script on stdin
    done = subprocess.run(
        [*submit[:-1], "--test-only"], input="#!/bin/bash\ntrue\n", capture_output=True, text=True, timeout=30
    )
    assert "unrecognized option" not in done.stderr, done.stderr
    srun_line = next(line for line in "\n".join(scripts).splitlines() if line.startswith("srun "))
    srun_help = run(["srun", "--help"]).stdout
    assert [
        o for o in re.findall(r"(--[a-z-]+)", srun_line) if not re.search(rf"{o}[=\s\[]", srun_help)
    ] == []
    assert run(["scontrol", "show", "hostnames", "gpu[1-2]"]).stdout.split() == [
        "gpu1",
        "gpu2",
    ]  # the head node


def test_slurm_refuses_before_anything_is_written(cluster, tmp_path):
    workdir = tmp_path / "w"
    bad = run(
        pipeline_argv(
            workdir, "--stage", "pretokenize", "--executor", "slurm", "--partition", "nope", opts=[]
        ),
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "--partition: Slurm refused job pretokenize" in bad.stderr and "invalid partition" in bad.stderr
    assert "use one of this cluster's partitions (debug" in bad.stderr
    big = run(
        pipeline_argv(
            workdir,
            "--stage",
            "pretokenize",
            "--executor",
            "slurm",
            opts=["slurm.stages.pretokenize.cpus_per_task=512"],
        ),
        timeout=60,
    )
    assert big.returncode == 2 and "slurm.stages.pretokenize" in big.stderr, big.stderr
    # A GPU preset from a host without GPUs (a login node) gets as far as Slurm, which finds no GPU node here.
    argv = pipeline_argv(
        workdir, "--stage", "regen", "--executor", "slurm", opts=["data.chat=examples/chat.jsonl"]
    )
    argv[argv.index("tiny")] = "qwen38-27b"
    argv[argv.index("local")] = "docker"
    gpu = run(argv, timeout=60)
    assert gpu.returncode == 2 and "Slurm refused job regen" in gpu.stderr, gpu.stderr
    assert "gres" in gpu.stderr.lower() and "slurm.stages.regen" in gpu.stderr
    assert not workdir.exists()


# --- a container started by a job ------------------------------------------------------------------------------------


def sleeper_image(tmp_path: Path, env: dict[str, str]) -> None:
    """A private podman store holding a 2 MB image under the train image's reference: the host's dash, sleep and
    libc, whose entrypoint sleeps whatever the command (the stage's argv is ignored). The shared store is left
    alone; jobs find this one through CONTAINERS_STORAGE_CONF, which sbatch passes on."""
    from draftscope.ops.images import image_reference

    root = tmp_path / "rootfs"
    files = {"/bin/dash": "bin/sh", "/usr/bin/sleep": "usr/bin/sleep"}
    for binary in list(files):
        for line in run(["ldd", binary], timeout=30).stdout.splitlines():
            path = next((w for w in line.split() if w.startswith("/")), None)
            if path:
                files[path] = path.lstrip("/")
    for source, target in files.items():
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        (root / target).write_bytes(Path(source).read_bytes())
        (root / target).chmod(0o755)
    (root / "tmp").mkdir()
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "rootfs.tar"), "."], check=True)
    imported = subprocess.run(
        [
            "podman",
            "import",
            "--change",
            'ENTRYPOINT ["/bin/sh", "-c", "exec /usr/bin/sleep 600", "sh"]',
            str(tmp_path / "rootfs.tar"),
            image_reference("train"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr


def test_a_cancelled_job_removes_its_podman_container(cluster, tmp_path):
    """FACTS: scancel alone leaves a podman container running (conmon leaves the job's process tree)."""
    import shutil

    if shutil.which("podman") is None or shutil.which("catatonit") is None:
        unavailable("needs podman and catatonit (images/local/podman-engine.sh install)")
    store = tmp_path / "store"
    store.mkdir()
    (store / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{store}/graph"\nrunroot = "{store}/runroot"\n'
    )
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(store / "storage.conf")}
    sleeper_image(tmp_path, env)

    def containers() -> list[str]:
        done = subprocess.run(
            ["podman", "ps", "-a", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    workdir = tmp_path / "w"
    argv = pipeline_argv(
        workdir, "--stage", "pretokenize", "--executor", "slurm", opts=["slurm.poll_interval_s=0.5"]
    )
    argv[argv.index("local")] = "podman"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not containers():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job's container did not start"
            time.sleep(0.2)
        (name,) = containers()
        assert name.startswith("ds-w-pretokenize-")
        job = ledger(workdir)["submissions"][-1]["jobs"][0]["job_id"]
        assert run(["scancel", job], timeout=30).returncode == 0
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "pretokenize: interrupted" in err, out + err
        deadline = time.monotonic() + 10
        while containers() or leftovers(name, str(workdir)):
            assert time.monotonic() < deadline, f"left behind: {containers()} {leftovers(name, str(workdir))}"
            time.sleep(0.2)
        record = read_json(workdir / "stages" / "pretokenize.json")
        assert record["status"] == "interrupted" and record["image"]["reference"].endswith(
            "draftscope-train:0.1.0"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(
            ["podman", "rm", "--all", "--force", "--time", "0"], capture_output=True, env=env, timeout=60
        )
