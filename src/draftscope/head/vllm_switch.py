"""The kit's side of the vLLM prefix-head plugin: the environment a run gets, and the status file it leaves.

The plugin (`draftscope.head.vllm_plugin`) is a `vllm.general_plugins` entry point, so vLLM loads it in every one
of its processes; it acts only when `DRAFTSCOPE_EXPERIMENTAL_PREFIX` is set. The kit sets that variable (and where
to write the status) in the benchmark step's environment when the experiment has `experimental_prefix: true`
(`env_for`), and copies the status file into the run manifest afterwards (`read_status`). The status says whether
the certified head became active or why the stock engine stayed on, the bytes it added, the startup check, and the
device counters (read every N steps and at shutdown).

No torch and no vLLM here: the host side imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json

ENV_SWITCH = "DRAFTSCOPE_EXPERIMENTAL_PREFIX"  # prefix | 1 (= prefix) | dense | 0 or unset (off)
ENV_STATUS = "DRAFTSCOPE_PREFIX_STATUS"  # the status file the plugin writes (JSON)
ENV_SHADOW = "DRAFTSCOPE_PREFIX_SHADOW"  # 1: also run the dense head every step and count disagreements
ENV_K = "DRAFTSCOPE_PREFIX_K"  # candidates refined exactly per row (default certify.DEFAULT_K)
ENV_GROUP_SIZE = "DRAFTSCOPE_PREFIX_GROUP_SIZE"  # INT8 scale group size (default: one scale per row)
ENV_READ_EVERY = (
    "DRAFTSCOPE_PREFIX_READ_EVERY"  # read the device counters (and rewrite the status) every N steps
)
ENV_MAX_ROWS = (
    "DRAFTSCOPE_PREFIX_MAX_ROWS"  # steps with more logits rows take the dense head (small-batch only)
)

# `prefix`: the certified head with the prefix-conditioned fallback. `dense`: the stock head under the same
# reference contract (no reduced-precision bf16 reductions, no split-K) — the baseline for token-identity checks.
MODES = ("prefix", "dense")
_ALIASES = {"1": "prefix", "prefix": "prefix", "dense": "dense"}
_OFF = ("", "0")

STATUS_FILE = "prefix_head.json"
STATUS_KIND = "draftscope.prefix_head"
STATUS_SCHEMA_VERSION = 1

DEFAULT_K = 64  # = draftscope.head.certify.DEFAULT_K (not imported: that module needs torch)
DEFAULT_READ_EVERY = 64
DEFAULT_MAX_ROWS = 64  # 4 requests of a 16-row DFlash verification


@dataclass(frozen=True)
class Settings:
    """What the plugin reads from its environment, validated."""

    mode: str
    status_path: Path | None
    shadow: bool = False
    k: int = DEFAULT_K
    group_size: int | None = None
    read_every: int = DEFAULT_READ_EVERY
    max_rows: int = DEFAULT_MAX_ROWS


def settings_from_env(environ: Mapping[str, str]) -> Settings | None:
    """The plugin's settings, or None when the switch is off. A malformed value is a UserError naming it."""
    raw = environ.get(ENV_SWITCH, "").strip().lower()
    if raw in _OFF:
        return None
    if raw not in _ALIASES:
        raise UserError(
            "unknown prefix-head mode",
            field=ENV_SWITCH,
            value=raw,
            fix=f"use one of {', '.join(sorted(_ALIASES))}, or 0 / unset for off",
        )
    status = environ.get(ENV_STATUS, "").strip()
    group = _positive(environ, ENV_GROUP_SIZE, None)
    return Settings(
        mode=_ALIASES[raw],
        status_path=Path(status) if status else None,
        shadow=environ.get(ENV_SHADOW, "").strip() == "1",
        k=_positive(environ, ENV_K, DEFAULT_K),
        group_size=group,
        read_every=_positive(environ, ENV_READ_EVERY, DEFAULT_READ_EVERY),
        max_rows=_positive(environ, ENV_MAX_ROWS, DEFAULT_MAX_ROWS),
    )


def _positive(environ: Mapping[str, str], name: str, default: int | None) -> Any:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise UserError(
            "must be a positive integer", field=name, value=raw, fix=f"unset {name} or give N > 0"
        )
    return value


# --- the kit's side ---------------------------------------------------------------------------------------------


# The plugin's tuning variables a user may set on the host: passed on into the step (local or container), so the
# step's recorded environment says what the plugin ran with.
TUNING = (ENV_SHADOW, ENV_K, ENV_GROUP_SIZE, ENV_READ_EVERY, ENV_MAX_ROWS)


def env_for(
    config: Any, run_dir: str | PurePosixPath, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables the benchmark step needs for `config` ({} unless `experimental_prefix`).

    `run_dir` is the run directory as the step sees it (the container's mount target, e.g. `plan.RUN_MOUNT`);
    the plugin runs in vLLM's processes inside that step and writes its status there. The tuning variables set in
    `environ` (the host's, by default) go along, checked here: a malformed one is refused before the run starts.
    """
    if not getattr(config, "experimental_prefix", False):
        return {}
    environ = os.environ if environ is None else environ
    env = {ENV_SWITCH: "prefix", ENV_STATUS: str(PurePosixPath(str(run_dir)) / STATUS_FILE)}
    env |= {name: environ[name] for name in TUNING if environ.get(name, "").strip()}
    settings_from_env(env)  # the same checks the plugin makes, with the same errors
    return env


def status_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / STATUS_FILE


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """The plugin's status for the manifest; a `missing` / `unreadable` record when there is none to read."""
    path = status_path(run_dir)
    if not path.is_file():
        return {
            "kind": STATUS_KIND,
            "state": "missing",
            "reason": (
                f"no {STATUS_FILE}: the plugin never reached the target's head (its entry point is not installed "
                "in the image, or vLLM failed before loading the model)"
            ),
        }
    try:
        status = read_json(path)
    except UserError as exc:
        return {"kind": STATUS_KIND, "state": "unreadable", "reason": f"{path.name}: {exc.message}"}
    if not isinstance(status, dict) or status.get("kind") != STATUS_KIND:
        return {
            "kind": STATUS_KIND,
            "state": "unreadable",
            "reason": f"{path.name} is not a prefix-head status",
        }
    if status.get("schema_version") != STATUS_SCHEMA_VERSION:
        return {
            "kind": STATUS_KIND,
            "state": "unreadable",
            "reason": f"{path.name} has schema_version {status.get('schema_version')!r}, "
            f"this kit reads {STATUS_SCHEMA_VERSION}",
        }
    return status


def write_status(path: Path, status: Mapping[str, Any]) -> None:
    """Atomically replace the status file (several vLLM processes may write it; readers never see half)."""
    atomic_write_json(Path(path), {"schema_version": STATUS_SCHEMA_VERSION, "kind": STATUS_KIND, **status})
