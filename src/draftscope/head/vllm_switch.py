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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.settings import (
    DRAFTSCOPE_EXPERIMENTAL_PREFIX,
    DRAFTSCOPE_PREFIX_GROUP_SIZE,
    DRAFTSCOPE_PREFIX_K,
    DRAFTSCOPE_PREFIX_MAX_ROWS,
    DRAFTSCOPE_PREFIX_READ_EVERY,
    DRAFTSCOPE_PREFIX_SHADOW,
    DRAFTSCOPE_PREFIX_STATUS,
)

# The plugin's variables, each declared (type, default, doc) in core.settings.
ENV_SWITCH = DRAFTSCOPE_EXPERIMENTAL_PREFIX.name  # prefix | 1 (= prefix) | dense | 0 or unset (off)
ENV_STATUS = DRAFTSCOPE_PREFIX_STATUS.name  # the status file the plugin writes (JSON)
ENV_SHADOW = DRAFTSCOPE_PREFIX_SHADOW.name  # 1: also run the dense head every step and count disagreements
ENV_K = DRAFTSCOPE_PREFIX_K.name  # candidates refined exactly per row
ENV_GROUP_SIZE = DRAFTSCOPE_PREFIX_GROUP_SIZE.name  # INT8 scale group size
ENV_READ_EVERY = DRAFTSCOPE_PREFIX_READ_EVERY.name  # read the device counters every N steps
ENV_MAX_ROWS = DRAFTSCOPE_PREFIX_MAX_ROWS.name  # steps with more logits rows take the dense head

# `prefix`: the certified head with the prefix-conditioned fallback. `dense`: the stock head under the same
# reference contract (no reduced-precision bf16 reductions, no split-K) — the baseline for token-identity checks.
MODES = ("prefix", "dense")

STATUS_FILE = "prefix_head.json"
STATUS_KIND = "draftscope.prefix_head"
STATUS_SCHEMA_VERSION = 1

DEFAULT_K: int = DRAFTSCOPE_PREFIX_K.default  # = draftscope.head.certify.DEFAULT_K (that module needs torch)
DEFAULT_READ_EVERY: int = DRAFTSCOPE_PREFIX_READ_EVERY.default
DEFAULT_MAX_ROWS: int = DRAFTSCOPE_PREFIX_MAX_ROWS.default  # 4 requests of a 16-row DFlash verification


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


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
    """The plugin's settings from `environ` (this process's environment when None), or None when the switch is
    off. A malformed value is a UserError naming it."""
    mode = DRAFTSCOPE_EXPERIMENTAL_PREFIX.get(environ)
    if mode is None:
        return None
    return Settings(
        mode=mode,
        status_path=DRAFTSCOPE_PREFIX_STATUS.get(environ),
        shadow=DRAFTSCOPE_PREFIX_SHADOW.get(environ),
        k=DRAFTSCOPE_PREFIX_K.get(environ),
        group_size=DRAFTSCOPE_PREFIX_GROUP_SIZE.get(environ),
        read_every=DRAFTSCOPE_PREFIX_READ_EVERY.get(environ),
        max_rows=DRAFTSCOPE_PREFIX_MAX_ROWS.get(environ),
    )


# --- the kit's side ---------------------------------------------------------------------------------------------


# The plugin's tuning variables a user may set on the host: passed on into the step (local or container), so the
# step's recorded environment says what the plugin ran with.
TUNING = (
    DRAFTSCOPE_PREFIX_SHADOW,
    DRAFTSCOPE_PREFIX_K,
    DRAFTSCOPE_PREFIX_GROUP_SIZE,
    DRAFTSCOPE_PREFIX_READ_EVERY,
    DRAFTSCOPE_PREFIX_MAX_ROWS,
)


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
    env = {ENV_SWITCH: "prefix", ENV_STATUS: str(PurePosixPath(str(run_dir)) / STATUS_FILE)}
    env |= {v.name: v.raw(environ) for v in TUNING if v.text(environ)}
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
