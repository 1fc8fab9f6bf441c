"""Where the kit's data files are: schemas, presets and examples.

In a checkout (or an editable install) they sit at the top of the repository; in a wheel they travel inside
the package under `draftscope/_data/`. The checkout wins so that edits are seen without reinstalling.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from draftscope.core import settings

_PACKAGE = Path(__file__).resolve().parent.parent  # draftscope/, this file being draftscope/core/resources.py


@cache
def repo_root() -> Path | None:
    """The checkout this package runs from, or None when installed from a wheel."""
    root = _PACKAGE.parent.parent
    if (root / "pyproject.toml").is_file() and (root / "schemas").is_dir():
        return root
    return None


def _data_dir(name: str) -> Path:
    root = repo_root()
    if root is not None:
        return root / name
    return _PACKAGE / "_data" / name


def schemas_dir() -> Path:
    return _data_dir("schemas")


def presets_dir() -> Path:
    """`$DRAFTSCOPE_PRESETS` (a folder with `models/` and `experiments/`) when set, else the kit's own."""
    return settings.DRAFTSCOPE_PRESETS.get() or _data_dir("presets")


def examples_dir() -> Path:
    return _data_dir("examples")


def resolve_path(path: str) -> Path:
    """A relative path is taken from the current directory, else from the kit's checkout (examples/…)."""
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    root = repo_root()
    if root is not None and (root / candidate).exists():
        return root / candidate
    packaged = examples_dir().parent / candidate  # inside an installed wheel
    return packaged if packaged.exists() else candidate
