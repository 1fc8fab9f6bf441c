"""docs/use/pipeline-dry-run.md is what the tiny pipeline's dry run prints today.

The page shows a reader every stage's command without running anything; a page written by hand drifts the first
time an argv changes. This test runs the documented command and compares, with the two things that differ from
machine to machine (the checkout's path and the interpreter's) written as `<checkout>` and `<python>`. After a change
to a stage's argv, write the page again: `.venv/bin/python tests/unit/docs/test_dry_run_page.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: this folder's parent is where support.py lives
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support import ROOT, run_invoke

PAGE = ROOT / "docs" / "use" / "pipeline-dry-run.md"
ARGS = (
    "pipeline",
    "--preset",
    "tiny",
    "--runtime",
    "local",
    "--stage",
    "regen,pretokenize,prepare,hsextract,train,convert",
    "--workdir",
    "runs/tiny-pipeline",
    "--dry-run",
)
HEADER = """# The tiny pipeline's dry run

What `invoke pipeline --dry-run` prints for the tiny preset on the CPU (the command of
[pipeline.md](pipeline.md#on-a-cpu-the-tiny-preset), with `--dry-run`): every stage in order, the image it would run
in with another runtime, the exact command the local runtime runs, the processes it starts and the notes the plan
makes. Nothing is created and no torch is imported. `<checkout>` stands for the repository's folder and `<python>`
for the interpreter that runs the kit; a test (`tests/unit/docs/test_dry_run_page.py`) runs the command and
compares it with this page, so the page is what the kit prints today.

```sh
invoke {args}
```

```
{output}```
"""


def page() -> str:
    result = run_invoke(*ARGS, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout.replace(sys.executable, "<python>").replace(str(ROOT), "<checkout>")
    return HEADER.format(args=" ".join(ARGS), output=output)


def test_the_page_is_what_the_dry_run_prints():
    expected = page()
    assert "<checkout>/runs/tiny-pipeline" in expected and str(ROOT) not in expected
    assert PAGE.read_text(encoding="utf-8") == expected, (
        f"{PAGE.relative_to(ROOT)} is not what the dry run prints: write it again with "
        f"`.venv/bin/python tests/unit/docs/test_dry_run_page.py`"
    )


if __name__ == "__main__":
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
