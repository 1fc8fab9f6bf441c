import shutil

import pytest

from draftscope.bench.plan import plan_benchmark
from draftscope.core import presets as P
from draftscope.core.errors import UserError

MODELS = P.model_preset_names()
EXPERIMENTS = P.experiment_preset_names()
REQUIRED_MODELS = {
    "qwen38-27b",
    "qwen35-27b",
    "qwen35-122b",
    "qwen36-35b",
    "qwen38-flash-next",
    "qwen3-8b",
    "tiny",
}
REQUIRED_EXPERIMENTS = {"transformers-baseline", "vllm-int4-dflash2", "vllm-int4-dflash2-prefix"}


def test_all_required_presets_exist():
    assert set(MODELS) >= REQUIRED_MODELS
    assert set(EXPERIMENTS) >= REQUIRED_EXPERIMENTS


@pytest.mark.parametrize("name", MODELS)
def test_model_preset_validates_and_is_consistent(name):
    preset = P.load_model_preset(name)
    assert preset.name == name
    arch = preset.architecture
    assert all(0 <= i < arch.num_layers for i in preset.dflash.target_layer_ids)
    if preset.source == "hub":
        assert preset.hub is not None and "/" in preset.hub.repo
    else:
        assert preset.hub is None and preset.kit_model is not None
    for ref in (preset.hub, preset.int4, preset.drafts.dflash, preset.drafts.dflash2, preset.drafts.dspark):
        if ref is not None and ref.revision is not None:
            assert len(ref.revision) == 40 and int(ref.revision, 16) >= 0


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_preset_validates_and_plans(name):
    config = P.load_experiment(name)
    plan = plan_benchmark(config)
    assert plan.steps[-1].name == "benchmark"
    assert plan.steps[-1].max_seconds == config.max_seconds
    assert plan.prompts.count >= 1 and len(plan.prompts.sha256) == 64


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_plans_a_transformers_benchmark(model):
    config = P.load_experiment("transformers-baseline", {"model_preset": model})
    plan = plan_benchmark(config)
    if P.load_model_preset(model).source == "hub":
        assert plan.downloads[0].repo == plan.target.repo
    else:
        assert plan.downloads == ()


def test_primary_preset_matches_the_published_dflash2_draft_geometry():
    p = P.load_model_preset("qwen38-27b")
    assert p.dflash.block_size == 8 and p.dflash.decay_gamma == 4
    assert p.dflash.target_layer_ids == (5, 19, 33, 47, 61)
    assert p.drafts.dflash2 is not None and p.drafts.dflash2.pinned
    assert p.architecture.is_hybrid


@pytest.fixture
def preset_copy(tmp_path, monkeypatch):
    """A private copy of presets/ that the test may corrupt."""
    from draftscope.core import resources

    src = resources.presets_dir()
    dst = tmp_path / "presets"
    shutil.copytree(src, dst)
    monkeypatch.setattr(P, "presets_dir", lambda: dst)
    return dst


def _corrupt(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_unknown_key_is_rejected_with_file_key_and_fix(preset_copy):
    path = preset_copy / "models" / "qwen3-8b.yaml"
    _corrupt(path, "  block_size: 8\n", "  block_size: 8\n  blocksize: 8\n")
    with pytest.raises(UserError) as err:
        P.load_model_preset("qwen3-8b")
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message
    assert "$.dflash.blocksize" in message and "unknown key 'blocksize'" in message
    assert "did you mean 'block_size'" in message and "fix:" in message


def test_short_revision_is_rejected_with_file_key_and_fix(preset_copy):
    path = preset_copy / "models" / "qwen3-8b.yaml"
    _corrupt(path, "b968826d9c46dd6066d109eabc6255188de91218", "b968826")
    with pytest.raises(UserError) as err:
        P.load_model_preset("qwen3-8b")
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "$.hub.revision" in message
    assert "'b968826'" in message and "40-character commit SHA" in message


def test_target_layers_beyond_the_model_are_rejected(preset_copy):
    path = preset_copy / "models" / "qwen3-8b.yaml"
    _corrupt(path, "target_layer_ids: [2, 18, 33]", "target_layer_ids: [2, 18, 36]")
    with pytest.raises(UserError, match=r"dflash.target_layer_ids.*\[36\].*36-layer"):
        P.load_model_preset("qwen3-8b")


def test_name_must_match_the_file(preset_copy):
    _corrupt(preset_copy / "models" / "tiny.yaml", "name: tiny", "name: tiny2")
    with pytest.raises(UserError, match="set name: tiny"):
        P.load_model_preset("tiny")


def test_unknown_preset_name_suggests_the_closest():
    with pytest.raises(UserError, match="did you mean 'qwen38-27b'"):
        P.load_model_preset("qwen38-72b")


def test_unpinned_reference_refuses_a_real_run():
    ref = P.load_model_preset("qwen38-27b").int4
    assert ref is not None and not ref.pinned
    assert "<unpinned" in ref.display()
    with pytest.raises(
        UserError, match=r"no pinned revision.*fix: pass --model RedHatAI/\S+ --revision FULL_40_HEX"
    ):
        ref.require_pinned("target")


@pytest.mark.parametrize("role", ["target", "draft"])
def test_the_pin_errors_fix_is_a_form_the_benchmark_accepts(role):
    """The fix names flags; typed as it says (with a SHA), they make a config that pins the checkpoint: --revision
    alone, without --model, would be refused (acceptance of "Pipelines that finish": the INT4 pin)."""
    import re
    import shlex

    from draftscope.bench.options import experiment_config
    from draftscope.bench.plan import plan_benchmark

    preset = P.load_model_preset("qwen38-27b")
    ref = preset.int4 if role == "target" else preset.drafts.dflash2
    ref = P.HubRef(ref.repo, None)
    with pytest.raises(UserError) as caught:
        ref.require_pinned(role)
    fix = re.search(r"pass (--\S+ \S+ --\S+) FULL_40_HEX_SHA", caught.value.render())
    assert fix, caught.value.render()
    flag, repo, rev_flag = shlex.split(fix.group(1))
    sha = "0123456789abcdef0123456789abcdef01234567"
    overrides = {flag.lstrip("-").replace("-", "_"): repo, rev_flag.lstrip("-").replace("-", "_"): sha}
    if (
        role == "draft"
    ):  # a draft given by flag pins the target the preset names; pin that too (as a user would)
        overrides.update(model=preset.int4.repo, revision=sha)
    config = experiment_config(backend="vllm", int4_dflash=True, **overrides)
    plan = plan_benchmark(config)
    pinned = {d.role: (d.repo, d.revision) for d in plan.downloads}
    assert pinned[role] == (repo, sha)


def test_a_preset_without_source_is_told_that_alone():
    """The hub/kit_model conditions hold only once `source` is given: one problem, naming `source`."""
    import yaml

    from draftscope.core import schema
    from draftscope.core.resources import presets_dir

    doc = yaml.safe_load((presets_dir() / "models" / "tiny.yaml").read_text())
    del doc["source"]
    found = schema.problems(doc, "model-preset")
    assert [(p.path, p.message) for p in found] == [
        ("$", "'source' is required but missing; fix: add 'source': one of 'hub', 'kit'")
    ]
