"""pretokenize on a real tokenizer (the kit's tiny byte-level BPE with its Qwen-style chat template, trained here in
a second): ids from the chat template read by attribute, the loss mask on the final assistant reply only, length
limits and statistics."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import iter_jsonl, read_json
from draftscope.core.schema import problems
from draftscope.pipeline.__main__ import main as pipeline_main
from draftscope.pipeline.stages.pretokenize import encode as P

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from draftscope.tiny import tokenizer as T

    texts = [inspect.getsource(json), inspect.getsource(inspect)[:20000]] * 2
    fast = T.wrap(T.train_tokenizer(texts, vocab_size=600))
    folder = tmp_path_factory.mktemp("tok")
    T.save_tokenizer(fast, folder)
    return folder


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def chat(*turns):
    roles = ["system", "user", "assistant", "user", "assistant"]
    return [{"role": r, "content": c} for r, c in zip(roles, turns, strict=False)]


def masked_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_the_mask_covers_exactly_the_final_reply_and_its_end_token(tok):
    messages = chat("be brief", "def f(x):", "return x + 1")
    ids = P.encode_chat(tok, messages)
    mask = P.assistant_mask(tok, ids)
    assert masked_text(tok, ids, mask) == "return x + 1<|im_end|>"
    # Everything before is the prompt: the template's own rendering of the conversation without the reply.
    prompt = tok.apply_chat_template(
        messages[:-1], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    assert ids[: len(prompt.input_ids)] == list(prompt.input_ids)
    assert sum(mask[: len(prompt.input_ids)]) == 0
    assert mask[-1] == 0  # the template's trailing newline after <|im_end|> is not trained


def test_only_the_last_assistant_turn_is_trained(tok):
    messages = chat("sys", "first question", "first answer", "second question", "second answer")
    ids = P.encode_chat(tok, messages)
    assert masked_text(tok, ids, P.assistant_mask(tok, ids)) == "second answer<|im_end|>"


class _NotADict:
    """What `apply_chat_template(..., return_dict=True)` returns after the transformers upgrade of bug 3: a
    BatchEncoding-like object that fails `isinstance(x, dict)` but has the attribute."""

    def __init__(self, ids):
        self.input_ids = ids


class _Wrapped:
    def __init__(self, tok):
        self._tok = tok

    def apply_chat_template(self, *args, **kwargs):
        return _NotADict(list(self._tok.apply_chat_template(*args, **kwargs).input_ids))

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_bug3_chat_template_output_is_read_by_attribute(tok):
    wrapped = _Wrapped(tok)
    assert not isinstance(
        wrapped.apply_chat_template(chat("s", "u", "a"), return_dict=True, tokenize=True), dict
    )
    messages = chat("s", "write code", "pass")
    assert P.encode_chat(wrapped, messages) == P.encode_chat(tok, messages)


def test_rows_without_a_final_reply_are_dropped_and_counted(tok, tmp_path):
    rows = [
        {"id": "a", "messages": chat("s", "q", "an answer")},
        {"id": "b", "messages": chat("s", "q")},  # ends with the user
        {"id": "c", "messages": []},
        {"id": "d", "messages": chat("s", "q", "")},  # an empty reply still trains <|im_end|>
    ]
    stats = P.pretokenize(
        tok, rows, tmp_path / "rows.jsonl", max_length=512, min_loss_tokens=2, tokenizer_path="t"
    )
    assert stats["input_rows"] == 4 and stats["rows"] == 1
    assert stats["dropped"] == {"too_long": 0, "no_assistant_reply": 2, "too_few_loss_tokens": 1}
    assert problems(stats, "stage-pretokenize") == []


@pytest.mark.parametrize(("overlong", "kept", "truncated"), [("truncate", 2, 1), ("drop", 1, 0)])
def test_length_limits(tok, tmp_path, overlong, kept, truncated):
    long_reply = " ".join(["value"] * 200)
    rows = [
        {"id": "short", "messages": chat("s", "q", "ok")},
        {"id": "long", "messages": chat("s", "q", long_reply)},
    ]
    out = tmp_path / "rows.jsonl"
    stats = P.pretokenize(tok, rows, out, max_length=64, overlong=overlong, tokenizer_path="t")
    assert stats["rows"] == kept and stats["truncated"] == truncated
    written = [r for _, r in iter_jsonl(out)]
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) <= 64 for r in written)
    assert stats["dropped"]["too_long"] == (1 if overlong == "drop" else 0)


def test_statistics_add_up(tok, tmp_path):
    rows = [{"id": str(i), "messages": chat("s", f"question {i}", "answer " * (i + 1))} for i in range(5)]
    out = tmp_path / "rows.jsonl"
    stats = P.pretokenize(tok, rows, out, max_length=512, tokenizer_path="t")
    written = [r for _, r in iter_jsonl(out)]
    assert [r["id"] for r in written] == ["0", "1", "2", "3", "4"]
    assert stats["tokens"] == sum(len(r["input_ids"]) for r in written)
    assert stats["loss_tokens"] == sum(sum(r["loss_mask"]) for r in written)
    assert stats["masked_fraction"] == pytest.approx(stats["loss_tokens"] / stats["tokens"])
    assert stats["length"]["n"] == 5 and stats["length"]["min"] < stats["length"]["max"]
    assert stats["chat_template_sha256"] and not (tmp_path / "rows.jsonl.partial").exists()


def test_duplicate_ids_and_bad_rows_are_user_errors(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"id": "x", "messages": []}\n{"id": "x", "messages": []}\n')
    with pytest.raises(UserError, match="duplicate row id 'x'"):
        list(P.read_rows(path, None))
    path.write_text('{"messages": []}\n')
    with pytest.raises(UserError, match="line 1 is not a chat row"):
        list(P.read_rows(path, None))


def test_the_in_container_command_writes_rows_stats_and_result(tokenizer_dir, tmp_path):
    source = tmp_path / "chat.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "messages": chat("s", "q", f"reply {i}")}) + "\n" for i in range(4)
        )
    )
    result = tmp_path / "stages" / "pretokenize.result.json"
    code = pipeline_main(
        [
            "pretokenize",
            "--result",
            str(result),
            "--input",
            str(source),
            "--tokenizer",
            str(tokenizer_dir),
            "--output",
            str(tmp_path / "out" / "rows.jsonl"),
            "--stats",
            str(tmp_path / "out" / "stats.json"),
            "--max-length",
            "128",
            "--max-rows",
            "3",
        ]
    )
    assert code == 0
    stats = read_json(tmp_path / "out" / "stats.json")
    assert stats["rows"] == 3 and problems(stats, "stage-pretokenize") == []
    assert read_json(result)["counts"]["rows"] == 3


def test_no_surviving_row_fails_the_stage(tokenizer_dir, tmp_path):
    source = tmp_path / "chat.jsonl"
    source.write_text(json.dumps({"id": "only", "messages": chat("s", "q")}) + "\n")
    code = pipeline_main(
        [
            "pretokenize",
            "--input",
            str(source),
            "--tokenizer",
            str(tokenizer_dir),
            "--output",
            str(tmp_path / "rows.jsonl"),
            "--stats",
            str(tmp_path / "stats.json"),
            "--max-length",
            "64",
        ]
    )
    assert code == 2
    assert Path(tmp_path / "stats.json").is_file()  # the statistics say why
