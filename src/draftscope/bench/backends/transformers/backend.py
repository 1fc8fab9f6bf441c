"""The Transformers backend: plain greedy decoding, or greedy speculative decoding with a draft model through the
kit's own verification loop (`draftscope.decode`). Per-token timestamps come from that loop."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from draftscope import tiny
from draftscope.bench.backends.common import chat_token_ids, choose_dtype, need
from draftscope.bench.backends.transformers import BACKEND
from draftscope.core.errors import UserError
from draftscope.core.presets import ExperimentConfig, ModelPreset, resolve_target

IMAGE = BACKEND.image  # named in "install … or run in image …" when torch or transformers is missing
TIMING_SOURCE = "kit decode loop (perf_counter after each token's argmax is on the host)"


class TransformersBackend:
    name = BACKEND.name

    def __init__(self) -> None:
        self.model = self.draft = self.tokenizer = None
        self.facts: dict[str, Any] = {}

    def load(self, config: ExperimentConfig, preset: ModelPreset) -> None:
        torch = need("torch", extra="local", image=IMAGE)
        need("transformers", extra="local", image=IMAGE)
        device = config.device
        capability = None
        if device == "cuda":
            if not torch.cuda.is_available():
                raise UserError(
                    "no CUDA device is visible",
                    field="--device",
                    value="cuda",
                    fix="run on an NVIDIA GPU host (invoke doctor), or --device cpu for the tiny preset",
                )
            capability = tuple(torch.cuda.get_device_capability(0))
            torch.cuda.set_per_process_memory_fraction(config.memory_fraction, 0)
        dtype_name = choose_dtype(config.dtype, device, capability)
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(config.seed)
        if preset.source == "kit" and config.model is None:
            self.tokenizer = tiny.load_tokenizer()
            self.model = tiny.load_target(device=device, dtype=dtype)
            target_desc = "tiny (kit-built)"
        else:
            ref = resolve_target(config, preset)
            ref.require_pinned("target")
            self.tokenizer, self.model = _from_hub(ref.repo, ref.revision, device, dtype)
            target_desc = ref.display()
        if config.draft is not None:
            if config.draft == "tiny":
                self.draft = tiny.load_draft(device=device, dtype=dtype)
            else:
                _, self.draft = _from_hub(config.draft, config.draft_revision, device, dtype)
        self.eos = _eos_ids(self.tokenizer, self.model)
        self.head = self.capture = None
        head = config.head
        if self.draft is not None and (head.policy != "dense" or head.shadow or head.capture):
            # lazy: torch, only for a certified, shadowed or captured head
            from draftscope.head.runtime import Capture, CertifiedHead, check_dense_head

            check_dense_head(self.model)
            self.capture = Capture(head.capture) if head.capture else None
            self.head = CertifiedHead(
                self.model.lm_head.weight,
                policy=head.policy,
                k=head.k,
                group_size=head.group_size,
                out_dtype=dtype,
                shadow=head.shadow,
                capture=self.capture,
            )
        self.facts = {
            "backend": self.name,
            "device": device,
            "dtype": dtype_name,
            "target": target_desc,
            "draft": config.draft,
            "draft_tokens": config.draft_tokens if self.draft is not None else None,
            "timing_source": TIMING_SOURCE,
            "capability": list(capability) if capability else None,
            "head": None
            if self.head is None
            else {
                "policy": head.policy,
                "k": head.k,
                "group_size": head.group_size,
                "shadow": head.shadow,
                "capture": head.capture,
                "int8_bytes": self.head.quantized.bytes_int8 if self.head.quantized else 0,
            },
        }
        self.config = config

    def encode(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return chat_token_ids(self.tokenizer, messages)

    def generate(self, input_ids: list[int], *, max_new_tokens: int, ignore_eos: bool):
        # lazy: torch and transformers, in the backend's image at run time
        from draftscope import decode

        kwargs = {
            "max_new_tokens": max_new_tokens,
            "eos_token_ids": self.eos,
            "ignore_eos": ignore_eos,
            "clock": time.perf_counter,
        }
        if self.draft is None:
            return decode.greedy_generate(self.model, input_ids, **kwargs)
        if self.head is None:
            return decode.speculative_generate(
                self.model, self.draft, input_ids, k=self.config.draft_tokens, **kwargs
            )
        before = self.head.counters.read()
        gen = decode.speculative_generate(
            self.model, self.draft, input_ids, k=self.config.draft_tokens, head=self.head, **kwargs
        )
        after = self.head.counters.read()  # once per request; within it the counters stay on the device
        gen.extra = {"head": {name: after[name] - before[name] for name in after}}
        return gen

    def finish(self, run_dir) -> None:
        """Write the captured verification calls (`--capture-head N`) for `invoke head-study`."""
        if self.capture is not None and self.capture.calls:
            # lazy: torch and safetensors, only when the head's calls were captured
            from draftscope.head.capture import write_capture

            write_capture(run_dir, self.capture, self.model.lm_head.weight.dtype)

    def synchronize(self) -> None:
        torch = need("torch")
        if self.config.device == "cuda":
            torch.cuda.synchronize()


def _from_hub(repo: str, revision: str | None, device: str, dtype):
    transformers = need("transformers", extra="local", image=IMAGE)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            repo, revision=revision, local_files_only=True, trust_remote_code=False
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            repo,
            revision=revision,
            local_files_only=True,
            trust_remote_code=False,
            dtype=dtype,
            attn_implementation="sdpa",
        )
    except OSError as exc:
        raise UserError(
            f"{repo}@{revision} is not in the local model cache ({exc.__class__.__name__})",
            field="model",
            fix="run the plan's fetch step first (invoke benchmark runs it), or check HF_HUB_CACHE",
        ) from None
    return tok, model.to(device).eval()


def _eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
