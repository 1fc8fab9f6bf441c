"""The kit's decode loops: speculative greedy equals plain greedy token for token, on the shipped tiny models."""

from __future__ import annotations

import itertools
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftscope import tiny  # noqa: E402
from draftscope.core.resources import examples_dir  # noqa: E402
from draftscope.decode import (  # noqa: E402
    Generation,
    dense_head,
    greedy_generate,
    speculative_generate,
    verify,
)
from draftscope.tiny.models import DRAFT, TARGET, new_model  # noqa: E402

MAX_NEW = 32
EOS = (2, 0)  # <|im_end|>, <|endoftext|>
MASK = 3  # <|mask|>: never produced by the trained target


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Batch-one decoding of these tiny models is all per-call overhead: one thread is faster than two, and much
    # faster when the cores are shared.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    return tiny.load_target(), tiny.load_draft()


@pytest.fixture(scope="module")
def prompts():
    tok = tiny.load_tokenizer()
    data = json.loads((examples_dir() / "prompts.json").read_text(encoding="utf-8"))
    out = []
    for p in data["prompts"]:
        text = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        out.append((p["id"], tok(text, add_special_tokens=False)["input_ids"]))
    assert len(out) == 12
    return out


@pytest.fixture(scope="module")
def greedy(models, prompts):
    target, _ = models
    return {
        (pid, ignore): greedy_generate(
            target, ids, max_new_tokens=MAX_NEW, eos_token_ids=EOS, ignore_eos=ignore
        )
        for (pid, ids), ignore in itertools.product(prompts, (False, True))
    }


def _check_shape(gen: Generation, *, speculative: bool) -> None:
    assert len(gen.token_times) == len(gen.token_ids) >= 1
    assert all(a <= b for a, b in itertools.pairwise(gen.token_times))
    assert gen.token_times[0] >= 0 and gen.token_times[-1] <= gen.request_seconds
    if speculative:
        assert gen.acceptance_lengths is not None
        assert sum(gen.acceptance_lengths) == len(gen.token_ids)
        assert all(1 <= a <= gen.draft_tokens_per_step + 1 for a in gen.acceptance_lengths)
    else:
        assert gen.acceptance_lengths is None and gen.draft_tokens_per_step is None


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_equals_greedy_on_every_example_prompt(models, prompts, greedy, k, ignore_eos):
    target, draft = models
    steps = tokens = 0
    for pid, ids in prompts:
        ref = greedy[(pid, ignore_eos)]
        _check_shape(ref, speculative=False)
        gen = speculative_generate(
            target, draft, ids, k=k, max_new_tokens=MAX_NEW, eos_token_ids=EOS, ignore_eos=ignore_eos
        )
        assert gen.token_ids == ref.token_ids, f"{pid}: speculative output differs from greedy (k={k})"
        assert gen.finish_reason == ref.finish_reason
        assert gen.draft_tokens_per_step == k
        _check_shape(gen, speculative=True)
        steps += len(gen.acceptance_lengths)
        tokens += len(gen.token_ids)
    if ignore_eos:
        assert all(greedy[(pid, True)].finish_reason == "fixed_tokens" for pid, _ in prompts)
        assert tokens == MAX_NEW * len(prompts)
    if k > 1:
        assert tokens / steps > 1.2, "the shipped draft should save target calls"


def test_eos_stops_both_loops_at_the_same_token(models, prompts, greedy):
    target, draft = models
    pid, ids = prompts[0]
    full = greedy[(pid, True)].token_ids
    # Treat a token that first appears mid-generation as EOS: both loops must stop right after it.
    position = next(i for i in range(5, len(full)) if full[i] not in full[:i])
    eos = {full[position]}
    ref = greedy_generate(target, ids, max_new_tokens=MAX_NEW, eos_token_ids=eos)
    assert ref.token_ids == full[: position + 1] and ref.finish_reason == "eos"
    for k in (1, 2, 4):
        gen = speculative_generate(target, draft, ids, k=k, max_new_tokens=MAX_NEW, eos_token_ids=eos)
        assert gen.token_ids == ref.token_ids and gen.finish_reason == "eos"
        assert sum(gen.acceptance_lengths) == len(gen.token_ids)
    # ignore_eos runs past it to exactly max_new_tokens
    gen = speculative_generate(
        target, draft, ids, k=4, max_new_tokens=MAX_NEW, eos_token_ids=eos, ignore_eos=True
    )
    assert gen.token_ids == full and gen.finish_reason == "fixed_tokens"


def test_length_finish_when_no_eos_appears(models, prompts):
    target, draft = models
    _, ids = prompts[1]
    ref = greedy_generate(target, ids, max_new_tokens=7, eos_token_ids={MASK})
    gen = speculative_generate(target, draft, ids, k=4, max_new_tokens=7, eos_token_ids={MASK})
    assert ref.finish_reason == gen.finish_reason == "length"
    assert len(ref.token_ids) == len(gen.token_ids) == 7 and gen.token_ids == ref.token_ids


class AlwaysWrongDraft(torch.nn.Module):
    """A real draft forward whose logits are replaced so that it always proposes <|mask|>."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, cache=None, **kwargs):
        out = self.inner(input_ids=input_ids, cache=cache, **kwargs)
        logits = torch.zeros_like(out.logits)
        logits[..., MASK] = 1.0
        out.logits = logits
        return out


def test_a_draft_that_is_always_wrong_still_gives_the_greedy_output(models, prompts, greedy):
    target, draft = models
    wrong = AlwaysWrongDraft(draft).eval()
    for pid, ids in prompts[:4]:
        gen = speculative_generate(
            target, wrong, ids, k=4, max_new_tokens=MAX_NEW, eos_token_ids=EOS, ignore_eos=True
        )
        assert gen.token_ids == greedy[(pid, True)].token_ids
        assert gen.acceptance_lengths == [1] * MAX_NEW


def test_random_models_with_a_raised_init_range_agree_too():
    # Default-init random models emit one token forever; a raised range gives varied output to check against.
    torch.manual_seed(0)
    target = new_model(TARGET, seed=5, initializer_range=0.5).eval()
    draft = new_model(DRAFT, seed=6, initializer_range=0.5).eval()
    for seed in range(2):
        ids = torch.randint(4, 4096, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
        ref = greedy_generate(target, ids, max_new_tokens=24, eos_token_ids=(), ignore_eos=True)
        assert len(set(ref.token_ids)) > 3
        for k in (1, 3):
            gen = speculative_generate(
                target, draft, ids, k=k, max_new_tokens=24, eos_token_ids=(), ignore_eos=True
            )
            assert gen.token_ids == ref.token_ids
        # the target as its own draft accepts every proposal: k + 1 tokens per call
        gen = speculative_generate(
            target, target, ids, k=3, max_new_tokens=24, eos_token_ids=(), ignore_eos=True
        )
        assert gen.token_ids == ref.token_ids and gen.acceptance_lengths == [4] * 6


def test_one_new_token_needs_one_target_call(models, prompts):
    target, draft = models
    _, ids = prompts[2]
    gen = speculative_generate(target, draft, ids, k=4, max_new_tokens=1, eos_token_ids=EOS)
    ref = greedy_generate(target, ids, max_new_tokens=1, eos_token_ids=EOS)
    assert gen.token_ids == ref.token_ids and gen.acceptance_lengths == [1]


def test_timestamps_come_from_the_clock_and_steps_share_a_time(models, prompts):
    target, draft = models
    ticks = itertools.count()
    gen = speculative_generate(
        target,
        draft,
        prompts[3][1],
        k=4,
        max_new_tokens=12,
        eos_token_ids=(),
        ignore_eos=True,
        clock=lambda: float(next(ticks)),
    )
    # one tick at the start, one per verification step, one at the end
    expected = [float(i + 1) for i, n in enumerate(gen.acceptance_lengths) for _ in range(n)]
    assert gen.token_times == expected
    assert gen.request_seconds == len(gen.acceptance_lengths) + 1


def test_verify_accepts_the_longest_matching_prefix():
    rows = torch.full((4, 10), -1.0)
    for i, t in enumerate([5, 6, 7, 8]):
        rows[i, t] = 1.0
    assert verify(rows, torch.tensor([5, 6, 7])) == (3, 8)  # all accepted + bonus
    assert verify(rows, torch.tensor([5, 9, 7])) == (1, 6)  # correction at the first mismatch
    assert verify(rows, torch.tensor([1, 6, 7])) == (0, 5)
    assert verify(rows[:1], torch.tensor([], dtype=torch.long)) == (0, 5)
    with pytest.raises(ValueError, match="one more"):
        verify(rows, torch.tensor([5, 6]))


def test_verify_ties_go_to_the_lowest_index_and_the_head_is_replaceable():
    rows = torch.zeros((2, 6))
    rows[:, [2, 4]] = 3.0
    assert dense_head(rows, torch.tensor([2])).tolist() == [2, 2]
    assert verify(rows, torch.tensor([2])) == (1, 2)
    seen = {}

    def head(r, d):
        seen["rows"], seen["draft"] = r.shape, d.tolist()
        return torch.tensor([4, 1])

    assert verify(rows, torch.tensor([4]), head) == (1, 1)
    assert seen == {"rows": (2, 6), "draft": [4]}


def test_bad_arguments_are_refused(models):
    target, draft = models
    with pytest.raises(ValueError, match="empty"):
        greedy_generate(target, [], max_new_tokens=3, eos_token_ids=EOS)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(target, [1], max_new_tokens=0, eos_token_ids=EOS)
    with pytest.raises(ValueError, match="k must"):
        speculative_generate(target, draft, [1], k=0, max_new_tokens=3, eos_token_ids=EOS)
