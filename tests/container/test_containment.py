"""Containment on a real engine: what a step can do from inside its container.

Each case takes a real step from the kit's planning — the benchmark worker, and pipeline stages of the tiny preset —
and runs a probe in its place through `ContainerRuntime.run`, so the container gets exactly the flags, mounts,
user and environment the step would get (only the argv differs, and the image is the transformers image, the one
built here). The probe reports, from inside: its user, its capability sets and no_new_privs (/proc/self/status),
what happens when it writes to every mount, the kit's installed code, and its network. Planted credentials must
arrive by name where the kit passes them, and appear in no output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from draftscope.bench.plan import plan_benchmark
from draftscope.core.presets import load_experiment
from draftscope.runtime import ContainerRuntime, Context
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT

from containerlib import ROOT

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

def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__

targets = json.loads(sys.argv[1])
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
    swapped = dataclasses.replace(
        step,
        image="transformers",
        argv=("python", "-c", PROBE, json.dumps(targets)),
        env={**step.env, "PROBE_OUT": RUN_MOUNT},
    )
    argv = runtime.argv(swapped, Context(run_dir=run, run_id=run.name, user=user))
    for flag in ("--cap-drop", "--security-opt", "--user"):
        assert flag in argv
    outcome = runtime.run(swapped, Context(run_dir=run, run_id=run.name, user=user))
    log = (run / "logs" / f"{step.name}.log").read_text() if (run / "logs").is_dir() else ""
    assert outcome.ok, f"{outcome.reason}\n{log[-3000:]}"
    return json.loads((run / "probe.json").read_text())


def benchmark_step(run: Path, cache: Path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    config = load_experiment(
        "transformers-baseline",
        {"model_preset": "tiny", "device": "cpu", "runtime": "docker", "prompts": "examples/prompts.json"},
    )
    plan = plan_benchmark(config, str(run))
    (step,) = [s for s in plan.steps if s.name == "benchmark"]
    return step


def fresh_dirs(root: Path, owner: int) -> tuple[Path, Path]:
    run, cache = root / "run", root / "cache"
    (run / "logs").mkdir(parents=True)
    cache.mkdir()
    (cache / "weights.safetensors").write_text("pinned weights\n")
    # Everything owned by the container's user: only the mount's read-only flag can refuse a write (EROFS).
    for path in (run, run / "logs", cache, cache / "weights.safetensors"):
        os.chown(path, owner, owner)
    return run, cache


def assert_contained(report: dict, *, uid: int, writable: set[str], readonly: set[str]) -> None:
    assert report["uid"] == report["euid"] == uid
    for caps in ("cap_eff", "cap_prm", "cap_inh", "cap_amb"):
        assert int(report[caps], 16) == 0, (caps, report[caps])
    assert report["no_new_privs"] == "1"
    for target in writable:
        assert report["writes"][target] == "written", (target, report["writes"][target])
    for target in readonly:
        assert report["writes"][target] == "EROFS", (target, report["writes"][target])
    assert report["interfaces"] == ["lo"], report["interfaces"]
    for attempt in ("connect_ip", "connect_host_gateway", "dns"):
        assert report[attempt] != "connected", (attempt, report[attempt])


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
        readonly={CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors"},
    )
    assert report["writes"]["/"] == "EACCES" and report["code"] == "EACCES", (
        report
    )  # the image: not the user's
    assert report["home"] == "/tmp/home"
    assert (
        report["hf_token_sha256"] == hashlib.sha256(planted["HF_TOKEN"].encode()).hexdigest()
    )  # by name ...
    assert report["other_credentials"] == []  # ... and nothing else credential-like is passed at all
    assert (cache / "weights.safetensors").read_text() == "pinned weights\n"
    assert search(run, planted.values()) == []


def test_benchmark_worker_invoked_as_root_has_no_privileges(kit_image, owned_tmp, planted, monkeypatch):
    """The kit maps the invoking user; invoked by root the container's user is root, but without capabilities and
    unable to gain any, the read-only mounts stay read-only and there is no network."""
    run, cache = fresh_dirs(owned_tmp, 0)
    step = benchmark_step(run, cache, monkeypatch)
    report = probe(step, run, (0, 0), [RUN_MOUNT, CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors"])
    assert_contained(
        report, uid=0, writable={RUN_MOUNT}, readonly={CACHE_MOUNT, f"{CACHE_MOUNT}/weights.safetensors"}
    )
    assert search(run, planted.values()) == []


@pytest.mark.parametrize("stage", ["regen", "hsextract"])
def test_pipeline_stage_mounts(kit_image, owned_tmp, planted, stage):
    """A tiny-preset pipeline stage: the kit's models, the chat rows and the prompts are mounted read-only, the
    workdir read-write; regen's servers listen on the container's own loopback, with no other network. Probed as
    root, the owner of those files: only the read-only mounts can refuse the writes."""
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline import registry
    from draftscope.pipeline.config import load_pipeline_config
    from draftscope.pipeline.plan import CHAT_MOUNT, PROMPTS_MOUNT

    workdir = owned_tmp / "w"
    (workdir / "logs").mkdir(parents=True)
    resolved = load_pipeline_config(preset="tiny", opts=[f"data.chat={ROOT / 'examples' / 'chat.jsonl'}"])
    plan = planning.build(resolved, registry.select(stage), workdir, "docker")
    (sp,) = plan.stages
    models = next(m.target for m in sp.step.mounts if m.target.startswith("/draftscope/models"))
    assert {m.target for m in sp.step.mounts if not m.read_only} == {RUN_MOUNT}
    targets = [RUN_MOUNT, models, f"{models}/target/config.json", CHAT_MOUNT, PROMPTS_MOUNT]
    report = probe(sp.step, workdir, (0, 0), targets)
    assert_contained(report, uid=0, writable={RUN_MOUNT}, readonly=set(targets[1:]))
    assert search(workdir, planted.values()) == []
