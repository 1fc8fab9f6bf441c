"""The training text: the Python standard library's own `.py` sources (PSF-2.0), already on every machine.

Files are found under `sysconfig.get_paths()["stdlib"]`, test folders and installed third-party packages left
out, sorted by relative path, and split into train and validation by a hash of that path — so the split does not
depend on the file system's listing order. The corpus differs between Python versions (and patch releases), so its
hash and the Python version go into every build record: a rebuild on another Python reads different text.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Any folder with one of these names is skipped wherever it appears: the test suites (test/, tests/,
# idlelib/idle_test, lib2to3/tests, …) are not the library, and site-packages holds third-party code under other
# licences.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
# About 1 file in 20 is held out for validation.
VALIDATION_MODULUS = 20
LICENCE = "PSF-2.0"
DESCRIPTION = "Python standard library .py sources (PSF-2.0), test folders excluded"


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib folder, with forward slashes
    size: int
    sha256: str
    text: str

    @property
    def is_validation(self) -> bool:
        digest = hashlib.sha256(self.path.encode("utf-8")).digest()
        return int.from_bytes(digest[:4], "big") % VALIDATION_MODULUS == 0


@dataclass(frozen=True)
class Corpus:
    root: str
    python_version: str
    files: tuple[SourceFile, ...]

    @property
    def train(self) -> list[SourceFile]:
        return [f for f in self.files if not f.is_validation]

    @property
    def validation(self) -> list[SourceFile]:
        return [f for f in self.files if f.is_validation]

    @property
    def sha256(self) -> str:
        """A hash over every file's relative path, size and content hash, in sorted order."""
        digest = hashlib.sha256()
        for f in self.files:
            digest.update(f"{f.path}\t{f.size}\t{f.sha256}\n".encode())
        return digest.hexdigest()

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def summary(self) -> dict[str, object]:
        return {
            "corpus": DESCRIPTION,
            "corpus_licence": LICENCE,
            "corpus_sha256": self.sha256,
            "corpus_files": len(self.files),
            "corpus_bytes": self.bytes,
            "corpus_validation_files": len(self.validation),
            "python_version": self.python_version,
        }


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(root: Path | None = None) -> Corpus:
    """Read every non-test `.py` file of the standard library, sorted by relative path."""
    root = Path(root) if root is not None else stdlib_dir()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        data = path.read_bytes()
        files.append(
            SourceFile(
                path=rel.as_posix(),
                size=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                # A few files carry non-UTF-8 bytes in comments; replacing them is deterministic.
                text=data.decode("utf-8", errors="replace"),
            )
        )
    files.sort(key=lambda f: f.path)
    return Corpus(root=str(root), python_version=platform.python_version(), files=tuple(files))
