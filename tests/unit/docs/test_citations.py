"""Every file the kit's code, build files and docs cite exists in the repository.

A comment that points at a document outside the repo (a planning note, a report on someone's machine) is a dead
end for the next reader; so is a link in the docs to a page that moved. This reads the citations out of the text,
so a new one is checked the day it is written.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from support import ROOT

# A path into one of the repository's own top-level folders, or a top-level document (README.md, CHANGELOG.md).
# `scripts/…` is left out on purpose: it names speculators' scripts folder (upstream), not ours.
CITED = re.compile(
    r"(?<![\w./<{$-])((?:docs|research|schemas|images|examples|presets|tests|src)/[\w./-]*[\w-]"
    r"\.(?:md|py|json|yaml|yml|sh|txt|lock|in|cff)|[A-Z][A-Z_-]+\.md)(?![\w/])"
)
PLACEHOLDER = re.compile(r"/[A-Z][A-Z_]+(?:\.|/)")  # research/studies/NAME.yaml: a name the reader fills in
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a relative Markdown link


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def citations() -> list[tuple[str, str]]:
    """(file, cited path) for the code and the build files."""
    found = []
    for name in _tracked("src", "Makefile", ".ci", "pyproject.toml", "tasks.py", "images"):
        path = ROOT / name
        if path.suffix not in (".py", ".sh", ".toml", ".in", "") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [(name, m.group(1)) for m in CITED.finditer(text) if not PLACEHOLDER.search(m.group(1))]
    return found


def links() -> list[tuple[str, str]]:
    """(page, target) for every relative link of README.md and docs/."""
    found = []
    for name in _tracked("README.md", "docs"):
        if not name.endswith(".md"):
            continue
        page = ROOT / name
        for m in LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            found.append((name, str((page.parent / target).resolve().relative_to(ROOT.resolve()))))
    return found


def test_the_scan_finds_citations_and_links():
    # A scan that matches nothing would pass below without checking anything.
    assert len(citations()) > 20 and len(links()) > 20


@pytest.mark.parametrize("kind", ["citations", "links"])
def test_every_cited_file_exists(kind):
    found = citations() if kind == "citations" else links()
    missing = sorted({f"{where}: {cited}" for where, cited in found if not (ROOT / cited).exists()})
    assert missing == [], "cited but not in the repository:\n" + "\n".join(missing)


def test_a_missing_citation_is_caught(tmp_path):
    text = "see docs/no-such-page.md and HEAD.md"
    assert [m.group(1) for m in CITED.finditer(text)] == ["docs/no-such-page.md", "HEAD.md"]
