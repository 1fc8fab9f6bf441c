"""Analysis commands: `analyze`, `compare`, `reproduce` (ANALYSIS_TASKS) and `evidence.verify|add`.

Thin like the rest of the command line: parse options, call `draftscope.analysis`, print. Host side: no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit

from draftscope.analysis.evidence import add as add_evidence
from draftscope.analysis.evidence import check_study_inputs, load_study, research_dir
from draftscope.analysis.evidence import verify as verify_evidence
from draftscope.analysis.leaderboard import METRICS, leaderboard_table, ranked
from draftscope.analysis.load import load_run, load_runs
from draftscope.analysis.output import refuse_existing
from draftscope.bench.options import BENCHMARK
from draftscope.cli.command import command, group
from draftscope.cli.render import console
from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable
from draftscope.ops.share import rewrite_host_paths

# The bootstrap holds every resample's median in memory and takes time in proportion: a million gives a 95% interval
# whose ends move by far less than any threshold, in seconds; a larger number only risks the machine.
MAX_RESAMPLES = 1_000_000
# `compare`'s admission rule when neither the options nor a study give it.
DEFAULT_THRESHOLD, DEFAULT_RESAMPLES, DEFAULT_SEED = "1%", 10_000, 0
# The one `--output` row of the kit (the benchmark's run directory); each command says what its output is.
OUTPUT = BENCHMARK.only("output")


def _file_name(value: str, flag: str) -> Path:
    """An output file's path: it must end in a file name (not `/`, `.` or `..`)."""
    path = Path(value)
    if not path.name or path.name == "..":
        raise UserError(
            "not a file name", field=flag, value=value, fix="give a file path, e.g. comparisons/x.json"
        )
    return path


ANALYZE = OptionTable.of(
    Option("path", "a run directory; a folder of run directories stands for each of them", positional=True),
    Option(
        "run",
        "one more run directory or folder: analyze A --run B --run C (draftscope analyze A B C)",
        repeatable=True,
        metavar="DIR",
    ),
    Option(
        "report",
        "also write a report folder here (must not exist): report.md, report.html, PNG figures",
        metavar="DIR",
    ),
    Option(
        "comparison",
        "a comparison.json from `invoke compare`, or a folder of them; those in comparisons/ here and beside the "
        "runs are found without it",
        repeatable=True,
        metavar="PATH",
    ),
    Option(
        "sort",
        "rank the runs by one metric, best first, in a leaderboard",
        choices=tuple(METRICS),
        metavar="METRIC",
    ),
)


@command(table=ANALYZE, variadic="run")
def analyze(c, **values):
    """Tabulate runs side by side, with a leaderboard and their comparisons.

    Tabulate runs (backend, model@revision, images, hardware, prompts hash, completed/partial, medians with
    min–max of request and decode tok/s, TTFT and inter-token latency p50/p90/p99, mean acceptance length, rate and
    per position, greedy agreement), a leaderboard by one metric (--sort) and the comparisons of these runs
    (speedup, interval, verdict, noise band); optionally write a report."""
    # lazy: jinja2, matplotlib and numpy, only when a report is written
    from draftscope.analysis.comparisons import find_comparisons
    from draftscope.analysis.report import comparisons_table, runs_table, write_report

    sort, report = values["sort"], values["report"]
    loaded = load_runs([values["path"], *(values["run"] or ())])
    if sort is not None:
        loaded = [r for r, _ in ranked(loaded, sort)]
    shown, notes = find_comparisons(loaded, values["comparison"] or ())
    out = console()
    if shown:
        out.print(comparisons_table(shown))
    if sort is not None:
        out.print(leaderboard_table(loaded, sort))
    out.print(runs_table(loaded))
    for found in loaded:
        for note in found.notes:
            out.print(f"note: {found.run_id}: {note}")
    for note in notes:
        out.print(f"note: {note}")
    if report:
        files = write_report(loaded, Path(report), shown, sort)
        pngs = sum(f.suffix == ".png" for f in files)
        out.print(
            f"report: {report}/report.md, {report}/report.html and {pngs} figure(s)"
            + (f"; {len(shown)} comparison(s) at the top" if shown else "")
        )


# The threshold, resamples and seed have their defaults in words only (`default_text`): a study freezes them, and
# any of them given beside --study is refused, so the body must see which were typed.
COMPARE = OptionTable.of(
    Option("base", "the base run directory", positional=True),
    Option("candidate", "the candidate run directory", positional=True),
    Option(
        "threshold",
        "admission threshold: the candidate must be faster by more than this (e.g. 1% or 0.01)",
        metavar="N%|FRACTION",
        default_text=DEFAULT_THRESHOLD,
    ),
    Option(
        "resamples",
        "bootstrap resamples",
        kind=int,
        minimum=1,
        maximum=MAX_RESAMPLES,
        fix="each resample is held in memory and computed; the 95% interval is settled long before this, "
        "so give e.g. --resamples 10000",
        default_text=str(DEFAULT_RESAMPLES),
    ),
    Option("seed", "bootstrap seed (recorded)", kind=int, minimum=0, default_text=str(DEFAULT_SEED)),
    Option(
        "allow_subset",
        "compare the shared prompts when the prompt sets differ (the missing ones are named)",
        kind=bool,
    ),
    OUTPUT.changed(
        "output",
        help="comparison file to create (never overwritten)",
        metavar="FILE",
        default_text="comparisons/BASE__CANDIDATE.json",
    ),
    Option(
        "study",
        "take the frozen threshold, resamples and seed from research/studies/STUDY.yaml",
        metavar="STUDY",
    ),
    Option(
        "allow_unfinished",
        "compare a run that did not complete (running, failed, timed out, interrupted): its finished records "
        "only, the comparison marked partial",
        kind=bool,
    ),
)


@command(table=COMPARE)
def compare(c, **values):
    """Is CANDIDATE faster than BASE? Paired ratios, CI, verdict, token check.

    Paired per-prompt latency ratios of CANDIDATE vs BASE, median with a bootstrap 95% CI, admission verdict,
    A/A noise band and greedy token check; writes comparison.json and a figure."""
    # lazy: numpy (and matplotlib for the figure), only for `compare`
    from draftscope.analysis.compare import (
        compare_runs,
        default_output,
        refuse_unfinished,
        summary_lines,
        write_comparison,
    )
    from draftscope.analysis.stats import parse_threshold

    study, threshold, resamples, seed = (values[k] for k in ("study", "threshold", "resamples", "seed"))
    frozen = _study_admission(study, (threshold, resamples, seed)) if study else {}
    # The threshold and the output's name first (the table checked the numbers): a bad one is refused before any
    # run is read.
    limit = parse_threshold(threshold or DEFAULT_THRESHOLD)
    named = _file_name(values["output"], "--output") if values["output"] else None
    b, cand = load_run(values["base"]), load_run(values["candidate"])
    refuse_unfinished((b, cand), allowed=values["allow_unfinished"])
    if study:
        check_study_inputs(frozen["protocol"], {r.run_id: r.prompts_sha256 for r in (b, cand)})
    path = named or default_output(b, cand)
    for existing in (path, path.with_suffix(".png")):
        refuse_existing(existing, "--output")  # before any work
    doc = compare_runs(
        b,
        cand,
        threshold=frozen.get("threshold", limit),
        resamples=frozen.get("resamples", DEFAULT_RESAMPLES if resamples is None else resamples),
        seed=frozen.get("seed", DEFAULT_SEED if seed is None else seed),
        allow_subset=values["allow_subset"],
        study=study,
        argv=sys.argv,
    )
    write_comparison(doc, path)
    print("\n".join(summary_lines(doc)))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    tokens = doc["tokens"]
    if tokens["expected_identical"] and tokens["first_mismatch"] is not None:
        raise Exit(code=1)


def _study_admission(study: str, given: tuple) -> dict:
    """The study's frozen admission rule; a conflicting command-line value would unfreeze it, so it is refused."""
    if any(v is not None for v in given):
        raise UserError(
            "a study freezes the threshold, resamples and seed",
            field="--study",
            fix="drop --threshold/--resamples/--seed, or compare without --study",
        )
    protocol = load_study(study)
    return {"protocol": protocol, **{k: protocol["admission"][k] for k in ("threshold", "resamples", "seed")}}


REPRODUCE = OptionTable.of(
    Option("run", "the completed run directory to reproduce", positional=True),
    OUTPUT.changed(
        "output",
        help="the new run directory (must not exist)",
        required=True,
        fix="add --output runs/NEW (a new path)",
    ),
    Option(
        "allow_image_drift",
        "reproduce even if an image's ID/digest changed since the run (recorded)",
        kind=bool,
    ),
    Option(
        "comparison",
        "comparison file to create",
        metavar="FILE",
        default_text="comparisons/RUN__NEW.json",
    ),
    COMPARE.only("threshold").changed(
        "threshold", help="threshold for the timing verdict", default=DEFAULT_THRESHOLD, default_text=None
    ),
)


@command(table=REPRODUCE)
def reproduce(c, **values):
    """Re-run RUN from its manifest alone, then compare with the original.

    Re-run RUN from its manifest alone (frozen config, hash-checked prompts, same runtime and images), then
    compare: greedy token ids must be identical; timing is reported as ratios."""
    # lazy: numpy, only for `reproduce`
    from draftscope.analysis.compare import summary_lines
    from draftscope.analysis.stats import parse_threshold
    from draftscope.bench.reproduce import reproduce as run_reproduction

    comparison = values["comparison"]
    doc, path = run_reproduction(
        Path(values["run"]),
        Path(values["output"]),
        allow_image_drift=values["allow_image_drift"],
        comparison=_file_name(comparison, "--comparison") if comparison else None,
        threshold=parse_threshold(values["threshold"]),
        argv=sys.argv,
    )
    print("\n".join(summary_lines(doc)))
    identical = doc["reproduction"]["tokens_identical"]
    print(f"reproduction: token ids {'identical' if identical else 'DIFFER'}; wrote {path}")
    if not identical:
        raise Exit(code=1)


ANALYSIS_TASKS = [analyze, compare, reproduce]


RESEARCH_ROOT = Option("root", "the research folder", metavar="DIR", default_text="research/ of the checkout")
VERIFY = OptionTable.of(
    RESEARCH_ROOT,
    Option(
        "strict",
        "fail where there is no git history to check (an sdist, an export, a shallow clone)",
        kind=bool,
    ),
)


@command(table=VERIFY)
def verify(c, **values):
    """Check the research evidence: hashes, schemas, protocol-before-result.

    Check every hash in research/SHA256SUMS, validate every evidence artifact against its schema, and check
    through git history that each study's protocol was committed before its results, each measured from a clean
    commit (research/SUPERSEDED.yaml lists older evidence: still hash-checked, never counted)."""
    folder = research_dir(values["root"])
    findings = verify_evidence(folder, strict=values["strict"])
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if not f.ok]
    if failed:
        raise Exit(
            f"error: {folder}: {len(failed)} problem(s); first: {failed[0].file}: {failed[0].detail}", code=1
        )
    superseded = sum(1 for f in findings if f.tag == "superseded")
    unchecked = " (git history not checked)" if any(f.tag == "warn" for f in findings) else ""
    kept = f"; {superseded} superseded path(s) hash-checked, not counted" if superseded else ""
    print(f"{folder}: evidence verified ({len(findings)} check(s){kept}){unchecked}")


ADD = OptionTable.of(
    ANALYZE.only("path").changed(
        "path", help="a run directory, a comparison .json or a measurement .json (a head-bench report) to add"
    ),
    COMPARE.only("study").changed(
        "study",
        help="the study it belongs to (research/studies/STUDY.yaml)",
        required=True,
        fix="add --study NAME (research/studies/NAME.yaml)",
    ),
    RESEARCH_ROOT,
)


@command(table=ADD)
def add(c, **values):
    """Copy a run or measurement into research/evidence/ (never over one).

    Copy a run, a comparison or a measurement into research/evidence/STUDY/ without overwriting, and update
    SHA256SUMS."""
    study = values["study"]
    folder = research_dir(values["root"])
    rewritten: list[Path] = []
    files = add_evidence(
        folder, Path(values["path"]), study, scrub=lambda target: rewritten.extend(rewrite_host_paths(target))
    )
    print(f"added {len(files)} file(s) under {folder}/evidence/{study}/ and their SHA-256 to SHA256SUMS")
    if rewritten:
        print(f"host paths rewritten as `invoke share` does (<run>, ~, …/NAME) in {len(rewritten)} of them")


ns_evidence = group("evidence", verify, add)
