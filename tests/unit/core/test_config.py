import pytest

from draftscope.core import presets as P
from draftscope.core.config import deep_merge, parse_opts
from draftscope.core.errors import UserError

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_parse_opts_types_and_nesting():
    assert parse_opts(["repeats=3", "vllm.enforce_eager=true", "fixed_tokens=null", "name=a b"]) == {
        "repeats": 3,
        "vllm": {"enforce_eager": True},
        "fixed_tokens": None,
        "name": "a b",
    }


def test_parse_opts_rejects_malformed():
    with pytest.raises(UserError, match="key=value"):
        parse_opts(["repeats"])
    with pytest.raises(UserError, match="empty component"):
        parse_opts(["a..b=1"])


def test_shell_metacharacters_stay_data():
    # Values never reach a shell; the schema decides whether they are valid.
    with pytest.raises(UserError, match=r"--opts name: .x; rm -rf /. does not match"):
        P.load_experiment("tiny-cpu", opts=["name=x; rm -rf /"])


def test_deep_merge_keeps_base_untouched():
    base = {"a": {"b": 1, "c": 2}, "d": 1}
    merged = deep_merge(base, {"a": {"b": 5}})
    assert merged == {"a": {"b": 5, "c": 2}, "d": 1} and base["a"]["b"] == 1


def test_overrides_reach_the_frozen_config():
    c = P.load_experiment("transformers-baseline", {"repeats": 2}, ["vllm.max_model_len=4096", "seed=7"])
    assert (c.repeats, c.seed, c.vllm.max_model_len) == (2, 7, 4096)
    with pytest.raises(AttributeError):
        c.repeats = 3  # frozen


def test_unknown_override_key_is_named():
    with pytest.raises(UserError) as err:
        P.load_experiment("transformers-baseline", opts=["repeat=3"])
    assert "unknown key 'repeat'" in str(err.value) and "did you mean 'repeats'" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"repeats": 0}, "$.repeats"),
        ({"max_seconds": -5}, "$.max_seconds"),
        ({"memory_fraction": 1.5}, "$.memory_fraction"),
        ({"device": "tpu"}, "$.device"),
        ({"revision": "abc1234", "model": "Org/Name"}, "$.revision"),
        ({"model": "not-a-repo", "revision": SHA}, "$.model"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(UserError) as err:
        P.load_experiment("transformers-baseline", overrides)
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"model": "Org/Name"}, "custom model needs a full commit revision"),
        ({"revision": SHA}, "--revision is given without --model"),
        ({"draft": "Org/Draft"}, "custom draft needs a full commit revision"),
    ],
)
def test_cross_field_rules(overrides, needle):
    with pytest.raises(UserError, match=needle):
        P.load_experiment("transformers-baseline", overrides)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"int4_dflash": True}, "int4_dflash needs the vLLM backend"),
        ({"experimental_prefix": True}, "only with --backend vllm --int4-dflash"),
        ({"backend": "vllm", "device": "cpu"}, "CPU engine runs the kit-built tiny models only"),
    ],
)
def test_backend_rules_are_checked_when_a_benchmark_is_planned(overrides, needle):
    from draftscope.bench.plan import plan_benchmark

    config = P.load_experiment("transformers-baseline", overrides)  # the backend's own rules: not at loading
    with pytest.raises(UserError, match=needle):
        plan_benchmark(config)


def test_custom_model_with_full_revision_is_used():
    from draftscope.bench.plan import plan_benchmark

    c = P.load_experiment("transformers-baseline", {"model": "Org/Name", "revision": SHA})
    plan = plan_benchmark(c)
    assert plan.target.repo == "Org/Name" and plan.target.revision == SHA
