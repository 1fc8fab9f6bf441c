"""The local container parts of the reviewer's path, through the checkout's scripts (images/local/): the loopback
registry, and a second engine over its own, initially empty storage — a reviewer's machine that has only what it
pulls. `make kick-the-tires` and the container tier use them."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftscope.core import settings
from draftscope.core.errors import UserError


def _exports(stdout: str) -> dict[str, str]:
    """`export A=1 B=2` → {"A": "1", "B": "2"}."""
    words = stdout.split()
    return dict(w.partition("=")[::2] for w in words[1:]) if words[:1] == ["export"] else {}


def start_registry(root: Path) -> str:
    """The loopback registry's address (started unless it answers)."""
    done = subprocess.run(
        [str(root / "images/local/registry.sh"), "start"], capture_output=True, text=True, check=False
    )
    address = _exports(done.stdout).get(settings.DRAFTSCOPE_REGISTRY.name)
    if done.returncode != 0 or not address:
        raise UserError(
            f"the loopback registry did not start: {done.stderr.strip() or done.stdout.strip()}",
            fix="install it (root): images/local/registry.sh install",
        )
    return address


@dataclass
class Engine:
    """A podman API service over its own storage under `folder`; `env` reaches it (DOCKER_HOST)."""

    root: Path
    folder: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def variables(self) -> dict[str, str]:
        """What the engine script reads: where this engine keeps its state and its image storage."""
        return {
            settings.DRAFTSCOPE_ENGINE_DIR.name: str(self.folder / "engine"),
            settings.DRAFTSCOPE_ENGINE_STORAGE.name: str(self.folder / "storage"),
        }

    def start(self) -> Engine:
        done = subprocess.run(
            [str(self.root / "images/local/podman-engine.sh"), "start"],
            capture_output=True,
            text=True,
            check=False,
            env=settings.child_env(self.variables),
        )
        self.env = _exports(done.stdout)
        if done.returncode != 0 or settings.DOCKER_HOST.name not in self.env:
            raise UserError(
                f"a second engine did not start: {done.stderr.strip()}",
                fix="install the engine (root): images/local/podman-engine.sh install",
            )
        return self

    def stop(self) -> None:
        """End the service, unmount what its overlay storage left mounted, remove the folder."""
        subprocess.run(
            [str(self.root / "images/local/podman-engine.sh"), "stop"],
            env=settings.child_env(self.variables),
            capture_output=True,
            check=False,
        )
        time.sleep(1)
        inside = str(self.folder.resolve()) + "/"
        try:
            with open("/proc/mounts", encoding="utf-8") as mounts:
                points = [line.split()[1] for line in mounts if line.split()[1].startswith(inside)]
        except OSError:
            points = []
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
