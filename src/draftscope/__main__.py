"""In-container entry point: `python -m draftscope <command>`.

The only place that imports heavy runtimes (torch, vLLM, SGLang, speculators), lazily, per command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from draftscope import __version__
from draftscope.core import hub
from draftscope.core.errors import UserError, run_main
from draftscope.core.provenance import versions

# Modules that declare environment variables of their own (`core.settings.declare`, beside the code reading them),
# imported before the settings page is written so that it lists them too; tests/unit/core/test_settings.py checks
# that every module calling `declare` is here. The Slurm launcher's `execute/slurm/env.py` joins when it has one.
SETTINGS_MODULES: tuple[str, ...] = ("draftscope.execute.slurm.env",)


def settings_page() -> str:
    """docs/settings.md: every declared environment variable, the domain modules' included."""
    from draftscope.core import settings

    for name in SETTINGS_MODULES:
        importlib.import_module(name)
    return settings.markdown()


def selfcheck() -> dict[str, object]:
    """A cheap health check: the package imports, its schemas load and compile, versions are readable."""
    from draftscope.core import schema  # lazy: jsonschema, which `versions` and `fetch` do not need

    names = schema.schema_names()
    for name in names:
        schema.problems({}, name)  # compiles each schema and its $refs
    return {"ok": True, "schemas": len(names), "versions": versions()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftscope", description=__doc__)
    parser.add_argument("--version", action="version", version=f"draftscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("selfcheck", help="check that the kit works in this environment; print versions as JSON")
    sub.add_parser("versions", help="print the installed versions of the relevant packages as JSON")
    worker = sub.add_parser("worker", help="run a step's worker inside its image (started by the supervisor)")
    worker.add_argument("kind", choices=["benchmark"])
    worker.add_argument("--run-dir", required=True)
    fetch = sub.add_parser("fetch", help="download pinned hub snapshots into a cache (network step)")
    fetch.add_argument("--cache", required=True)
    fetch.add_argument("--repo", action="append", required=True)
    fetch.add_argument("--revision", action="append", required=True)
    sbom = sub.add_parser("sbom", help="write the CycloneDX SBOM of this environment (an image's build step)")
    sbom.add_argument("--image", required=True, help="the image this environment is: transformers, vllm, …")
    sbom.add_argument("--output", help="file to write (default: print it)")
    check = sub.add_parser(
        "argv-check",
        help="parse every command line the kit's plans emit for this image with the engines' parsers",
    )
    check.add_argument("--image", required=True, help="the image this environment is: vllm, train or sglang")
    check.add_argument("--commands", help="parse these planned commands (JSON, argv_check.to_json) instead")
    check.add_argument(
        "--draft",
        help="sglang: print what SGLang's model config and registry make of this converted draft (JSON)",
    )
    check.add_argument(
        "--algorithm", default="DFLASH", help="with --draft: the speculative algorithm (DFLASH)"
    )
    sgcheck = sub.add_parser(
        "sglang-cpu-check",
        help="the sglang-cpu image's self-check: serve a model SGLang's CPU kernel takes on its CPU engine, one "
        "completion, scrape /metrics; print the figures as JSON",
    )
    sgcheck.add_argument(
        "--work", required=True, help="an empty or new folder for the check model and the log"
    )
    sgcheck.add_argument("--port", type=int, default=30000, help="the loopback port to serve on")
    sgcheck.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to become healthy and to answer"
    )
    sgcheck.add_argument(
        "--prompts",
        help="also the target's greedy token ids for these prompts (a prompts file), as bench asks",
    )
    sgcheck.add_argument("--max-new-tokens", type=int, default=16, help="with --prompts: tokens per prompt")
    sgcheck.add_argument(
        "--model", help="serve this model folder (default: a seeded random Qwen3 SGLang's CPU kernel takes)"
    )
    page = sub.add_parser(
        "settings", help="print the environment variables the kit reads, passes on or sets (docs/settings.md)"
    )
    page.add_argument("--output", help="file to write, e.g. docs/settings.md (default: print it)")
    aot = sub.add_parser(
        "head-aot",
        help="compile the prefix head's Triton kernels for CUDA architectures into a Triton cache, without a GPU, "
        "and check that the engine's JIT would load them (the vllm image's build step)",
    )
    aot.add_argument("--cuda-arch", required=True, help="compute capabilities, e.g. 9.0 or '8.0;9.0'")
    aot.add_argument(
        "--cache-dir", help="the cache folder to fill (default: the image's, /opt/draftscope/triton-cache)"
    )
    aot.add_argument(
        "--model", action="append", help="a model preset to compile for (default: every hub preset)"
    )
    aot.add_argument(
        "--geometry", action="append", help="also a head of VOCAB:HIDDEN rows and columns (bf16)"
    )
    aot.add_argument("--jobs", type=int, help="architectures compiled at once (default: one per CPU)")
    args = parser.parse_args(argv)
    # A user error exits 2, running out of host or GPU memory 3 (the failure's reason, never a move to the CPU).
    return run_main(command, args)


def command(args: argparse.Namespace) -> int:
    if args.command == "selfcheck":
        print(json.dumps(selfcheck(), indent=2))
    elif args.command == "versions":
        print(json.dumps(versions(), indent=2))
    elif args.command == "worker":
        # lazy: the worker brings the backends, presets, yaml and jsonschema; the other commands start without them
        from draftscope.bench import worker as bench_worker

        return bench_worker.run(args.run_dir)
    elif args.command == "argv-check":
        from draftscope.ops import argv_check  # lazy: it plans the pipeline and imports the engines

        if args.draft:
            if args.image != "sglang":
                raise UserError(
                    "--draft is read by SGLang", field="--image", value=args.image, fix="--image sglang"
                )
            print(json.dumps(argv_check.sglang_draft_config(args.draft, args.algorithm), indent=2))
            return 0
        return argv_check.main(args.image, args.commands)
    elif args.command == "sglang-cpu-check":
        from draftscope.pipeline import sglang, sglang_cpu  # lazy: it writes a model and starts SGLang

        prompts = sglang.load_prompts(args.prompts) if args.prompts else ()
        result = sglang_cpu.self_check(
            Path(args.work),
            port=args.port,
            timeout=args.timeout,
            prompts=prompts,
            max_new_tokens=args.max_new_tokens,
            model=Path(args.model) if args.model else None,
            say=_say,
        )
        for line in sglang_cpu.check_lines(result):
            print(line, file=sys.stderr)
        print(json.dumps(result, indent=2))
    elif args.command == "fetch":
        return hub.fetch_snapshots(args.cache, list(zip(args.repo, args.revision, strict=True)))
    elif args.command == "head-aot":
        return head_aot(args)
    elif args.command == "settings":
        text = settings_page()
        if args.output:
            _write(args.output, text, "the settings page")
        else:
            sys.stdout.write(text)
    elif args.command == "sbom":
        from draftscope.core import sbom
        from draftscope.core.images import IMAGES

        if args.image not in IMAGES:
            raise UserError(
                "no such image", field="--image", value=args.image, fix=f"choose one of: {', '.join(IMAGES)}"
            )
        text = sbom.dumps(sbom.bom(args.image))
        if args.output:
            _write(args.output, text, "the SBOM")
        else:
            sys.stdout.write(text)
    return 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # progress on stderr: stdout is the JSON


def _write(path: str, text: str, what: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise UserError(
            f"cannot write {what}: {exc.strerror}",
            field="--output",
            value=path,
            fix="pass a file in an existing, writable folder",
        ) from None


def head_aot(args: argparse.Namespace) -> int:
    """`head-aot`: checks its arguments torch-free, then compiles (torch and triton, in the vllm image)."""
    from draftscope.core.cuda_arch import capabilities, validate_cuda_arch
    from draftscope.head import triton_cache

    archs = capabilities(args.cuda_arch, "--cuda-arch")
    extra = []
    for text in args.geometry or ():
        vocab, _, hidden = text.partition(":")
        if not (vocab.isdigit() and hidden.isdigit()):
            raise UserError("not VOCAB:HIDDEN", field="--geometry", value=text, fix="pass e.g. 151936:4096")
        extra.append((int(vocab), int(hidden)))
    # lazy: torch and triton, only for this build step
    from draftscope.head import triton_aot

    geometries = [
        *(triton_aot.preset_geometries(args.model) if args.model or not extra else []),
        *(triton_aot.Geometry(v, d, source=f"{v}:{d}") for v, d in extra),
    ]
    data = triton_aot.build(
        archs,
        validate_cuda_arch(args.cuda_arch),
        Path(args.cache_dir or triton_cache.IMAGE_CACHE),
        geometries,
        jobs=args.jobs,
    )
    summary = {
        "cache_dir": str(Path(args.cache_dir or triton_cache.IMAGE_CACHE).absolute()),
        "manifest": triton_cache.MANIFEST,
        "triton_version": data["triton_version"],
        "archs": data["archs"],
        "entries": [
            {k: e[k] for k in ("kernel", "arch", "target", "key_dir", "shared")} for e in data["entries"]
        ],
        "replay": data["replay"],
        "seconds": data["seconds"],
        "env": data["env"],
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
