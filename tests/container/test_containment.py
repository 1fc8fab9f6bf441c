"""Containment on a real engine: what a step can do from inside its container.

Each case takes a real step from the kit's planning — the benchmark worker, its fetch step, and pipeline stages of
the tiny preset —
and runs a probe in its place through `ContainerRuntime.run`, so the container gets exactly the flags, mounts,
user and environment the step would get (only the argv differs, and the image is the transformers image, the one
built here). The probe reports, from inside: its user, its capability sets and no_new_privs (/proc/self/status),
what happens when it writes to every mount, to the root filesystem and to its HOME, its cgroup limits as the kernel
enforces them, the kit's installed code, and its network. Planted credentials must arrive by name in the fetch
step only, and appear in no output. The container the kit's argv creates is also inspected (`docker inspect`):
HostConfig's ReadonlyRootfs, Tmpfs, PidsLimit, Memory, MemorySwap and ShmSize, and Config.User.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from draftscope.bench.plan import plan_benchmark
from draftscope.core.platforms import IMAGE_USER
from draftscope.core.presets import load_experiment, size_bytes
from draftscope.runtime import ContainerRuntime, Context
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT, Limits

from containerlib import ROOT, docker
from support import tiny_benchmark

TINY = tiny_benchmark("docker", "--repeats", "1", "--max-new-tokens", "24")

pytestmark = pytest.mark.container

UID = 4321
PROBE = r"""
import errno, hashlib, json, os, socket, sys

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split()[1]

def try_write(target):
    path = target if not os.path.isdir(target) else os.path.join(target, ".probe-write")
    try:
        with open(path, "a") as fh:
            fh.write("")
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    if os.path.isdir(target):
        os.unlink(path)
    return "written"

def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None

def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__

targets = json.loads(sys.argv[1])
ROOT_TARGETS = ("/", "/usr/local", "/var", "/home/draftscope", "/etc/passwd", "/home/draftscope/.profile")
import draftscope
code = os.path.dirname(draftscope.__file__)
report = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cap_eff": status("CapEff"), "cap_prm": status("CapPrm"), "cap_inh": status("CapInh"),
    "cap_amb": status("CapAmb"), "no_new_privs": status("NoNewPrivs"),
    "writes": {t: try_write(t) for t in targets},
    "code": try_write(code), "code_path": code,
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "connect_ip": connect("192.0.2.1", 80),
    "connect_host_gateway": connect("10.0.2.2", 80),
    "dns": connect("example.org", 443),
    "hf_token_sha256": hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest() if "HF_TOKEN" in os.environ else None,
    "other_credentials": sorted(k for k in os.environ if any(w in k for w in ("API_KEY", "SECRET", "PASSWORD"))),
    "home": os.environ.get("HOME"),
    "home_write": try_write(os.makedirs(os.environ["HOME"], exist_ok=True) or os.environ["HOME"]),
    "root_writes": {t: try_write(t) for t in ROOT_TARGETS},
    "limits": {name: read(path) for name, path in (
        ("pids", "/sys/fs/cgroup/pids/pids.max"), ("pids_v2", "/sys/fs/cgroup/pids.max"),
        ("memory", "/sys/fs/cgroup/memory/memory.limit_in_bytes"), ("memory_v2", "/sys/fs/cgroup/memory.max"),
        ("memsw", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"),
        ("swap_v2", "/sys/fs/cgroup/memory.swap.max"))},
    "shm_bytes": os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize,
    "mounts": {p: o for _, p, kind, o, *_ in (l.split() for l in open("/proc/self/mounts")) if p in ("/", "/tmp")},
}
with open(os.path.join(os.environ["PROBE_OUT"], "probe.json"), "w") as fh:
    json.dump(report, fh)
"""


@pytest.fixture
def planted(monkeypatch):
    values = {"HF_TOKEN": "hf_plantedContainment0123456789", "MY_API_KEY": "sk-plantedContainment0123456789"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture
def owned_tmp():
    """A folder the unprivileged test user can traverse (pytest's tmp_path is root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="draftscope-contain-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def probe(step, run: Path, user: tuple[int, int], targets: list[str]) -> dict:
    """Run the probe as `step` would run (same flags, mounts, user, environment) and return its report."""
    runtime = ContainerRuntime("docker")
    # The report goes to the run directory, or for the fetch step (which has none) to the hub cache.
    out = next(m for m in step.mounts if m.target == RUN_MOUNT or not m.read_only)
    swapped = dataclasses.replace(
        step,
        image="transformers",
        argv=("python", "-c", PROBE, json.dumps(targets)),
        env={**step.env, "PROBE_OUT": out.target},
    )
    argv = runtime.argv(swapped, Context(run_dir=run, run_id=run.name, user=user))
    for flag in ("--cap-drop", "--security-opt", "--user", "--read-only", "--memory", "--pids-limit"):
        assert flag in argv
    outcome = runtime.run(swapped, Context(run_dir=run, run_id=run.name, user=user))
    log = (run / "logs" / f"{step.name}.log").read_text() if (run / "logs").is_dir() else ""
    assert outcome.ok, f"{outcome.reason}\n{log[-3000:]}"
    folder = run if out.target == RUN_MOUNT else Path(out.source)
    return json.loads((folder / "probe.json").read_text())


def inspect_created(step, run: Path, user: tuple[int, int]) -> dict:
    """`docker inspect` of the container the kit's own argv makes for `step` (created, not started: `run` → `create`
    in the same argv), then removed."""
    runtime = ContainerRuntime("docker")
    ctx = Context(run_dir=run, run_id=run.name, user=user)
    argv = runtime.argv(dataclasses.replace(step, image="transformers"), ctx)
    assert argv[1] == "run"
    name = argv[argv.index("--name") + 1]
    created = subprocess.run(["docker", "create", *argv[2:]], capture_output=True, text=True, check=False)
    try:
        assert created.returncode == 0, created.stderr
        (info,) = json.loads(docker("inspect", name).stdout)
        return info
    finally:
        docker("rm", "--force", name)


def benchmark_plan(run: Path, cache: Path, monkeypatch, preset: str = "tiny"):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    config = load_experiment(
        "transformers-baseline",
        {"model_preset": preset, "device": "cpu", "runtime": "docker", "prompts": "examples/prompts.json"},
    )
    return plan_benchmark(config, str(run))


def benchmark_step(run: Path, cache: Path, monkeypatch):
    (step,) = [s for s in benchmark_plan(run, cache, monkeypatch).steps if s.name == "benchmark"]
    return step


def fresh_dirs(root: Path, owner: int) -> tuple[Path, Path]:
    run, cache = root / "run", root / "cache"
    (run / "logs").mkdir(parents=True)
    cache.mkdir()
    (cache / "weights.safetensors").write_text("pinned weights\n")
    # Everything owned by `owner`: as the container's user, only the mount's read-only flag can refuse a write.
    for path in (run, run / "logs", cache, cache / "weights.safetensors"):
        os.chown(path, owner, owner)
    return run, cache


def assert_contained(
    report: dict,
    *,
    uid: int,
    writable: set[str],
    readonly: set[str],
    refused: set[str] = frozenset(),
    network: bool = False,
) -> None:
    """`readonly`: refused by the read-only flag itself (EROFS: folders, and files the container's user owns);
    `refused`: files the container's user does not own, where the kernel checks the permission bits first (EACCES)
    and the read-only flag after (EROFS) — either way not written."""
    assert report["uid"] == report["euid"] == uid
    assert uid != 0
    for caps in ("cap_eff", "cap_prm", "cap_inh", "cap_amb"):
        assert int(report[caps], 16) == 0, (caps, report[caps])
    assert report["no_new_privs"] == "1"
    for target in writable:
        assert report["writes"][target] == "written", (target, report["writes"][target])
    for target in readonly:
        assert report["writes"][target] == "EROFS", (target, report["writes"][target])
    for target in refused:
        assert report["writes"][target] in ("EROFS", "EACCES"), (target, report["writes"][target])
    # The root filesystem is read-only: no file can be made in any folder (even the image user's own home), and
    # the image user's own files there refuse writes (EROFS); HOME (on the tmpfs /tmp) is writable.
    writes = report["root_writes"]
    for folder in ("/", "/usr/local", "/var", "/home/draftscope"):
        assert writes[folder] == "EROFS", (folder, writes)
    assert writes["/etc/passwd"] in ("EROFS", "EACCES"), writes
    if uid == IMAGE_USER[0]:
        assert writes["/home/draftscope/.profile"] == "EROFS", writes  # its own file: only the flag refuses
    assert report["code"] == "EROFS", report["code"]
    assert report["home"] == "/tmp/home" and report["home_write"] == "written"
    assert report["mounts"]["/"].split(",")[0] == "ro" and report["mounts"]["/tmp"].split(",")[0] == "rw"
    assert "noexec" not in report["mounts"]["/tmp"].split(",")  # Triton and inductor load kernels from there
    if not network:
        assert report["interfaces"] == ["lo"], report["interfaces"]
        for attempt in ("connect_ip", "connect_host_gateway", "dns"):
            assert report[attempt] != "connected", (attempt, report[attempt])


def assert_limits(report: dict, limits) -> None:
    """The kernel's own view from inside (cgroup v1 or v2), and /dev/shm's size where it is the container's."""
    memory = size_bytes(limits.memory)
    found = report["limits"]
    assert int(found["pids"] or found["pids_v2"]) == limits.pids, found
    assert int(found["memory"] or found["memory_v2"]) == memory, found
    if found["memsw"] is not None:  # v1 with swap accounting: memory + swap
        assert int(found["memsw"]) == memory, found
    if found["swap_v2"] is not None:  # v2: the swap alone
        assert int(found["swap_v2"]) == 0, found


def search(folder: Path, values) -> list[str]:
    hits = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}" for v in values if v.encode() in data]
    return hits


def test_benchmark_worker_as_the_invoking_user(kit_image, owned_tmp, planted, monkeypatch):
    run, cache = fresh_dirs(owned_tmp, UID)
    step = benchmark_step(run, cache, monkeypatch)
    assert not step.network and {m.target: m.read_only for m in step.mounts} == {
        RUN_MOUNT: False,
        CACHE_MOUNT: True,
    }
    report = probe(step, run, (UID, UID), [RUN_MOUNT, CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors", "/"])
    assert_contained(
        report,
        uid=UID,
        writable={RUN_MOUNT},
        readonly={CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors", "/"},
    )
    assert_limits(report, step.limits)
    assert report["shm_bytes"] == size_bytes(step.limits.shm_size)
    assert report["hf_token_sha256"] is None  # a worker that never fetches gets no credential ...
    assert report["other_credentials"] == []  # ... and nothing else credential-like is passed at all
    assert (cache / "weights.safetensors").read_text() == "pinned weights\n"
    assert search(run, planted.values()) == []


def test_benchmark_worker_invoked_as_root_runs_as_the_image_user(kit_image, owned_tmp, planted, monkeypatch):
    """Invoked by root (uid 0, as these tests are), the step runs as the images' user 10001, without capabilities
    and unable to gain any; the root-owned run directory was handed to that user first, so the worker can write
    there; the read-only mounts stay read-only and there is no network."""
    assert os.geteuid() == 0, "this case needs the kit invoked as root"
    run, cache = fresh_dirs(owned_tmp, 0)
    for path in (
        cache,
        cache / "weights.safetensors",
    ):  # the image user's: only the read-only flag can refuse
        os.chown(path, *IMAGE_USER)
    step = benchmark_step(run, cache, monkeypatch)
    report = probe(step, run, (0, 0), [RUN_MOUNT, CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors"])
    assert_contained(
        report,
        uid=IMAGE_USER[0],
        writable={RUN_MOUNT},
        readonly={CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors"},
    )
    assert report["gid"] == IMAGE_USER[1] and report["groups"] in ([], [IMAGE_USER[1]])
    assert_limits(report, step.limits)
    assert (run / "probe.json").stat().st_uid == IMAGE_USER[0]
    assert (run / "logs").stat().st_uid == IMAGE_USER[
        0
    ]  # the run directory was handed over, folders included
    assert report["hf_token_sha256"] is None
    assert search(run, planted.values()) == []


def test_the_engine_records_the_limits_and_the_read_only_root(kit_image, owned_tmp, planted, monkeypatch):
    """`docker inspect` of the container the kit's argv creates, invoked as root: the HostConfig and Config."""
    run, cache = fresh_dirs(owned_tmp, 0)
    plan = benchmark_plan(run, cache, monkeypatch, preset="qwen3-8b")
    fetch, step = plan.steps
    for s in (step, dataclasses.replace(step, limits=Limits("3g", 777, "96m")), fetch):
        info = inspect_created(s, run, (0, 0))
        host = info["HostConfig"]
        assert host["ReadonlyRootfs"] is True
        assert host["Tmpfs"]["/tmp"].startswith("rw,exec,nosuid,nodev,mode=1777"), host["Tmpfs"]
        assert host["PidsLimit"] == s.limits.pids
        assert host["Memory"] == host["MemorySwap"] == size_bytes(s.limits.memory)
        assert host["ShmSize"] == size_bytes(s.limits.shm_size)
        assert host["CapDrop"] and "no-new-privileges" in " ".join(host["SecurityOpt"] or [])
        assert info["Config"]["User"] == f"{IMAGE_USER[0]}:{IMAGE_USER[1]}"
        # The engine copied the credential's value into the fetch container's environment only.
        tokens = [e for e in info["Config"]["Env"] if e.startswith("HF_TOKEN=")]
        assert tokens == ([f"HF_TOKEN={planted['HF_TOKEN']}"] if s.name == "fetch" else []), s.name


def test_only_the_fetch_step_receives_the_credential(kit_image, owned_tmp, planted, monkeypatch):
    """The benchmark of a hub preset plans a fetch step (network on, the hub cache writable, the credentials by
    name) and the worker (none): run as root, both as the image user; the token arrives in the fetch step only."""
    run, cache = fresh_dirs(owned_tmp, 0)
    plan = benchmark_plan(run, cache, monkeypatch, preset="qwen3-8b")
    fetch, step = plan.steps
    assert fetch.name == "fetch" and fetch.network and fetch.credentials
    fetched = probe(fetch, run, (0, 0), [CACHE_MOUNT])
    assert_contained(fetched, uid=IMAGE_USER[0], writable={CACHE_MOUNT}, readonly=set(), network=True)
    assert fetched["hf_token_sha256"] == hashlib.sha256(planted["HF_TOKEN"].encode()).hexdigest()
    assert fetched["other_credentials"] == []
    assert_limits(fetched, fetch.limits)
    assert (cache / "probe.json").stat().st_uid == IMAGE_USER[0]  # the cache was handed over, and written
    (cache / "probe.json").unlink()
    worker = probe(step, run, (0, 0), [RUN_MOUNT, CACHE_MOUNT])
    assert worker["hf_token_sha256"] is None and worker["other_credentials"] == []
    assert_contained(worker, uid=IMAGE_USER[0], writable={RUN_MOUNT}, readonly={CACHE_MOUNT})
    assert search(run, planted.values()) == []


@pytest.mark.parametrize("stage", ["regen", "hsextract"])
def test_pipeline_stage_mounts(kit_image, owned_tmp, planted, stage):
    """A tiny-preset pipeline stage: the kit's models, the chat rows and the prompts are mounted read-only, the
    workdir read-write; regen's servers listen on the container's own loopback, with no other network. Probed as
    root, as these tests run: the step runs as the image user, the workdir handed to it."""
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline import registry
    from draftscope.pipeline.config import load_pipeline_config
    from draftscope.pipeline.plan import CHAT_MOUNT, PROMPTS_MOUNT

    workdir = owned_tmp / "w"
    workdir.mkdir()  # a fresh workdir: logs/ is made by the kit (root) and handed over with the rest
    resolved = load_pipeline_config(preset="tiny", opts=[f"data.chat={ROOT / 'examples' / 'chat.jsonl'}"])
    plan = planning.build(resolved, registry.select(stage), workdir, "docker")
    (sp,) = plan.stages
    models = next(m.target for m in sp.step.mounts if m.target.startswith("/draftscope/models"))
    assert {m.target for m in sp.step.mounts if not m.read_only} == {RUN_MOUNT}
    targets = [
        RUN_MOUNT,
        f"{RUN_MOUNT}/logs",
        models,
        f"{models}/target/config.json",
        CHAT_MOUNT,
        PROMPTS_MOUNT,
    ]
    report = probe(sp.step, workdir, (0, 0), targets)
    # The models folder refuses by its flag; the checkout's files (root's, mode 644) by their bits first.
    assert_contained(
        report,
        uid=IMAGE_USER[0],
        writable={RUN_MOUNT, f"{RUN_MOUNT}/logs"},  # a stage's servers write their logs there themselves
        readonly={models},
        refused=set(targets[3:]),
    )
    assert_limits(report, sp.step.limits)
    assert report["hf_token_sha256"] is None
    assert search(workdir, planted.values()) == []


def test_a_tiny_benchmark_invoked_as_root_completes_under_containment(kit_image, owned_tmp):
    """The real engine still works under every restriction: the kit-built tiny models, greedy, on the CPU, invoked
    as root: completed, its outputs written by the image user, the executed argv with the flags recorded."""
    run = owned_tmp / "R"
    result = subprocess.run(
        [sys.executable, "-m", "invoke", *TINY, "--output", str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "HOME": "/tmp"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    (step,) = manifest["steps"]
    argv = step["argv"]
    assert argv[argv.index("--user") + 1] == f"{IMAGE_USER[0]}:{IMAGE_USER[1]}"
    for flag in ("--read-only", "--tmpfs", "--memory", "--memory-swap", "--pids-limit", "--shm-size"):
        assert flag in argv, flag
    assert (run / "records.jsonl").stat().st_uid == IMAGE_USER[0]
    assert (run / "summary.json").exists()
