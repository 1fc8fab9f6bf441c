"""Every file and folder the kit's code, build files, notices, research records and docs cite exists in the repository.

A comment that points at a document outside the repo (a planning note, a report on someone's machine) is a dead
end for the next reader; so is a link in the docs to a page that moved, a help string naming a folder nobody made,
or a licence notice citing fixtures that were deleted. This reads the citations out of the text, so a new one is
checked the day it is written; each kind of file it reads has a test below that plants a dangling one in a copy of
the tree and sees it caught.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from support import ROOT

TOP = r"(?:docs|research|schemas|images|examples|presets|tests|src)"
# A path into one of the repository's own top-level folders, or a top-level document (README.md, CHANGELOG.md).
# `scripts/…` is left out on purpose: it names speculators' scripts folder (upstream), not ours.
CITED = re.compile(
    r"(?<![\w./<{$-])(" + TOP + r"/[\w./-]*[\w-]"
    r"\.(?:md|py|json|yaml|yml|sh|txt|lock|in|cff|j2|jsonl|csv)|[A-Z][A-Z_-]+\.md)(?![\w/])"
)
# A folder of ours, written with its trailing slash (`presets/pipelines/`, `tests/fixtures/upstream/`).
FOLDER = re.compile(r"(?<![\w./<{$-])(" + TOP + r"/(?:[\w.-]+/)*)(?![\w<{$*-])")
# The planning notes kept outside the repository, named without a path: a citation nobody can follow.
OUTSIDE = re.compile(r"\b(STYLE|DESIGN)\b")
PLACEHOLDER = re.compile(r"/[A-Z][A-Z_]+(?:\.|/)")  # research/studies/NAME.yaml: a name the reader fills in
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a relative Markdown link
# Evidence arrives after its protocol: research/evidence/NAME/… may be cited once research/studies/NAME.yaml exists
# (`invoke evidence.add` creates the folder).
EVIDENCE = re.compile(r"research/evidence/([\w.-]+)/")

# Where citations are read: the code, the build and CI files, the notices, the schemas, the research records (not
# research/evidence/: run directories copied in unchanged) and, for links, every Markdown page. CHANGELOG.md is
# history: it names files as they were.
SOURCES = (
    "src",
    "tests",
    "Makefile",
    ".ci",
    "pyproject.toml",
    "tasks.py",
    "images",
    "schemas",
    "NOTICE",
    "research",
)
SUFFIXES = (".py", ".sh", ".toml", ".in", ".yaml", ".yml", ".json", ".j2", "")
SKIP = ("research/evidence/", "CHANGELOG.md", "tests/unit/docs/test_citations.py")

# Citations that cannot be fixed where they stand, each with its reason. An entry that no longer matches fails the
# test below: remove it.
KNOWN = {
    # A frozen protocol with evidence: evidence.verify fails a protocol changed after its results (the order
    # check, analysis/evidence_git.py). HEAD.md is today's docs/review/head.md.
    ("research/studies/prefix-head-cpu.yaml", "HEAD.md"): "frozen protocol",
}


@functools.cache
def _tracked() -> list[str]:
    """The working tree's files: tracked, and new ones not ignored (checked before they are committed)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted({n for n in out.stdout.split() if (ROOT / n).is_file()})


def _scanned(names: list[str]) -> list[str]:
    return [
        n
        for n in names
        if n.split("/")[0] in SOURCES
        and not n.startswith(SKIP)
        and Path(n).suffix in SUFFIXES
        and not n.endswith((".lock", "SHA256SUMS"))
    ]


def _prose(text: str) -> str:
    """A test module's comments and docstrings: its string literals are data (made-up paths in made-up runs)."""
    parts = [
        t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


@functools.cache
def _cited_in(name: str, text: str) -> tuple[tuple[str, str], ...]:
    """(file, cited path or folder) in one file's text (cached: the planted copies below share the other files)."""
    if name.startswith("tests/") and name.endswith(".py"):
        text = _prose(text)
    cited = [m.group(1) for m in CITED.finditer(text)] + [m.group(1) for m in FOLDER.finditer(text)]
    found = [(name, c) for c in cited if not PLACEHOLDER.search(c)]
    return tuple(found + [(name, m.group(1)) for m in OUTSIDE.finditer(text)])


def citations(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, cited path or folder) for the code, build files, notices, schemas and research records."""
    found = []
    for name in _scanned(_tracked()):
        path = root / name
        if path.is_file():
            found += _cited_in(name, path.read_text(encoding="utf-8", errors="replace"))
    return found


def links(root: Path = ROOT) -> list[tuple[str, str]]:
    """(page, target) for every relative link of every Markdown page (README.md, docs/, ARTIFACT.md, …)."""
    found = []
    for name in _tracked():
        if not name.endswith(".md") or name.startswith(SKIP):
            continue
        page = root / name
        for m in LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            found.append((name, os.path.relpath(os.path.normpath(page.parent / target), root)))
    return found


def _exists(root: Path, cited: str) -> bool:
    if cited.endswith("/"):
        evidence = EVIDENCE.match(cited)
        return (root / cited).is_dir() or bool(
            evidence and (root / f"research/studies/{evidence[1]}.yaml").is_file()
        )
    return (root / cited).exists()


def dangling(root: Path = ROOT) -> list[str]:
    found = citations(root) + links(root)
    return sorted({f"{where}: {c}" for where, c in found if (where, c) not in KNOWN and not _exists(root, c)})


def test_the_scan_finds_citations_and_links():
    # A scan that matches nothing would pass below without checking anything; each kind of file is read.
    cited, linked = citations(), links()
    assert len(cited) > 20 and len(linked) > 20
    where = {w for w, _ in cited}
    assert {"NOTICE", "pyproject.toml", "Makefile", "research/claims.yaml"} <= where
    assert any(c.endswith("/") for _, c in cited), "no folder citation was read"


def test_every_cited_file_and_folder_exists():
    missing = dangling()
    assert missing == [], "cited but not in the repository:\n" + "\n".join(missing)


def test_every_known_exception_still_stands():
    found = set(citations())
    stale = sorted(f"{where}: {cited}" for where, cited in KNOWN if (where, cited) not in found)
    assert stale == [], "fixed: remove these from KNOWN in tests/unit/docs/test_citations.py:\n" + "\n".join(
        stale
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the working tree (symbolic links to its files): a planted file replaces its link."""
    for name in _tracked():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _plant(tree: Path, name: str, line: str) -> None:
    path = tree / name
    text = path.read_text(encoding="utf-8")
    path.unlink()
    path.write_text(text + line, encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "line", "expected"),
    [
        (
            "NOTICE",
            "\nVendored under tests/fixtures/upstream/ (see docs/no-such-page.md).\n",
            ["tests/fixtures/upstream/", "docs/no-such-page.md"],
        ),
        ("pyproject.toml", "# the fixtures in tests/fixtures/upstream/\n", ["tests/fixtures/upstream/"]),
        ("research/claims.yaml", "# one described in HEAD.md\n", ["HEAD.md"]),
        ("research/studies/tiny-cpu-aa.yaml", "# as STYLE asks\n", ["STYLE"]),
        (
            "tests/unit/docs/test_module_size.py",
            "# see DESIGN and docs/gone.md\nX = 'docs/data.md'\n",
            ["DESIGN", "docs/gone.md"],
        ),
        ("src/draftscope/pipeline/config.py", '"""a file in presets/pipelines/"""\n', ["presets/pipelines/"]),
        ("schemas/summary.schema.json", " ", []),  # nothing planted: the copy itself is clean
        ("README.md", "\n[moved](docs/no-such-page.md)\n", ["docs/no-such-page.md"]),
        ("docs/use/installing.md", "\n[up](../no-such-folder/)\n", ["docs/no-such-folder"]),
    ],
)
def test_a_planted_dangling_citation_is_caught(tree, name, line, expected):
    _plant(tree, name, line)
    assert dangling(tree) == sorted(f"{name}: {e}" for e in expected)


def test_evidence_of_a_known_study_may_be_cited_before_it_exists(tree):
    _plant(
        tree,
        "tests/gpu/gpu_check.sh",
        "# into research/evidence/tiny-cpu-aa/later/ and research/evidence/nope/x/\n",
    )
    assert dangling(tree) == ["tests/gpu/gpu_check.sh: research/evidence/nope/x/"]
