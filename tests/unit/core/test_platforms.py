"""Platform rules (draftscope.core.platforms) and the driver-vs-image CUDA check of `invoke doctor`."""

from __future__ import annotations

import pytest

from draftscope.core import platforms
from draftscope.core.errors import UserError
from draftscope.ops import doctor


@pytest.mark.parametrize("system", ["darwin", "win32"])
@pytest.mark.parametrize("engine, name", [("vllm", "vLLM"), ("sglang", "SGLang")])
def test_vllm_and_sglang_refuse_other_hosts_in_one_line(system, engine, name):
    with pytest.raises(UserError) as info:
        platforms.require_linux(engine, system=system, field="--backend")
    line = info.value.render()
    assert "\n" not in line and line.startswith("--backend:") and f"{name} runs on Linux hosts only" in line
    assert platforms.host_name(system) in line and "--dry-run work here" in line


@pytest.mark.parametrize("engine", ["vllm", "sglang", "transformers", "train"])
def test_linux_runs_everything(engine):
    assert platforms.refusal(engine, "linux") is None
    platforms.require_linux(engine, system="linux")


@pytest.mark.parametrize("system", ["darwin", "win32"])
def test_the_transformers_backend_and_host_tasks_have_no_platform_rule(system):
    assert platforms.refusal("transformers", system) is None


def test_host_user_without_posix_ids_is_the_images_user(monkeypatch):
    import os

    assert platforms.host_user() == (os.getuid(), os.getgid())
    monkeypatch.delattr(os, "getuid")
    assert platforms.host_user() == platforms.IMAGE_USER == (10001, 10001)


IMAGES = {"transformers": "13.0.1", "vllm": "13.0", "train": "13.0", "sglang": "13.0"}


def gpu(cuda, driver="550.90.07"):
    return {"index": 0, "name": "NVIDIA H200", "driver_version": driver, "cuda_version": cuda}


def test_a_driver_below_the_images_cuda_major_is_named_with_the_fix():
    lines = doctor.driver_problems([gpu("12.4")], IMAGES)
    assert lines == [
        "driver 550.90.07 supports CUDA up to 12.4, too old for the CUDA 13.0 of image(s) transformers, vllm, train,"
        " sglang: their GPU steps fail to start; fix: install an NVIDIA driver of the 580 branch or newer, or, on a"
        " data-center GPU, NVIDIA's CUDA forward-compatibility package cuda-compat-13-0"
    ]


def test_a_driver_within_the_major_is_a_warning_and_a_new_one_is_fine():
    lines = doctor.driver_problems([gpu("13.0", "580.65.06")], {"vllm": "13.1"})
    assert len(lines) == 1 and "minor-version compatibility" in lines[0] and "580 branch" in lines[0]
    assert doctor.driver_problems([gpu("13.0", "580.65.06")], IMAGES) == []
    assert doctor.driver_problems([gpu("13.2", "590.1")], IMAGES) == []


def test_unknown_driver_cuda_or_image_cuda_says_nothing():
    assert doctor.driver_problems([gpu(None)], IMAGES) == []
    assert doctor.driver_problems([], IMAGES) == []
    assert doctor.driver_problems([gpu("12.4")], {}) == []


def test_image_cuda_comes_from_the_lock():
    assert doctor.image_cuda() == IMAGES
