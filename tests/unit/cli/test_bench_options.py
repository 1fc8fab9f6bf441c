"""`invoke benchmark`'s options (`draftscope.bench.options`): laid over the backend's experiment, each bad one named by
its flag."""

from __future__ import annotations

import pytest

from draftscope.bench import options
from draftscope.core.errors import UserError


def test_options_lay_over_the_backends_experiment():
    config = options.experiment_config(
        preset="tiny",
        device="cpu",
        runtime="local",
        repeats="2",
        max_seconds="90.5",
        draft="tiny",
        head="prefix",
    )
    assert config.name == "transformers-baseline" and config.model_preset == "tiny"
    assert (config.repeats, config.max_seconds, config.head.policy) == (2, 90.5, "prefix")
    assert options.experiment_config(backend="vllm").int4_dflash is True


def test_an_experiment_without_backend_keeps_its_own_backend():
    """`-e vllm-int4-dflash2` alone is that vLLM experiment (the option's default once replaced it with
    transformers, and the preset's int4_dflash was then refused); a backend given is laid over it."""
    config = options.experiment_config(experiment="vllm-int4-dflash2")
    assert (config.backend, config.int4_dflash) == ("vllm", True)
    assert options.experiment_config().backend == "transformers"
    # Given, it is laid over the preset like any option (the plan then refuses int4_dflash on transformers).
    assert (
        options.experiment_config(experiment="vllm-int4-dflash2", backend="transformers").backend
        == "transformers"
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"backend": "sglang"},
            "--backend: unknown backend 'sglang'; fix: choose one of: transformers, vllm",
        ),
        ({"repeats": "two"}, "--repeats: expected an integer (got 'two')"),
        (
            {"memory_fraction": "most"},
            "--memory-fraction: expected a number (got 'most'); fix: give a fraction of GPU memory in (0, 1], "
            "e.g. --memory-fraction 0.6",
        ),
        ({"capture_head": "1.5"}, "--capture-head: expected an integer (got '1.5')"),
    ],
)
def test_a_bad_option_names_its_flag(given, message):
    with pytest.raises(UserError) as caught:
        options.experiment_config(**given)
    assert caught.value.render() == message


def test_a_run_needs_its_directory_and_slurm_flags_need_slurm():
    config = options.experiment_config(preset="tiny", device="cpu", runtime="local")
    with pytest.raises(UserError, match="--output: no run directory given"):
        options.run(config, None, argv=["benchmark"])
    with pytest.raises(UserError, match="--partition applies to the Slurm executor"):
        options.slurm_flags("local", partition="gpu", account=None, qos=None)
    lines = options.dry_run_lines(config, None)
    assert lines[0].startswith("# step ") and "runs/transformers-baseline-<timestamp>" in "\n".join(lines)
