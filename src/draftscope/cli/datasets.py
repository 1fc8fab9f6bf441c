"""`invoke datasets` (the prompt sets the kit ships) and `invoke datasets.import` (an original question file into
a prompt file): `draftscope.core.datasets` and `draftscope.core.importers` do the work; the tasks print."""

from __future__ import annotations

from pathlib import Path

from draftscope.bench.options import BENCHMARK, PLAN
from draftscope.cli.command import command, group
from draftscope.cli.render import console, print_json
from draftscope.core import datasets as D
from draftscope.core import importers as I
from draftscope.core.jsonio import read_json
from draftscope.core.options import Option, OptionTable

LIST = OptionTable.of(PLAN.only("json").changed("json", help="print as JSON"))
IMPORT = OptionTable.of(
    Option(
        "file",
        "the original question file (mt-bench, spec-bench: question.jsonl; speed-bench: its prepared test.parquet, "
        "or those rows as JSON lines)",
        positional=True,
    ),
    BENCHMARK.only("output").changed(
        "output",
        help="the prompt file to write (JSON; must not exist)",
        metavar="FILE",
        required=True,
        fix="add --output PROMPTS.json (a new file)",
    ),
    Option(
        "format",
        "its format",
        choices=I.FORMATS,
        required=True,
        metavar="FORMAT",
        fix=f"add --format, one of: {', '.join(I.FORMATS)}",
    ),
    Option("name", "the prompt set's name", default_text="the format"),
    Option("description", "a description to record in the file"),
)


@command(name="list", table=LIST)
def list_(c, **values):
    """The prompt sets the kit ships and the formats one imports.

    The prompt sets: the ones shipped (name, prompts, source, commit, licence) and the formats one imports."""
    rows = []
    for name, up in D.UPSTREAM.items():
        path = D.shipped(name).path if name in D.SHIPPED else None
        rows.append(
            {
                "name": name,
                "shipped": path is not None,
                "prompts": len(read_json(path)["prompts"]) if path else None,
                "repository": up.repository,
                "path": up.path,
                "commit": up.commit or None,
                "licence": up.licence,
                "sha256": up.sha256 or None,
                "not_shipped": up.not_shipped,
            }
        )
    if values["json"]:
        print_json(rows)
        return
    out = console()
    for row in rows:
        where = f"{row['repository']} {row['path']}" + (f" @ {row['commit']}" if row["commit"] else "")
        if row["shipped"]:
            out.print(f"{row['name']}: {row['prompts']} prompts (--dataset {row['name']}); {row['licence']}")
        else:
            out.print(f"{row['name']}: not shipped ({row['not_shipped']}); {row['licence']}")
        out.print(f"  source: {where}", highlight=False)
    out.print(
        f"import a file of one of these formats ({', '.join(I.FORMATS)}): invoke datasets.import FILE --format F"
    )


@command(name="import", table=IMPORT)
def import_(c, **values):
    """Convert an original question file into a prompt file.

    Convert an original question file into a prompt file (first turn of each question; provenance recorded)."""
    fmt, output = values["format"], values["output"]
    doc = I.convert(
        fmt, Path(values["file"]), name=values["name"] or fmt, description=values["description"] or ""
    )
    I.write_new(doc, Path(output))
    source = doc["source"]
    known = f", {source['repository']} @ {source['commit'][:12]}" if "commit" in source else ""
    print(
        f"{output}: {len(doc['prompts'])} prompts from {source['file']} (sha256 {source['sha256']}{known}); "
        f"first turns only, {source['later_turns_dropped']} later turns dropped"
    )


ns_datasets = group("datasets", list_, import_)
ns_datasets.default = "list"
