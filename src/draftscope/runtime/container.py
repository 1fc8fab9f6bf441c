"""docker / podman: a Step becomes one `run` argv; the engine is a parameter, the argv is otherwise the same.

Facts this code is built on (docs/develop/upstream-facts.md, checked on podman 4.3 through the docker CLI):
- `run --rm` reports exit code 0 whatever happened (podman < 4.6): run with `--name`, no `--rm`, read the exit
  code from the named container, then remove it.
- Killing the client never stops the container: on expiry stop and remove the container *by name*.
- `--init` lets SIGTERM end the worker at once (Python as PID 1 ignores it).
- `--user uid:gid` for a user missing from /etc/passwd leaves HOME=/: point HOME and caches at writable paths.
- Bind mounts are `--mount type=bind,source=…,target=…[,readonly]`, CSV-quoted (`mount_spec`): docker and podman
  (4.3 checked: a source holding `:`, `,`, `"` and a space, read-only honoured) parse it as one CSV record, where
  `--volume SRC:TARGET:MODE` splits a host path holding `:`.

Containment (every step; tests/container/test_containment.py shows each on the real engine):
- `--read-only` root filesystem; the one writable place besides the step's writable mounts (the run directory, the
  fetch step's hub cache) is a tmpfs at /tmp (`TMPFS`), which HOME_ENV points HOME and every engine cache at.
- `--memory` with `--memory-swap` equal (no swap beyond it), `--pids-limit`, and `--shm-size` unless the step shares
  the host's IPC namespace (`--ipc host`: the host's /dev/shm, where a size is moot): the step's `Limits`.
- never uid 0 inside: invoked as root, a step runs as the images' own user (uid 10001), and its writable mounts
  are handed to that user first (`hand_over`); `--cap-drop ALL` and `no-new-privileges` always.
- credentials (`Step.credentials`) by name, to the step that fetches only.
- a container over `--memory` is ended by the kernel's OOM killer: exit code 137, `State.OOMKilled` true (the step's
  reason says out of memory, with the limit: runtime/base.py `out_of_memory`).

Over ~400 lines on purpose: the facts above are one engine's, and each is used by the argv, the run or the state
reading beside it; split, a change to one would have to be checked against facts in another file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.images import image_reference
from draftscope.core.platforms import IMAGE_USER
from draftscope.runtime.base import (
    ENV_ALLOW,
    Context,
    Outcome,
    container_name,
    die_with_parent,
    log_path,
    outcome_from_exit,
    supervise,
)
from draftscope.runtime.step import RUN_MOUNT, Mount, Step

# Writable places for a user that has no home in the image: all under /tmp, the tmpfs below.
HOME_ENV = {
    settings.HOME.name: "/tmp/home",
    settings.XDG_CACHE_HOME.name: "/tmp/home/.cache",
    settings.TORCH_HOME.name: "/tmp/home/.cache/torch",
    settings.TRITON_CACHE_DIR.name: "/tmp/home/.cache/triton",
    settings.VLLM_CACHE_ROOT.name: "/tmp/home/.cache/vllm",
    settings.PYTHONUNBUFFERED.name: "1",
}

# The root filesystem is read-only; the engines still write scratch files: HOME and the caches above (Hugging Face
# modules, torch hub, Triton kernels, vLLM's compile cache and usage file), torch inductor's /tmp/torchinductor_*,
# torchrun's and tempfile's scratch. One tmpfs at /tmp holds them all: `exec`, because Triton and inductor dlopen
# the kernels they compile there (a tmpfs is noexec by default); `mode=1777`, so that any uid can make its HOME.
# It lives in the container's memory, counted against `--memory`. Nothing written there outlives the step: what
# matters goes to the run directory (or, for the fetch step, the hub cache). podman adds tmpfs at /var/tmp and /run
# of its own with `--read-only`; docker does not, and nothing the kit runs needs them.
TMPFS = ("/tmp:rw,exec,nosuid,nodev,mode=1777",)
STATE_FORMAT = (
    "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}"  # `inspect`: how a container ended
)


def container_user(user: tuple[int, int]) -> tuple[int, int]:
    """The uid:gid a step runs as: the invoking user, so that the run directory's files are theirs; never root's ids.
    Invoked as root (uid 0), the step runs as the images' own unprivileged user (uid 10001, made by every
    Dockerfile); gid 0 alone is replaced by that user's group. Works alike with docker and rootful or rootless
    podman (no user namespace setting needed); `hand_over` makes the writable mounts that user's."""
    uid, gid = user
    if uid == 0:
        return IMAGE_USER
    return uid, IMAGE_USER[1] if gid == 0 else gid


# Folders whose trees are never handed over (a cache variable pointing at one of them would otherwise give the
# system to uid 10001): these themselves, and anything under the first group.
_SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
)
_SYSTEM_TREES += ("/usr", "/run")
_SYSTEM_FOLDERS = ("/", "/home", "/mnt", "/media", "/opt", "/root", "/srv", "/tmp", "/var", "/var/lib")


def hand_over(source: Path, user: tuple[int, int]) -> None:
    """Give a writable mount's tree to the container's user, when the kit runs as root and the step does not: the
    invoking root can still read and remove all of it. Changed without following anything: a symbolic link is
    changed itself (lchown), a mount point inside is not entered, and a non-folder with more than one hard link is
    left alone (a reused workdir may hold a hard link to a file elsewhere, e.g. /etc/shadow). A system folder (a
    cache variable set to `/` or `/usr`) is refused; what already belongs to the user is left as it is."""
    top = source.resolve()
    if str(top) in _SYSTEM_FOLDERS or any(top == Path(t) or Path(t) in top.parents for t in _SYSTEM_TREES):
        raise UserError(
            f"a system folder cannot be handed to the container's user {user[0]}",
            field="writable mount",
            value=str(top),
            fix="point the setting that names it (e.g. HF_HUB_CACHE, --output) at a folder of its own",
        )
    device = top.stat().st_dev

    def give(path: str | Path, info: os.stat_result) -> None:
        if (info.st_uid, info.st_gid) != user:
            os.chown(path, *user, follow_symlinks=False)

    give(top, top.lstat())
    for folder, dirs, files in os.walk(top):  # os.walk does not descend into linked folders
        keep = []
        for name in dirs:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if info.st_dev == device:
                give(path, info)
                if stat.S_ISDIR(info.st_mode):
                    keep.append(name)
        dirs[:] = keep
        for name in files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if info.st_dev == device and (stat.S_ISLNK(info.st_mode) or info.st_nlink == 1):
                give(path, info)


def mount_spec(source: str, target: str, read_only: bool) -> str:
    """`--mount`'s value for a bind mount: `type=bind,source=S,target=T[,readonly]`.

    Not `--volume S:T:MODE`: a `:` in a host path (an --output under `a:b`, a cache folder named in the
    environment) would split it elsewhere, silently. docker and podman read `--mount` as one CSV record (Go's
    encoding/csv), so a field holding `,` or `"` is quoted whole, its quotes doubled: the csv module writes that.
    A newline, carriage return or NUL cannot be carried by either engine, and is refused."""
    for field, path in (("source", source), ("target", target)):
        if any(c in path for c in "\n\r\0"):
            raise UserError(
                "a path with a newline or NUL cannot be mounted into a container",
                field=f"mount {field}",
                value=path,
                fix="rename or move it to a path without control characters (e.g. choose another --output)",
            )
    fields = ["type=bind", f"source={source}", f"target={target}", *(["readonly"] if read_only else [])]
    out = io.StringIO()
    csv.writer(out, lineterminator="", quoting=csv.QUOTE_MINIMAL, doublequote=True).writerow(fields)
    return out.getvalue()


class ContainerRuntime:
    def __init__(self, engine: str) -> None:
        if engine not in ("docker", "podman"):
            raise ValueError(engine)
        self.name = engine
        self.engine = engine

    uses_images = True

    # -- the argv ----------------------------------------------------------------------------------------

    def argv(self, step: Step, ctx: Context) -> list[str]:
        """The exact `run` command for `step`: what `--dry-run` prints and what `run` executes."""
        name = container_name(ctx, step.name)
        argv = [self.engine, "run", "--name", name, "--init"]
        argv += ["--label", f"draftscope.run={ctx.run_id}", "--label", f"draftscope.step={step.name}"]
        uid, gid = container_user(ctx.user)
        argv += ["--user", f"{uid}:{gid}"]
        argv += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        argv += ["--read-only", *(a for spec in TMPFS for a in ("--tmpfs", spec))]
        limits = step.limits
        argv += ["--memory", limits.memory, "--memory-swap", limits.memory, "--pids-limit", str(limits.pids)]
        if not step.ipc_host:
            argv += ["--shm-size", limits.shm_size]
        if not step.network:
            argv += ["--network", "none"]
        if step.gpus:
            # docker: the NVIDIA runtime hook; podman: CDI devices (nvidia-ctk cdi generate).
            if self.engine == "docker":
                argv += [
                    "--gpus",
                    "all" if step.gpus < 0 else f'"device={",".join(map(str, range(step.gpus)))}"',
                ]
            else:
                argv += ["--device", "nvidia.com/gpu=all"]
            argv += ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        if step.ipc_host:
            argv += ["--ipc", "host"]
        for mount in step.mounts:
            argv += ["--mount", mount_spec(self._source(mount, ctx), mount.target, mount.read_only)]
        env = {**HOME_ENV, **step.env, **ctx.extra_env}
        for key in sorted(env):
            argv += ["--env", f"{key}={env[key]}"]
        for key in settings.present({*step.env_passthrough, *step.credentials, *ENV_ALLOW}):
            argv += ["--env", key]  # by name: the engine copies the value, which never enters this argv
        argv += ["--workdir", RUN_MOUNT if any(m.target == RUN_MOUNT for m in step.mounts) else "/tmp"]
        argv.append(image_reference(step.image))
        argv += list(step.argv)
        return argv

    @staticmethod
    def _source(mount: Mount, ctx: Context) -> str:
        return str(Path(str(ctx.run_dir) if mount.target == RUN_MOUNT else mount.source).absolute())

    # -- execution ---------------------------------------------------------------------------------------

    def run(self, step: Step, ctx: Context) -> Outcome:
        name = container_name(ctx, step.name)
        argv = self.argv(step, ctx)
        for mount in step.mounts:
            # A bind mount's source must exist (`--mount` refuses a missing one; `--volume` made it, owned by root):
            # a missing one is a folder the step fills (a cache), made here by this user.
            source = Path(self._source(mount, ctx))
            if not os.path.lexists(source):
                try:
                    source.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise UserError(
                        f"the mount source cannot be created: {exc.strerror or exc}",
                        field=f"mount {mount.target}",
                        value=str(source),
                        fix="create it, or point the setting that names it at a writable place",
                    ) from None
        log = log_path(ctx, step)  # made first: a step may write its servers' logs under logs/ itself
        user = container_user(ctx.user)
        if user != ctx.user and _is_root():
            for mount in (m for m in step.mounts if not m.read_only):
                source = Path(self._source(mount, ctx))
                try:
                    hand_over(source, user)
                except OSError as exc:
                    raise UserError(
                        f"a writable mount cannot be given to the container's user {user[0]}: "
                        f"{exc.strerror or exc}",
                        field=f"mount {mount.target}",
                        value=str(source),
                        fix="put the run directory (or cache) on a filesystem where root may change owners, "
                        "or run the kit as an unprivileged user",
                    ) from None
        started = time.monotonic()
        try:
            with log.open("ab") as out:
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        preexec_fn=die_with_parent(),
                    )
                except FileNotFoundError:
                    raise UserError(
                        f"the container engine '{self.engine}' is not installed",
                        field="--runtime",
                        fix="install it, or use --runtime local for a CPU run",
                    ) from None
                ctx.started(step.name, engine=self.engine, container=name)
                state, reason = supervise(
                    proc,
                    max_seconds=step.max_seconds,
                    stop=lambda: self.stop(name, ctx.grace_seconds),
                    started=started,
                    finished=lambda: self.state(name)[0] in ("exited", "stopped"),
                )
            seconds = time.monotonic() - started
            status, code, oom = self.settled(name)
            if state != "exited":
                return Outcome(step.name, state, code, seconds, reason, log, name)
            if status != "exited":
                # The container never ran (the engine refused to start it): its exit code would read 0.
                client = proc.returncode or 125
                return outcome_from_exit(step, client, seconds, log, name, what="the container engine")
            return outcome_from_exit(step, code, seconds, log, name, oom_killed=oom)
        finally:
            self.remove(name)

    def _quiet(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                [self.engine, *args], capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            raise UserError(
                f"the container engine '{self.engine}' is not installed (not on PATH)",
                field="--runtime",
                value=self.engine,
                fix="install it, or use --runtime local for a CPU run",
            ) from None

    def settled(self, name: str, wait: float = 10.0) -> tuple[str | None, int | None, bool]:
        """Final state and exit code: a client can return before podman's cleanup records the exit, so a container
        shown running or stopping is asked again for up to `wait` s; podman's "stopped" is "exited"."""
        deadline = time.monotonic() + wait
        while True:
            status, code, oom = self.state(name)
            if status not in ("running", "stopping", "removing") or time.monotonic() >= deadline:
                return ("exited" if status == "stopped" else status), code, oom
            time.sleep(0.5)

    def stop(self, name: str, grace: float) -> None:
        """SIGTERM (through --init), SIGKILL after `grace` seconds: the container itself, by name."""
        self._quiet("stop", "--time", str(max(1, round(grace))), name, timeout=grace + 60)

    def remove(self, name: str) -> None:
        self._quiet("rm", "--force", name)

    def state(self, name: str) -> tuple[str | None, int | None, bool]:
        """(status, exit code, whether the engine saw the kernel's OOM killer end it): ('exited', N, …) once it ran;
        (None, None, False) if it is gone."""
        result = self._quiet("inspect", "--format", STATE_FORMAT, name)
        status, code, oom = [*(result.stdout.split() if result.returncode == 0 else []), None, None, None][:3]
        return status, int(code) if code and code.lstrip("-").isdigit() else None, oom == "true"

    def image_facts(self, image: str) -> dict[str, Any]:
        """The image's reference, Id and RepoDigests (locally built images have none), for the manifest."""
        ref = image_reference(image)
        result = self._quiet("image", "inspect", ref)
        if result.returncode != 0 and not _image_missing(result.stderr):
            # The engine itself did not answer (no daemon, a wrong DOCKER_HOST): say so, not "image missing".
            first = next((line for line in result.stderr.splitlines() if line.strip()), "no answer")
            raise UserError(
                f"the container engine '{self.engine}' does not answer: {first.strip()}",
                field="--runtime",
                value=self.engine,
                fix="start the engine (see `invoke doctor`), or use --runtime local for a CPU run",
            )
        if result.returncode != 0:
            raise UserError(
                f"image {ref} is not present for {self.engine}",
                field="image",
                fix=f"build it (make image-{image}) or pull it (invoke images.pull {image})",
            )
        (info,) = json.loads(result.stdout)
        return {"reference": ref, "id": info.get("Id"), "repo_digests": list(info.get("RepoDigests") or [])}

    def check_images(self, images: Iterable[str]) -> None:
        for image in sorted(set(images)):
            self.image_facts(image)  # raises a UserError naming the image and how to build it

    def image_reference(self, image: str) -> str | None:
        return image_reference(image)

    def with_host_network(self) -> ContainerRuntime:
        return HostNetworkRuntime(self.engine)

    def with_recorded_image(self, facts: Mapping[str, Any]) -> ContainerRuntime:
        return RecordedImage(self.engine, facts)


class HostNetworkRuntime(ContainerRuntime):
    """docker/podman for a training step spread over nodes: NCCL and torchrun's rendezvous talk between nodes,
    which `--network none` forbids; the container shares its node's network instead."""

    def argv(self, step: Step, ctx: Context) -> list[str]:
        argv = super().argv(step, ctx)
        if "--network" in argv:
            argv[argv.index("--network") + 1] = "host"
        else:
            argv[argv.index("--init") + 1 : argv.index("--init") + 1] = ["--network", "host"]
        return argv


class RecordedImage(ContainerRuntime):
    """The engine's argv (a record's command and fingerprint are a run's), and image facts read where the step ran;
    it never calls the engine, which a merge job's node may lack."""

    def __init__(self, engine: str, facts: Mapping[str, Any]) -> None:
        super().__init__(engine)
        self.facts = {
            "reference": facts.get("reference"),
            "id": facts.get("id"),
            "repo_digests": list(facts.get("repo_digests") or []),
        }

    def image_facts(self, image: str) -> dict[str, Any]:
        return dict(self.facts)


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)  # Windows has none
    return geteuid is not None and geteuid() == 0


def _image_missing(stderr: str) -> bool:
    """docker: "No such image"; podman: "image not known" (through its Docker API: "No such image")."""
    return any(words in stderr.lower() for words in ("no such image", "image not known", "no such object"))
