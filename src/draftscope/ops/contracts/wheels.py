"""Upstream releases as their published wheels: fetched once into a cache, read without importing.

A release is its wheel, downloaded with pip (`--no-deps --only-binary=:all:`) into `$DRAFTSCOPE_RELEASE_CACHE`,
else `~/.cache/draftscope/releases`; a wheel already there is used as is, so the cache can be filled by hand on a
machine without the package index. Sources are read from the wheel's zip by dotted module name and never imported:
the releases need CUDA, and importing them would run their code. The contract tier (`tests/contract/releases.py`)
and `invoke contracts.diff` share this one reader.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from draftscope.core import settings
from draftscope.core.errors import UserError

CACHE_ENV = settings.DRAFTSCOPE_RELEASE_CACHE.name


class ReleaseUnavailable(UserError):
    """A release's wheel is neither in the cache nor downloadable."""


def cache_dir() -> Path:
    return settings.DRAFTSCOPE_RELEASE_CACHE.get() or Path.home() / ".cache" / "draftscope" / "releases"


def _wheel_name(name: str) -> str:
    # Wheel file names spell the distribution with runs of -_. as one underscore (PEP 427 / 503).
    return re.sub(r"[-_.]+", "_", name).lower()


def cached_wheel(name: str, version: str, cache: Path | None = None) -> Path | None:
    """The wheel of `name==version` already in the cache, or None."""
    cache = cache or cache_dir()
    if not cache.is_dir():
        return None
    prefix = f"{_wheel_name(name)}-{version}-"
    found = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(prefix))
    return found[0] if found else None


def download_argv(name: str, version: str, cache: Path, platform: str | None = None) -> list[str]:
    """pip's command that puts the wheel of `name==version` into `cache`."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    if platform:
        argv += ["--platform", platform]
    return [*argv, f"{name}=={version}", "-d", str(cache)]


def release_wheel(name: str, version: str, *, platform: str | None = None) -> Path:
    """The wheel of `name==version`, from the cache or downloaded into it.

    `platform` (a wheel platform tag such as `manylinux_2_28_x86_64`) picks that platform's wheel wherever the
    kit runs; the Python sources inside are the same for every platform of a release.
    """
    cache = cache_dir()
    if wheel := cached_wheel(name, version, cache):
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    argv = download_argv(name, version, cache, platform)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheel = cached_wheel(name, version, cache)
    if proc.returncode != 0 or wheel is None:
        detail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ReleaseUnavailable(
            f"could not get the {name} {version} wheel ({detail})",
            fix=f"put it into {cache} (or point {CACHE_ENV} at a folder holding it), e.g. with "
            f"`{' '.join(argv[1:])}` on a machine with the package index, and run again",
        )
    return wheel


class Release:
    """The Python sources of one release wheel, by dotted module name."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = Path(wheel)
        self._zip = zipfile.ZipFile(self.wheel)
        self._names = set(self._zip.namelist())

    @property
    def names(self) -> set[str]:
        """Every file name in the wheel."""
        return self._names

    def metadata_lines(self) -> list[str]:
        """The header lines of the wheel's METADATA (up to the first blank line)."""
        (meta,) = [n for n in self._names if n.endswith(".dist-info/METADATA")]
        lines = self._zip.read(meta).decode("utf-8").splitlines()
        return lines[: lines.index("")] if "" in lines else lines

    def metadata(self, field: str) -> str | None:
        """A field of the wheel's METADATA (e.g. `Version`); the first one for a repeated field."""
        for line in self.metadata_lines():
            key, sep, value = line.partition(": ")
            if sep and key == field:
                return value
        return None

    def path_of(self, module: str) -> str:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self._names:
                return candidate
        raise KeyError(f"{module} is not in {self.wheel.name}")

    def has_module(self, module: str) -> bool:
        try:
            self.path_of(module)
        except KeyError:
            return False
        return True

    def modules_under(self, package: str) -> list[str]:
        """The dotted names of the modules in one folder of the wheel (not its subfolders), sorted."""
        folder = package.replace(".", "/") + "/"
        return sorted(
            n[:-3].replace("/", ".")
            for n in self._names
            if n.startswith(folder) and n.endswith(".py") and "/" not in n[len(folder) :]
        )

    def source(self, module: str) -> str:
        return self._zip.read(self.path_of(module)).decode("utf-8")

    @functools.cache  # noqa: B019 -- a Release lives as long as one command or test session; the cache is the point
    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.source(module), filename=self.path_of(module))
