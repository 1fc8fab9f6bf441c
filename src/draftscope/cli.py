"""The host command line: invoke tasks. Thin by design — each task parses options, calls the library, prints.

`tasks.py` at the top of the checkout re-exports this namespace, so `invoke plan` works there; the
`draftscope` console script runs the same tasks anywhere the package is installed.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from invoke import Collection, Exit, Program, task

from draftscope import __version__
from draftscope.errors import UserError

DEFAULT_EXPERIMENTS = ("transformers-baseline", "vllm-int4-dflash2", "vllm-int4-dflash2-prefix")


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A UserError becomes one line on stderr and exit code 2; anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            raise Exit(f"error: {exc.render()}", code=2) from None

    return wrapper


@task(
    iterable=["experiment", "opts"],
    help={
        "experiment": "experiment preset to plan (repeatable; default: the baseline, INT4 + DFlash2, and prefix)",
        "prompts": "prompt file (JSON, see schemas/prompts.schema.json)",
        "opts": "override a config field, key=value (repeatable), e.g. repeats=3",
        "json": "print the plan as JSON",
    },
)
@user_errors
def plan(c, experiment=None, prompts=None, opts=None, json=False):
    """Print the experiment plan: backends, images, model + revision, prompts + hash, repeats, limits, downloads."""
    from draftscope.images import image_reference
    from draftscope.plan import plan_benchmark
    from draftscope.presets import load_experiment
    from draftscope.render import plan_lines

    names = experiment or list(DEFAULT_EXPERIMENTS)
    plans = [plan_benchmark(load_experiment(n, {"prompts": prompts}, opts or ())) for n in names]
    if json:
        _print_json([p.to_dict() for p in plans])
        return
    for i, p in enumerate(plans):
        if i:
            print()
        print("\n".join(plan_lines(p, image_reference)))


@task(help={"show": "print one preset (model or experiment), fully resolved, as YAML"})
@user_errors
def presets(c, show=None):
    """List the model and experiment presets, or show one resolved."""
    from draftscope import presets as P
    from draftscope.render import console, preset_table, yaml_text

    if show:
        if show in P.model_preset_names():
            print(yaml_text(P.load_model_preset(show)), end="")
        else:
            print(yaml_text(P.load_experiment(show)), end="")
        return
    out = console()
    models = [P.load_model_preset(n) for n in P.model_preset_names()]
    experiments = [P.load_experiment(n) for n in P.experiment_preset_names()]
    for table in preset_table(models, experiments):
        out.print(table)


@task(help={"run_dir": "the run directory to check"})
@user_errors
def validate(c, run_dir):
    """Validate every artifact of a run directory against its schema: one verdict line per file."""
    from draftscope.validate import validate_run

    report = validate_run(run_dir)
    for verdict in report.verdicts:
        print(verdict.line())
    if not report.ok:
        failed = sum(not v.ok for v in report.verdicts)
        raise Exit(f"{run_dir}: {failed} of {len(report.verdicts)} file(s) failed validation", code=1)
    print(f"{run_dir}: all {len(report.verdicts)} file(s) valid")


@task(help={"json": "print the report as JSON"})
@user_errors
def doctor(c, json=False):
    """Report the host: NVIDIA GPUs and dtype policy, driver/CUDA, memory, disk, container engine, kit images."""
    from draftscope import doctor as D

    report = D.collect()
    if json:
        _print_json(report)
    else:
        print("\n".join(D.render(report)))


@task
def version(c):
    """Print the kit's version (and git commit when run from a checkout)."""
    from draftscope.provenance import kit_info

    info = kit_info()
    commit = (
        f" ({info['git_commit'][:12]}{'+dirty' if info['git_dirty'] else ''})" if info["git_commit"] else ""
    )
    print(f"draftscope {info['version']}{commit}")


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    print()


ns = Collection(plan, presets, validate, doctor, version)


def main() -> None:
    """The `draftscope` console script: the same tasks, usable outside a checkout."""
    Program(namespace=ns, version=__version__, name="draftscope", binary="draftscope").run()
