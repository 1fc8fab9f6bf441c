"""SGLang's CPU engine (the sglang-cpu image): the argv the kit starts it with, the refusal on a CPU it cannot serve a
draft on, and the image's self-check (one completion served, `/metrics` scraped).

Read in SGLang 0.5.18, the release of the image and of its kernel sources:
- `SGLANG_USE_CPU_ENGINE=1` and `--device cpu` select the CPU engine (the image sets the variable; the argv carries
  the device). Its attention and linear kernels are `sgl_kernel`'s AMX/AVX-512 ones: `sglang/srt/utils/common.py`
  `cpu_has_amx_support()` = `torch.cpu._is_amx_tile_supported()` and a loadable `sgl_kernel` with
  `convert_weight_packed`. Without AMX SGLang falls back to its `torch_native` attention backend, where no draft runs
  ("EAGLE is not supported in decode attention backend torch_native", `speculative/draft_utils.py`).
- `--disable-overlap-schedule`: the CPU engine's scheduler runs without the overlapped (GPU stream) loop.
- A draft model is served as `--speculative-algorithm STANDALONE --speculative-draft-model-path D` with
  `--speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1` (a chain of K drafted
  tokens verified in one target step). DFLASH is refused on a CPU by SGLang itself: `DFLASH speculative decoding is
  not supported by CpuSRTPlatform on device 'cpu'` (`arg_groups/speculative_hook.py`, which admits cuda, npu and
  xpu only).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.pipeline import servers
from draftscope.pipeline.base import Command

CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
# What the CPU engine holds for the tiny models: a 4,096-token KV pool and four requests at once.
MAX_TOTAL_TOKENS = 4096
MAX_RUNNING_REQUESTS = 4
STANDALONE = "STANDALONE"
# SGLang's own words where it refuses DFlash on a CPU (speculative_hook.py, 0.5.18), quoted by the kit's refusal.
DFLASH_REFUSAL = "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'"
CPUINFO = Path("/proc/cpuinfo")
# Written by the sglang-cpu image's build: the SHA-256 of the kernel sources its sgl_kernel was built from.
KERNEL_SOURCES_RECORD = Path("/usr/share/draftscope/sglang-kernel-sources.sha256")
KERNEL_DISTRIBUTION = "sglang-kernel-cpu"
AMX_FLAGS = ("amx_tile", "amx_bf16")
# sgl_kernel's extend attention (csrc/cpu/extend.cpp, v0.5.18): `TORCH_CHECK(head_size % 32 == 0, "invalid head_size")`.
HEAD_SIZE_MULTIPLE = 32
CHECK_PROMPT = "Count from one to ten."
CHECK_TOKENS = 16
DEFAULT_CHECK_TIMEOUT_S = 600.0


def launch_argv(
    model: str,
    port: int,
    *,
    tokenizer: str | None = None,
    seed: int = 0,
    context_length: int | None = None,
    draft: str | None = None,
    draft_steps: int = 0,
) -> list[str]:
    """`python -m sglang.launch_server` on the CPU engine, greedy-ready, metrics on, loopback only; with `draft`, the
    STANDALONE draft model drafting `draft_steps` tokens a step."""
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-metrics",
        "--disable-overlap-schedule",
        "--disable-radix-cache",
        "--max-total-tokens",
        str(MAX_TOTAL_TOKENS),
        "--max-running-requests",
        str(MAX_RUNNING_REQUESTS),
        "--random-seed",
        str(seed),
    ]
    if tokenizer is not None:
        argv += ["--tokenizer-path", tokenizer]
    if context_length is not None:
        argv += ["--context-length", str(context_length)]
    if draft is not None:
        if draft_steps < 1:
            raise UserError(
                "a draft model drafts at least one token a step", field="draft_steps", value=draft_steps
            )
        argv += [
            "--speculative-algorithm",
            STANDALONE,
            "--speculative-draft-model-path",
            draft,
            "--speculative-num-steps",
            str(draft_steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(draft_steps + 1),
        ]
    return argv


def cpu_flags(cpuinfo: str) -> set[str]:
    """The `flags` of /proc/cpuinfo's first processor."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "this CPU"


def amx_refusal(cpuinfo: str | None = None) -> str | None:
    """Why SGLang's CPU engine cannot serve a draft here (no AMX), or None when it can."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    missing = [flag for flag in AMX_FLAGS if flag not in cpu_flags(cpuinfo)]
    if not missing:
        return None
    return (
        f"SGLang's CPU engine serves a draft only with its intel_amx attention backend, and {cpu_model(cpuinfo)} has "
        f"no {' or '.join(missing)}: SGLang falls back to torch_native, where no draft runs"
    )


def engine_note() -> str:
    """What a stage ran on, for its record: SGLang's and its CPU kernel's versions and the kernel sources' SHA-256
    (the sglang-cpu image's record of them; 'unrecorded' outside that image)."""
    from draftscope.core.provenance import distribution

    sglang = distribution("sglang")
    kernel = distribution(KERNEL_DISTRIBUTION)
    try:
        sources = KERNEL_SOURCES_RECORD.read_text(encoding="utf-8").strip() or "unrecorded"
    except OSError:
        sources = "unrecorded"
    return (
        f"engine measured: sglang {sglang[1] if sglang else 'not installed'} (CPU engine), kernel "
        f"{KERNEL_DISTRIBUTION} {kernel[1] if kernel else 'not installed'}, kernel sources sha256 {sources}"
    )


def on_cpu_engine(commands: Sequence[Command]) -> bool:
    """The stage's servers run SGLang's CPU engine (the variable its argv builder sets)."""
    return any(all(c.env.get(k) == v for k, v in CPU_ENV.items()) for c in commands)


# --- a model SGLang's CPU kernel takes ----------------------------------------------------------------------------

# The kit's tiny target has head_dim 48, which sgl_kernel refuses; the check model is a Qwen3 of the same shape with
# head_dim 64 and the tiny tokenizer, its weights random (seeded): a serving check, not a language model. Initialised
# with a standard deviation of 0.5, not 0.02: its logits' top-two gap is then ~1.4 (median; min 0.08 on 40 random
# tokens) instead of ~0.07 (min 0.001), far above the rounding of bf16 kernels, so two correct engines (or a
# speculative and a plain run) break no near-tie differently and greedy outputs can be compared token for token.
CHECK_INITIALIZER_RANGE = 0.5
CHECK_GEOMETRY = {
    "hidden_size": 256,
    "num_layers": 3,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def write_check_model(folder: Path, *, seed: int = 0) -> Path:
    """A seeded random Qwen3 that SGLang's CPU kernel takes (CHECK_GEOMETRY) with the kit's tiny tokenizer files,
    saved in `folder` (a new or empty folder). Returns the folder."""
    import shutil

    import torch  # lazy: only the check model needs it

    from draftscope.tiny.assets import TOKENIZER_FILES, assets_dir
    from draftscope.tiny.models import Geometry, new_model

    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise UserError("the check model's folder is not empty", field="folder", value=str(folder))
    folder.mkdir(parents=True, exist_ok=True)

    model = new_model(Geometry(**CHECK_GEOMETRY), seed=seed, initializer_range=CHECK_INITIALIZER_RANGE)
    # bfloat16, the dtype SGLang's CPU kernels compute in (AMX), as the kit's tiny models are saved.
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(assets_dir() / name, folder / name)
    # Readable by the images' user (10001) when mounted: safetensors writes its file 0600.
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder


# --- the image's self-check ---------------------------------------------------------------------------------------


def metric_families(text: str) -> dict[str, float]:
    """`/metrics`' `sglang:*` samples, read as the bench stage reads them (`sglang.sglang_samples`); a page that does
    not parse is refused."""
    from draftscope.pipeline import sglang

    try:
        return sglang.sglang_samples(text)
    except ValueError as exc:
        raise UserError(f"/metrics is not a Prometheus text page: {exc}") from exc


def self_check(
    work: Path,
    *,
    port: int,
    timeout: float = DEFAULT_CHECK_TIMEOUT_S,
    prompts: Sequence[dict[str, Any]] = (),
    max_new_tokens: int = CHECK_TOKENS,
    model: Path | None = None,
    say=print,
) -> dict[str, Any]:
    """Serve `model` (default: a check model, `write_check_model`) on SGLang's CPU engine, one greedy completion
    through the OpenAI endpoint, then `/metrics`: the figures as a dict (`ok` true). With `prompts` (the prompts
    file's entries), also the model's own greedy token ids for each, requested as the bench stage requests them
    (`greedy`: id → token ids): the reference a speculative run's tokens must equal. Any failure is a UserError
    naming the step and the log."""
    from draftscope.pipeline import sglang

    model = model or write_check_model(work / "model")
    command = Command("sglang-cpu", tuple(launch_argv(str(model), port)), env=dict(CPU_ENV), port=port)
    began = time.monotonic()
    with servers.ServerGroup(
        [command], logs=work / "logs", stage="selfcheck", startup_timeout=timeout, say=say
    ) as group:
        ready = time.monotonic() - began
        url = group.running[0].url
        body = sglang.chat_body([{"role": "user", "content": CHECK_PROMPT}], CHECK_TOKENS)
        started = time.monotonic()
        status, raw = servers.request("POST", url + sglang.CHAT_PATH, body, timeout=timeout)
        took = time.monotonic() - started
        if status != 200:
            raise UserError(
                f"the completion failed: HTTP {status}: {raw.decode('utf-8', 'replace')[:200]}",
                fix=f"read {group.running[0].log}",
            )
        reply = json.loads(raw)
        usage = reply.get("usage") if isinstance(reply, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if not isinstance(tokens, int) or tokens < 1:
            raise UserError(f"the completion generated no token: {str(reply)[:200]}")
        greedy = {}
        for prompt in prompts:
            status, raw = servers.request(
                "POST",
                url + sglang.CHAT_PATH,
                sglang.chat_body(prompt["messages"], max_new_tokens),
                timeout=timeout,
            )
            if status != 200:
                raise UserError(
                    f"prompt '{prompt['id']}' failed: HTTP {status}", fix=f"read {group.running[0].log}"
                )
            greedy[prompt["id"]] = sglang.response_token_ids(json.loads(raw), what=f"prompt '{prompt['id']}'")
        metrics = metric_families(servers.get_text(url + "/metrics", timeout=60.0))
        if not metrics:
            raise UserError(
                "/metrics carries no sglang:* sample", fix="the server runs with --enable-metrics"
            )
        info = servers.get_json(url + "/server_info", timeout=60.0)
    version = info.get("version") if isinstance(info, dict) else None
    return {
        "ok": True,
        "sglang": version,
        "ready_s": round(ready, 2),
        "completion_tokens": tokens,
        "completion_s": round(took, 3),
        "metrics": len(metrics),
        "metric_names": sorted({name.split("{", 1)[0] for name in metrics}),
        **({"greedy": greedy, "max_new_tokens": max_new_tokens} if prompts else {}),
    }


def check_lines(result: dict[str, Any]) -> Sequence[str]:
    return [
        f"sglang-cpu self-check: SGLang {result['sglang']} on the CPU engine, ready in {result['ready_s']} s",
        f"  one completion: {result['completion_tokens']} token(s) in {result['completion_s']} s",
        f"  /metrics: {result['metrics']} sglang:* sample(s) ({len(result['metric_names'])} names)",
    ]
