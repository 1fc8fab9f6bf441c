"""The benchmark backends' prompt encoding (`chat_token_ids`, shared by the Transformers and vLLM backends) on the
kit's tiny tokenizer: the chat template's ids with the generation prompt, read by attribute (integration bug 3), so
a `BatchEncoding`, a wrapper that is no `dict` and a plain list give the same ids."""

from __future__ import annotations

import pytest

from draftscope.bench.backends.common import chat_token_ids

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

MESSAGES = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"})


@pytest.fixture(scope="module")
def tok():
    from draftscope import tiny

    return tiny.load_tokenizer()


class _NotADict:
    def __init__(self, ids):
        self.input_ids = ids


class _Returning:
    """The tiny tokenizer, its chat template's output turned into `shape(output)`."""

    def __init__(self, tok, shape):
        self._tok, self._shape = tok, shape

    def apply_chat_template(self, *args, **kwargs):
        out = self._tok.apply_chat_template(*args, **kwargs)
        return self._shape(list(getattr(out, "input_ids", out)))


def test_the_ids_are_the_chat_templates_with_the_generation_prompt(tok):
    ids = chat_token_ids(tok, MESSAGES)
    text = tok.apply_chat_template(list(MESSAGES), add_generation_prompt=True, tokenize=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert all(type(i) is int for i in ids)


def test_bug3_a_wrapper_that_is_no_dict_and_a_plain_list_give_the_same_ids(tok):
    expected = chat_token_ids(tok, MESSAGES)
    assert chat_token_ids(_Returning(tok, _NotADict), MESSAGES) == expected
    assert chat_token_ids(_Returning(tok, list), MESSAGES) == expected
