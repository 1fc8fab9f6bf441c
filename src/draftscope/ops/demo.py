"""`make demo` / `invoke demo`: the whole kit on a CPU in minutes, on models it builds itself, nothing downloaded.

Steps, each a real command run as a user would run it (its output in `<demo>/logs/<step>.log`, and shown as it
comes, with a line at least every 6 s), with a progress line and its duration:

1. check the shipped tiny models against the hashes in presets/models/tiny.yaml (a mismatch is an error — the
   demo never rebuilds them silently);
2. the Transformers baseline benchmark on the tiny target;
3. the speculative benchmark with the tiny draft, dense head;
4. the same with the prefix-conditioned head (shadow mode on, calls captured), then `head-study` of those calls;
5. the draft-training pipeline on the tiny preset, regen through convert (speculators' trainer needs its own
   environment: `--train-python`, which `make demo` sets up);
6. `validate` of every run directory and of the pipeline workdir, `compare` of 3 and 4 against 2, then `analyze`
   with a report, which puts those comparisons at its top.

It ends with a summary in one speed measure, named (request latency, as `compare` measures it: the speedup with its
interval and verdict), the acceptance ledger (mean acceptance length pooled over steps, rate, per position), the
head's fallbacks, whether the speculative
runs' tokens equal the baseline's for every prompt (checked here, from the records), the tiny target's recorded
validation loss and top-1 probability, and the path of `report.html`. Everything lands in a new `runs/demo-<time>/`.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftscope.analysis.verdict import sentence as verdict_sentence
from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.outputs import check_output_path
from draftscope.core.presets import load_model_preset
from draftscope.core.progress import print_tail
from draftscope.core.provenance import now
from draftscope.core.summary import read_records
from draftscope.ops.streaming import run_streamed

PROMPTS = "examples/prompts.json"
REPEATS = 3
FIXED_TOKENS = 64  # EOS suppressed: every run generates the same number of tokens, as the tiny build measured
DRAFT_TOKENS = 4
MIN_TOKENS_PER_CALL = 2.0


@dataclass
class Step:
    key: str
    title: str
    argv: list[str]
    python: str = sys.executable
    seconds: float = 0.0
    ok: bool = False


@dataclass
class Demo:
    root: Path
    train_python: str
    steps: list[Step] = field(default_factory=list)

    def run_dir(self, name: str) -> Path:
        return self.root / name


def free_loopback_port() -> int:
    """A port nothing listens on now, as the kernel hands out for an ephemeral bind."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def invoke(*args: str) -> list[str]:
    return ["-m", "invoke", *args]


def bench_args(out: Path, *extra: str) -> list[str]:
    return invoke(
        "benchmark",
        "--backend",
        "transformers",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--runtime",
        "local",
        "--prompts",
        PROMPTS,
        "--repeats",
        str(REPEATS),
        "--fixed-tokens",
        str(FIXED_TOKENS),
        "--output",
        str(out),
        *extra,
    )


def plan_steps(demo: Demo) -> list[Step]:
    r = demo.run_dir
    spec = ("--draft", "tiny", "--draft-tokens", str(DRAFT_TOKENS))
    runs = [r("baseline"), r("speculative"), r("prefix")]
    return [
        Step(
            "models", "check the tiny models against their recorded hashes", invoke("tiny.build", "--check")
        ),
        Step("baseline", "baseline benchmark (tiny target, greedy)", bench_args(runs[0])),
        Step("speculative", "speculative benchmark (tiny draft, dense head)", bench_args(runs[1], *spec)),
        Step(
            "prefix",
            "speculative benchmark (prefix head, shadow, capture)",
            bench_args(runs[2], *spec, "--head", "prefix", "--head-shadow", "--capture-head", "200"),
        ),
        Step(
            "head-study",
            "head study of the captured calls",
            invoke("head-study", str(runs[2]), "--output", str(r("head-study"))),
        ),
        Step(
            "pipeline",
            "pipeline on the tiny preset, regen through convert",
            invoke(
                "pipeline",
                "--preset",
                "tiny",
                "--runtime",
                "local",
                "--stage",
                "regen,pretokenize,prepare,hsextract,train,convert",
                "--workdir",
                str(r("pipeline")),
                # Loopback ports free when the demo starts, not the stages' defaults: a server another pipeline
                # left on a default port is refused by the stage (`servers.port_answers`), never talked to.
                "--opts",
                f"regen.base_port={free_loopback_port()}",
                "--opts",
                f"hsextract.base_port={free_loopback_port()}",
            ),
            python=demo.train_python,
        ),
        Step(
            "validate",
            "validate every run directory and the pipeline workdir",
            [
                *invoke("validate", str(runs[0])),
                "&&",
                *invoke("validate", str(runs[1])),
                "&&",
                *invoke("validate", str(runs[2])),
                "&&",
                *invoke("validate", str(r("pipeline"))),
            ],
        ),
        Step(
            "compare-speculative",
            "compare speculative (dense head) against the baseline",
            invoke(
                "compare", str(runs[0]), str(runs[1]), "--output", str(r("comparisons") / "speculative.json")
            ),
        ),
        Step(
            "compare-prefix",
            "compare speculative (prefix head) against the baseline",
            invoke("compare", str(runs[0]), str(runs[2]), "--output", str(r("comparisons") / "prefix.json")),
        ),
        Step(
            "analyze",
            "analyze the benchmark runs with the comparisons, write the report",
            invoke(
                "analyze",
                str(runs[0]),
                *(w for run in runs[1:] for w in ("--run", str(run))),
                "--comparison",
                str(r("comparisons")),
                "--report",
                str(r("report")),
            ),
        ),
    ]


def run_step(step: Step, demo: Demo, say: Callable[[str], None] = print) -> None:
    """Run one step (several commands joined by `&&` run in turn); its output goes to its log and, line by line,
    to `say`."""
    log = demo.root / "logs" / f"{step.key}.log"
    commands: list[list[str]] = [[]]
    for word in step.argv:
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    started = time.monotonic()
    env = settings.child_env({settings.PYTHONUNBUFFERED.name: "1"})
    say(f"    log: {log}")
    for words in commands:
        with log.open("ab") as out:
            out.write(("$ " + " ".join(["python", *words]) + "\n").encode())
        code = run_streamed([step.python, *words], log, say=say, label=step.key, env=env)
        if code != 0:
            step.seconds = time.monotonic() - started
            print_tail(log, say)
            raise UserError(
                f"demo step '{step.title}' failed (exit {code}); the last lines of its log are above",
                fix=f"read {log}",
            )
    step.seconds = time.monotonic() - started
    step.ok = True


# --- the summary ----------------------------------------------------------------------------------------------


def tokens_match(base: Path, other: Path) -> tuple[int, int]:
    """(prompt × repeat pairs compared, identical) between two runs' generated token ids."""
    ref = {(r["prompt_id"], r["repeat"]): r["generated_token_ids"] for r in read_records(base)}
    pairs = [(ref.get((r["prompt_id"], r["repeat"])), r["generated_token_ids"]) for r in read_records(other)]
    return len(pairs), sum(a == b for a, b in pairs)


def ledger(run: Path) -> dict | None:
    """The run's acceptance ledger (core/acceptance.py) from its summary."""
    return read_json(run / "summary.json", expect=dict)["overall"].get("acceptance")


def median_seconds(run: Path) -> float | None:
    stats = read_json(run / "summary.json", expect=dict)["overall"].get("request_seconds")
    return stats["median"] if stats else None


def speed_line(label: str, run: Path, comparison: Path | None) -> str:
    """One run in the demo's one speed measure: request latency, and the speedup compare measured."""
    seconds = median_seconds(run)
    line = f"{label:26s} request latency {seconds:.4f} s (median)" if seconds else f"{label:26s} no records"
    if comparison is None:
        return line
    doc = read_json(comparison, expect=dict)
    ci = doc["ci"]
    interval = (
        f", {doc['confidence']:.0%} interval [{1 / ci['high']:.3f}×, {1 / ci['low']:.3f}×]" if ci else ""
    )
    noise = doc["noise_band"]
    band = f", A/A noise band ±{noise['half_width']:.2%}" if noise and noise["half_width"] is not None else ""
    return (
        f"{line}; speedup {1 / doc['median_ratio']:.3f}×{interval}; verdict "
        f"{doc['verdict']['decision'].replace('_', ' ')} at {doc['threshold']:.2%}{band}"
    )


def draft_line(book: dict | None) -> tuple[str, bool]:
    """The draft's acceptance in words, its notation explained where it is printed; and whether it reaches the
    demo's floor (MIN_TOKENS_PER_CALL tokens per verification step)."""
    if not book:
        return "draft: no acceptance figures in the speculative run  <-- MISSING", False
    per_call = book["mean_pooled"]
    enough = per_call >= MIN_TOKENS_PER_CALL
    positions = " ".join(f"{p:.2f}" for p in book["per_position"] or () if p is not None)
    rate = f"{book['rate']:.3f}" if book["rate"] is not None else "—"
    return (
        f"draft at k={DRAFT_TOKENS}: mean acceptance length {per_call:.3f} tokens per verification step (L = "
        f"accepted drafts + 1: 1 when no draft token is kept, {DRAFT_TOKENS + 1} when all {DRAFT_TOKENS} are; "
        f"pooled over {book['steps']} steps); the demo checks it is at least {MIN_TOKENS_PER_CALL:g}: "
        f"{'met' if enough else 'NOT MET  <-- BELOW'}; acceptance rate {rate} (accepted / proposed drafts), "
        f"per draft position [{positions}]"
    ), enough


def summary_lines(demo: Demo) -> tuple[list[str], bool]:
    r = demo.run_dir
    ok = True
    lines = ["", "draftscope demo — summary", ""]
    measured = (
        (load_model_preset("tiny").kit_model.measured or {}) if load_model_preset("tiny").kit_model else {}
    )
    lines.append(
        f"tiny target: validation loss {measured.get('target_validation_loss')}, mean top-1 probability "
        f"{measured.get('target_mean_top1_prob')} (recorded at build time, presets/models/tiny.yaml)"
    )
    lines.append(
        "speed, one measure: request latency (prefill included); speedup = base / candidate, the median over "
        "prompts of the paired latency ratio (invoke compare). Timings of a tiny model on a shared CPU are "
        "noise-bound: the result that holds here is exactness (the tokens lines below)"
    )
    for name, label in (
        ("baseline", "baseline"),
        ("speculative", "speculative, dense head"),
        ("prefix", "speculative, prefix head"),
    ):
        comparison = None if name == "baseline" else r("comparisons") / f"{name}.json"
        lines.append(speed_line(label, r(name), comparison))
        if comparison is not None:
            lines.append(f"  → {verdict_sentence(read_json(comparison, expect=dict))}")
    line, enough = draft_line(ledger(r("speculative")))
    lines.append(line)
    ok &= enough
    head = read_json(r("prefix") / "summary.json", expect=dict).get("head") or {}
    lines.append(
        f"prefix head: {head.get('calls', 0)} verification calls, {head.get('certified', 0)} of "
        f"{head.get('rows', 0)} rows certified; dense fallbacks {head.get('dense_calls_prefix', 0)} "
        f"(row-wise rule: {head.get('dense_calls_rowwise', 0)}); shadow disagreements "
        f"{head.get('shadow_disagreements', 0)}"
    )
    ok &= head.get("shadow_disagreements", 1) == 0
    study = read_json(r("head-study") / "study.json", expect=dict)
    lines.append(
        f"head study: {study['calls']} captured calls; fallbacks row-wise {study['fallback_rowwise']} vs "
        f"prefix {study['fallback_prefix']}; disagreements {study['disagreements']}"
    )
    for name in ("speculative", "prefix"):
        compared, same = tokens_match(r("baseline"), r(name))
        identical = compared > 0 and same == compared
        ok &= identical
        lines.append(
            f"tokens, {name} vs baseline: {same} of {compared} generations identical"
            + ("" if identical else "  <-- MISMATCH")
        )
    pipeline = r("pipeline")
    stages = sorted(p.stem for p in (pipeline / "stages").glob("*.json") if "." not in p.stem)
    lines.append(
        f"pipeline: {len(stages)} stage(s) completed ({', '.join(stages)}); converted draft in "
        f"{pipeline / 'draft'}"
    )
    lines.append(f"report: {r('report') / 'report.html'}")
    lines.append("durations: " + ", ".join(f"{s.key} {s.seconds:.0f} s" for s in demo.steps))
    return lines, ok


def main(*, output: str | None, train_python: str | None, say: Callable[[str], None] = print) -> int:
    stamp = now().replace(":", "").replace("-", "").split(".")[0]
    root = Path(output) if output else Path("runs") / f"demo-{stamp}"
    python = train_python or settings.DRAFTSCOPE_TRAIN_PYTHON.get()
    if not python or not Path(python).exists():
        raise UserError(
            "the pipeline step needs an environment with speculators 0.9.0",
            field="--train-python",
            value=python,
            fix="use `make demo` (it sets one up in .venv-train), or pass --train-python PATH/bin/python",
        )
    check_output_path(root, "--output")
    try:
        (root / "logs").mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise UserError(
            "the demo folder exists; runs are never overwritten",
            field="--output",
            value=str(root),
            fix="choose a new path",
        ) from None
    demo = Demo(root, python)
    demo.steps = plan_steps(demo)
    started = time.monotonic()
    say(f"draftscope demo → {root}")
    for i, step in enumerate(demo.steps, 1):
        say(f"[{i}/{len(demo.steps)}] {step.title} …")
        run_step(step, demo, say)
        say(
            f"[{i}/{len(demo.steps)}] {step.title}: done in {step.seconds:.1f} s "
            f"(total {time.monotonic() - started:.0f} s)"
        )
    lines, ok = summary_lines(demo)
    for line in lines:
        say(line)
    (root / "summary.txt").write_text("\n".join(lines) + "\n")
    say(
        f"demo finished in {time.monotonic() - started:.0f} s"
        + ("" if ok else " — WITH FAILED CHECKS (above)")
    )
    return 0 if ok else 1


def steps_for_display(root: Path, python: str) -> Sequence[Step]:
    """The planned steps (for tests and `--dry-run`)."""
    demo = Demo(root, python)
    return plan_steps(demo)
