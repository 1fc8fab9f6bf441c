"""`invoke claims` (every claim of research/claims.yaml with its hardware, time and last verdict),
`invoke claims.reproduce ID` (check one claim in the pinned images; `make reproduce CLAIM=ID`) and
`invoke kick-the-tires` (every claim a CPU can check, from pulled images; `make kick-the-tires`)."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit

from draftscope.bench.options import PLAN
from draftscope.cli.command import command, group
from draftscope.cli.images import ENGINE
from draftscope.cli.render import console, print_json
from draftscope.core.images import checkout
from draftscope.core.options import Option, OptionTable
from draftscope.ops import claims as C
from draftscope.ops import kick as K
from draftscope.runtime.container import ContainerRuntime

VERDICTS = Option(
    "verdicts", "folder of the verdicts", metavar="DIR", default_text=f"{C.VERDICTS_DIR} of the checkout"
)
LIST = OptionTable.of(VERDICTS, PLAN.only("json").changed("json", help="print as JSON"))
REPRODUCE = OptionTable.of(
    Option("claim", "the claim's id (invoke claims lists them)", positional=True), VERDICTS, ENGINE
)
KICK = OptionTable.of(VERDICTS)


def _verdicts(root: Path, verdicts: str | None) -> Path:
    return Path(verdicts) if verdicts else root / C.VERDICTS_DIR


@command(name="list", table=LIST)
def list_(c, **values):
    """Every claim: origin, hardware, expected time, last verdict here.

    Every claim: origin, hardware, expected time, the command count and its last verdict here."""
    root = checkout()
    folder = _verdicts(root, values["verdicts"])
    rows = []
    for claim in C.load_claims(root):
        check, last = claim["check"], C.latest(folder, claim["id"])
        rows.append(
            {
                "claim": claim["id"],
                "origin": claim["origin"],
                "hardware": C.hardware_needed(check),
                "minutes": check.get("minutes"),
                "commands": len(check.get("commands", [])),
                "verdict": last["verdict"] if last else None,
                "verdict_at": last["finished_at"] if last else None,
                "shown": C.label(claim, last),
            }
        )
    if values["json"]:
        print_json(rows)
        return
    out = console()
    for row in rows:
        when = f" ({row['verdict_at']})" if row["verdict_at"] else ""
        time = f"~{row['minutes']:g} min" if row["minutes"] else "-"
        out.print(f"{row['claim']} ({row['origin']}; {row['hardware']}; {time})", highlight=False)
        out.print(f"  last verdict: {row['shown']}{when}", highlight=False)
    out.print(
        "check one: invoke claims.reproduce ID (make reproduce CLAIM=ID); all CPU ones: make kick-the-tires"
    )


@command(table=REPRODUCE)
def reproduce(c, **values):
    """Check one claim in the pinned images and write its verdict.

    Run a claim's commands in the pinned images, compare its figures and write verdict.json (never over one)."""
    root, claim = checkout(), values["claim"]
    found = C.find_claim(C.load_claims(root), claim)
    runtime = ContainerRuntime(values["engine"])
    ctx = C.Context(root=root, verdicts=_verdicts(root, values["verdicts"]), image_facts=runtime.image_facts)
    doc, path = C.reproduce(found, ctx)
    out = console()
    for row in doc["figures"]:
        mark = "ok  " if row["ok"] else "MISS"
        out.print(
            f"  {mark} {row['quantity']}: {row['measured']} (claimed {row['expected']})", highlight=False
        )
    out.print(f"{claim}: {C.label(found, doc)} — {doc['reason']}; wrote {path}", highlight=False)
    if doc["verdict"] in ("failed", "not_reproduced"):
        raise Exit(code=1)


@command(name="kick-the-tires", table=KICK)
def kick_the_tires(c, **values):
    """Every claim a CPU can check, from pulled images, as a table of verdicts.

    Every claim a CPU can check, from pulled images (published ones, else the ones built here pushed to a
    loopback registry and pulled into an empty engine), then a table of verdicts."""
    root = checkout()
    rows, work = K.kick(root, _verdicts(root, values["verdicts"]))
    lines = K.table(rows)
    (work / "verdicts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = console()
    for line in lines:
        out.print(line, highlight=False)
    out.print(f"wrote {work / 'verdicts.txt'} and {work / 'kick.json'}", highlight=False)
    if any(r["verdict"] in ("failed", "not_reproduced") for r in rows):
        raise Exit(code=1)


ns_claims = group("claims", list_, reproduce)
ns_claims.default = "list"
CLAIMS_TASKS = [kick_the_tires]
