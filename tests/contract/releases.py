"""Pinned upstream releases for the contract tier: fetched once into a cache, read without importing.

A release is its published wheel, downloaded with pip (`--no-deps --only-binary=:all:`) into
`$DRAFTSCOPE_RELEASE_CACHE`, else `~/.cache/draftscope/releases`; a wheel already there is used as is, so the
cache can be filled by hand on a machine without the package index. Sources are read from the wheel's zip by
dotted module name and never imported: the releases need CUDA, and importing them would run their code.
Nothing downloaded here is committed.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE_ENV = "DRAFTSCOPE_RELEASE_CACHE"


class ReleaseUnavailable(RuntimeError):
    """The pinned wheel is neither in the cache nor downloadable."""


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "draftscope" / "releases"


def _wheel_name(name: str) -> str:
    # Wheel file names spell the distribution with runs of -_. as one underscore (PEP 427 / 503).
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached(cache: Path, name: str, version: str) -> Path | None:
    prefix = f"{_wheel_name(name)}-{version}-"
    found = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(prefix))
    return found[0] if found else None


def release_wheel(name: str, version: str, *, platform: str | None = None) -> Path:
    """The wheel of `name==version`, from the cache or downloaded into it.

    `platform` (a wheel platform tag such as `manylinux_2_28_x86_64`) picks that platform's wheel wherever the
    test runs; the Python sources inside are the same for every platform of a release.
    """
    cache = cache_dir()
    if cache.is_dir() and (wheel := _cached(cache, name, version)):
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    if platform:
        argv += ["--platform", platform]
    argv += [f"{name}=={version}", "-d", str(cache)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheel = _cached(cache, name, version)
    if proc.returncode != 0 or wheel is None:
        detail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ReleaseUnavailable(
            f"could not get the {name} {version} wheel ({detail}); put it into {cache} "
            f"(or point {CACHE_ENV} at a folder holding it) and run again"
        )
    return wheel


class Release:
    """The Python sources of one release wheel, by dotted module name."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = Path(wheel)
        self._zip = zipfile.ZipFile(self.wheel)
        self._names = set(self._zip.namelist())

    def metadata(self, field: str) -> str | None:
        """A field of the wheel's METADATA (e.g. `Version`)."""
        (meta,) = [n for n in self._names if n.endswith(".dist-info/METADATA")]
        for line in self._zip.read(meta).decode("utf-8").splitlines():
            key, sep, value = line.partition(": ")
            if sep and key == field:
                return value
            if not line:
                break  # the headers end at the first blank line
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

    def source(self, module: str) -> str:
        return self._zip.read(self.path_of(module)).decode("utf-8")

    @functools.cache  # noqa: B019 -- a Release lives for a test session; the cache is the point
    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.source(module), filename=self.path_of(module))


# The pinned SGLang release (images/sglang/requirements.in); 0.5.23 ships only manylinux_2_34 wheels.
SGLANG_VERSION = "0.5.23"
SGLANG_PLATFORM = "manylinux_2_34_x86_64"


def pinned_release(name: str, version: str, *, platform: str | None = None) -> Release:
    """The pinned wheel for a test fixture: the test fails (never skips) when it cannot be had."""
    import pytest

    try:
        return Release(release_wheel(name, version, platform=platform))
    except ReleaseUnavailable as exc:
        pytest.fail(str(exc))
