"""The benchmark worker: `python -m draftscope worker benchmark --run-dir DIR`, inside the step's image.

It reads the frozen config and the prompts from the run directory (checking their hashes), loads the backend,
warms up, then for each repeat × prompt runs one greedy, batch-one request on pretokenized input and appends
its record (flushed per record). It never writes the summary or the final status: the supervisor does, so a
killed worker leaves the same kind of run directory as a finished one.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from draftscope.bench import backends
from draftscope.bench.backends import Backend
from draftscope.bench.backends.common import decode_tok_s, prompt_sha256
from draftscope.core import settings
from draftscope.core.config import build
from draftscope.core.datasets import selected
from draftscope.core.errors import UserError
from draftscope.core.hardware import gpus_from_nvml
from draftscope.core.jsonio import atomic_write_json, read_json, sha256_file
from draftscope.core.presets import ExperimentConfig, load_model_preset
from draftscope.core.provenance import versions
from draftscope.core.rundir import RunDir

WORKER_FACTS = "worker.json"
# Fault injection for the reliability, container and integration tests: `after-records:N:exit:CODE` ends the worker
# with CODE once N records are written (0: before the first); `repeat:R:change-token:P` changes the token at position
# P of each generation of repeat R, as a speculative engine that altered the target's output would (the check that
# catches one is the summary's greedy agreement across repeats). The supervisor notes in the manifest when one was set.
FAILPOINT = settings.DRAFTSCOPE_FAILPOINT.name
WARMUP_TOKENS = 8


def load_run_inputs(run_dir: Path) -> tuple[ExperimentConfig, list[dict[str, Any]]]:
    manifest = read_json(run_dir / "manifest.json")
    config = build(ExperimentConfig, manifest["config"])
    (entry,) = [i for i in manifest["inputs"] if i["name"] == "prompts"]
    copy = run_dir / "inputs" / Path(entry["path"]).name
    if sha256_file(copy) != entry["sha256"]:
        raise UserError("the prompt file changed since the run was created", source=str(copy))
    return config, selected(read_json(copy)["prompts"], config.max_prompts)


def hardware(device: str, spec: Backend) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "device": device,
    }
    # lazy: torch, present in the worker's image; the module imports without it
    import torch

    facts["torch_threads"] = torch.get_num_threads()
    if device == "cuda" and spec.gpu_facts_via_nvml:
        # Not through torch: after the engine (vLLM) claimed its memory share, a CUDA context here would cost
        # hundreds of MB.
        gpus = gpus_from_nvml() or []
        facts["gpu"] = [g.as_dict() for g in gpus] or None
    elif device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = {
            "name": props.name,
            "capability": [props.major, props.minor],
            "memory_mib": props.total_memory // (1 << 20),
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
        try:
            gpus = gpus_from_nvml()
            if gpus:
                facts["gpu"]["driver"] = gpus[0].driver_version
                facts["gpu"]["clocks_sm_max_mhz"] = gpus[0].clocks_sm_max_mhz
        except Exception as exc:  # NVML is a nice-to-have here; torch already gave the essentials
            facts["gpu"]["nvml_error"] = str(exc)[:200]
    return facts


def run(run_dir: Path) -> int:
    run_dir = Path(run_dir)
    config, prompts = load_run_inputs(run_dir)
    preset = load_model_preset(config.model_preset)
    spec = backends.get(config.backend)
    backend = spec.engine_class()()
    facts: dict[str, Any] = {"phase": "loading", "versions": versions()}
    atomic_write_json(run_dir / WORKER_FACTS, facts)

    started = time.perf_counter()
    backend.load(config, preset)
    facts.update(
        phase="loaded",
        load_seconds=time.perf_counter() - started,
        backend=backend.facts,
        hardware=hardware(config.device, spec),
    )
    atomic_write_json(run_dir / WORKER_FACTS, facts)

    # Tokenization happens here, before and outside any timed region.
    encoded = [(p, backend.encode(p["messages"])) for p in prompts]
    started = time.perf_counter()
    for _ in range(config.warmups):
        backend.generate(encoded[0][1], max_new_tokens=WARMUP_TOKENS, ignore_eos=True)
    facts.update(phase="measuring", warmup_seconds=time.perf_counter() - started)
    atomic_write_json(run_dir / WORKER_FACTS, facts)

    _failpoint(0)
    fixed = config.fixed_tokens is not None
    max_new = config.fixed_tokens if fixed else config.max_new_tokens
    run = RunDir(run_dir)
    written = 0
    with run.records() as out:
        for repeat in range(config.repeats):  # repeat-major: drift spreads over prompts, not onto one
            for prompt, ids in encoded:
                gen = backend.generate(ids, max_new_tokens=max_new, ignore_eos=fixed)
                token_ids = changed_token(gen.token_ids, repeat)
                n = len(token_ids)
                record = {
                    "schema_version": 1,
                    "prompt_id": prompt["id"],
                    "prompt_sha256": prompt_sha256(prompt["messages"]),
                    "repeat": repeat,
                    "prompt_tokens": len(ids),
                    "generated_token_ids": token_ids,
                    "generated_tokens": n,
                    "request_seconds": gen.request_seconds,
                    "request_tok_s": n / gen.request_seconds,
                    "decode_tok_s": decode_tok_s(gen.token_times),
                    "token_timestamps": gen.token_times,
                    "timing_source": backend.facts["timing_source"],
                    "finish_reason": gen.finish_reason,
                    "acceptance_lengths": gen.acceptance_lengths,
                    "draft_tokens_per_step": gen.draft_tokens_per_step,
                }
                if getattr(gen, "extra", None):
                    record["extra"] = gen.extra
                run.append_record(out, record)
                written += 1
                _failpoint(written)
    if hasattr(backend, "finish"):
        backend.finish(run_dir)
    facts.update(phase="done", total_seconds=time.perf_counter() - started)
    atomic_write_json(run_dir / WORKER_FACTS, facts)
    return 0


def _failpoint(written: int) -> None:
    # (N, CODE, None, None) or (None, None, R, P); None when unset; malformed: a UserError
    spec = settings.DRAFTSCOPE_FAILPOINT.get()
    if spec is None or spec[0] is None:
        return
    after, code = spec[:2]
    if written == int(after):
        print(
            f"failpoint {settings.DRAFTSCOPE_FAILPOINT.raw()}: exiting with code {code}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(int(code))


def changed_token(token_ids: list[int], repeat: int) -> list[int]:
    """The generation as recorded: with `repeat:R:change-token:P` injected, repeat R's token at position P becomes
    another id (the one below it; 1 for id 0), when the generation reaches P; otherwise the ids unchanged."""
    spec = settings.DRAFTSCOPE_FAILPOINT.get()
    if spec is None or spec[2] is None:
        return token_ids
    at_repeat, position = int(spec[2]), int(spec[3])
    if repeat != at_repeat or position >= len(token_ids):
        return token_ids
    changed = list(token_ids)
    changed[position] = changed[position] - 1 if changed[position] > 0 else 1
    return changed
