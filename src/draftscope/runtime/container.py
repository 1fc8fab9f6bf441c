"""docker / podman: a Step becomes one `run` argv; the engine is a parameter, the argv is otherwise the same.

Facts this code is built on (docs/upstream-facts.md, checked on podman 4.3 through the docker CLI):
- `run --rm` reports exit code 0 whatever happened (podman < 4.6): run with `--name`, no `--rm`, read the exit
  code from the named container, then remove it.
- Killing the client never stops the container: on expiry stop and remove the container *by name*.
- `--init` lets SIGTERM end the worker at once (Python as PID 1 ignores it).
- `--user uid:gid` for a user missing from /etc/passwd leaves HOME=/: point HOME and caches at writable paths.
- Bind mounts are `--mount type=bind,source=…,target=…[,readonly]`, CSV-quoted (`mount_spec`): docker and podman
  (4.3 checked: a source holding `:`, `,`, `"` and a space, read-only honoured) parse it as one CSV record, where
  `--volume SRC:TARGET:MODE` splits a host path holding `:`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.images import image_reference
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

# Writable places for a user that has no home in the image.
HOME_ENV = {
    "HOME": "/tmp/home",
    "XDG_CACHE_HOME": "/tmp/home/.cache",
    "TORCH_HOME": "/tmp/home/.cache/torch",
    "TRITON_CACHE_DIR": "/tmp/home/.cache/triton",
    "VLLM_CACHE_ROOT": "/tmp/home/.cache/vllm",
    "PYTHONUNBUFFERED": "1",
}


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
        argv += ["--user", f"{ctx.user[0]}:{ctx.user[1]}"]
        argv += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
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
        for key in sorted({*step.env_passthrough, *ENV_ALLOW}):
            if key in os.environ:
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
        log = log_path(ctx, step)
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
                    limit=step.time_limit_s,
                    stop=lambda: self.stop(name, ctx.grace_seconds),
                    started=started,
                )
            seconds = time.monotonic() - started
            status, code = self.state(name)
            if state != "exited":
                return Outcome(step.name, state, code, seconds, reason, log, name)
            if status != "exited":
                # The container never ran (the engine refused to start it): its exit code would read 0.
                client = proc.returncode or 125
                return outcome_from_exit(step, client, seconds, log, name, what="the container engine")
            return outcome_from_exit(step, code, seconds, log, name)
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

    def stop(self, name: str, grace: float) -> None:
        """SIGTERM (through --init), SIGKILL after `grace` seconds: the container itself, by name."""
        self._quiet("stop", "--time", str(max(1, round(grace))), name, timeout=grace + 60)

    def remove(self, name: str) -> None:
        self._quiet("rm", "--force", name)

    def state(self, name: str) -> tuple[str | None, int | None]:
        """(status, exit code) of the named container: ('exited', N) once it ran; (None, None) if it is gone."""
        result = self._quiet("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name)
        if result.returncode != 0:
            return None, None
        status, _, code = result.stdout.strip().partition(" ")
        try:
            return status, int(code)
        except ValueError:
            return status, None

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


def _image_missing(stderr: str) -> bool:
    """docker: "No such image"; podman: "image not known" (through its Docker API: "No such image")."""
    text = stderr.lower()
    return "no such image" in text or "image not known" in text or "no such object" in text
