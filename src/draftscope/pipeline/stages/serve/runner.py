"""serve in the container: start the SGLang instances, one short greedy request each, write the plan, stop them.

The smoke request must show verify steps (`meta_info.spec_verify_ct`): an instance that answers without speculating
fails the stage. `--hold` keeps the instances up until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.pipeline import servers, sglang, sglang_cpu
from draftscope.pipeline.base import NOTES, Command

SMOKE_PROMPT = "Count from one to twenty, separated by commas."
SMOKE_MAX_TOKENS = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    sglang.common_arguments(p)
    p.add_argument("--plan", required=True, help="where to write serve/plan.json (schema stage-serve)")
    p.add_argument("--draft-path", default=None, help="the draft folder (default: read from the server argv)")
    p.add_argument("--hold", action="store_true", help="keep serving until SIGINT/SIGTERM")


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Start the instances, send each one short greedy request, write the plan, stop them (or hold)."""
    commands = sglang.server_commands(args.commands)
    algorithm = sglang.speculative_algorithm(args.algorithm, commands)
    draft_path = (
        args.draft_path or sglang.argv_value(commands[0].argv, "--speculative-draft-model-path") or ""
    )
    plan_path = Path(args.plan)
    speculating = 0
    with servers.serving(
        commands,
        logs=sglang.logs_dir(args),
        stage="serve",
        startup_timeout=args.startup_timeout,
        health_path=sglang.HEALTH_PATH,
    ) as group:
        for index, run in enumerate(group.running):
            meta = _smoke(group, index)
            speculating += 1
            print(
                f"serve: {run.command.name} speculates: {meta.get('spec_verify_ct')} verify step(s) for "
                f"{meta.get('completion_tokens')} token(s), accept length {meta.get('spec_accept_length')}"
            )
        plan = {
            "schema_version": sglang.SCHEMA_VERSION,
            "algorithm": algorithm,
            "draft_path": draft_path,
            "instances": [_plan_instance(i, run.command) for i, run in enumerate(group.running)],
        }
        sglang.write_checked(plan_path, plan, "stage-serve")
        print(f"serve: {len(plan['instances'])} instance(s) healthy; plan in {plan_path}")
        if args.hold:
            _hold(group)
        instances = len(group.running)
    counts: dict[str, Any] = {"instances": instances, "healthy": instances, "speculating": speculating}
    if sglang_cpu.on_cpu_engine(commands):
        counts[NOTES] = [sglang_cpu.engine_note()]
    return counts


def _plan_instance(index: int, command: Command) -> dict[str, Any]:
    return {
        "index": index,
        "gpus": list(command.gpus),
        "tp": len(command.gpus) or 1,
        "port": command.port,
        "url": servers.url_of(command),
        "command": command.to_dict(),
        "healthy": True,
    }


def _smoke(group: servers.ServerGroup, index: int) -> dict[str, Any]:
    """One short greedy request; the answer must show verify steps (the draft loaded and speculates)."""
    run = group.running[index]
    body = sglang.chat_body([{"role": "user", "content": SMOKE_PROMPT}], SMOKE_MAX_TOKENS)
    reply = sglang.post_with_retries(group, index, body, what="the smoke request")
    meta = sglang.meta_info(reply, what=f"{run.command.name}'s smoke reply")
    if not meta.get("spec_verify_ct"):
        raise UserError(
            f"{run.command.name} answered but reported no speculative verify step (no spec_verify_ct in "
            "meta_info): the server is not speculating",
            field=f"serve.instances[{index}]",
            fix=f"check --speculative-algorithm and the draft path in its command; read {run.log}",
        )
    if meta.get("spec_num_correct_drafts") == 0:
        print(
            f"serve: warning: {run.command.name} accepted no drafted token in the smoke request "
            f"(accept length {meta.get('spec_accept_length')}); a draft converted with the wrong anchor "
            "convention (sample_from_anchor) loads cleanly and behaves like this"
        )
    return meta


def _hold(group: servers.ServerGroup) -> None:
    """Serve until SIGINT/SIGTERM (ServerGroup turns SIGTERM into KeyboardInterrupt); a dead server fails."""
    print("serve: holding; stop with Ctrl-C or SIGTERM")
    try:
        while True:
            group.check_alive()
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("serve: interrupted; stopping the instances")
