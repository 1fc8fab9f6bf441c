"""In-container entry point: `python -m draftscope <command>`.

The only place that imports heavy runtimes (torch, vLLM, SGLang, speculators), lazily, per command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys

from draftscope import __version__
from draftscope.errors import UserError

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "vllm", "sglang", "speculators", "triton")


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a step may use, read from metadata (nothing is imported)."""
    found: dict[str, str | None] = {"python": platform.python_version(), "draftscope": __version__}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def selfcheck() -> dict[str, object]:
    """A cheap health check: the package imports, its schemas load and compile, versions are readable."""
    from draftscope import schema

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
    args = parser.parse_args(argv)
    try:
        if args.command == "selfcheck":
            print(json.dumps(selfcheck(), indent=2))
        elif args.command == "versions":
            print(json.dumps(versions(), indent=2))
    except UserError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
