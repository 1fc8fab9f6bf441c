"""`check_output_path`: every output path the user gives is refused, before anything is created, when the kit could
not write it — one UserError naming the option, the value and the fix."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope.core.errors import UserError
from draftscope.core.outputs import check_output_path


def refused(path, flag="--output", **kw) -> str:
    with pytest.raises(UserError) as info:
        check_output_path(path, flag, **kw)
    error, text = info.value, info.value.render()
    # The value is the path as given (the rendered line shortens a long one).
    assert text.startswith(f"{flag}:") and "fix:" in text and error.value == str(path), text
    return text


def test_a_new_path_under_missing_folders_is_accepted(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    assert check_output_path(target, "--output") == target
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_parent_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is a file, not a folder" in refused(tmp_path / "f" / "run")
    assert "is a file, not a folder" in refused(tmp_path / "f" / "a" / "b" / "run")


def test_an_existing_file_is_refused_where_a_folder_may_be_reused(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is not a folder" in refused(tmp_path / "f", "--workdir", exists=True)
    (tmp_path / "w").mkdir()
    assert check_output_path(tmp_path / "w", "--workdir", exists=True) == tmp_path / "w"


def test_link_loops_and_broken_links_are_refused(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    assert "symbolic link loop" in refused(tmp_path / "a")
    assert "symbolic link loop" in refused(tmp_path / "a" / "run")
    assert "symbolic link loop" in refused(tmp_path / "a" / "x" / "y", "--workdir", exists=True)
    assert "broken symbolic link" in refused(tmp_path / "broken")
    assert "broken symbolic link" in refused(tmp_path / "broken" / "run")


@pytest.mark.parametrize("path", ["/proc/run", "/sys/kernel/run", "/dev/run", "/proc/self/run"])
def test_kernel_file_systems_are_refused(path):
    assert "kernel file system" in refused(path)


def test_a_link_into_proc_is_refused(tmp_path):
    (tmp_path / "p").symlink_to("/proc")
    assert "kernel file system" in refused(tmp_path / "p" / "run")


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="no /dev/shm")
def test_dev_shm_is_storage():
    check_output_path("/dev/shm/draftscope-never-created/run", "--output")


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root may write in a mode-0555 folder (the CLI corpus mounts one)"
)
def test_a_folder_without_write_permission_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert "is not writable" in refused(folder / "run")
    finally:
        folder.chmod(0o755)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["f", "d", "l", "loop", "x", "..", "."]), min_size=1, max_size=5))
def test_any_path_is_accepted_or_refused_cleanly(tmp_path_factory, parts):
    """Whatever the path's parts (a file, a folder, a link, a loop, missing ones), the answer is the path or a
    UserError, and nothing is created."""
    root = tmp_path_factory.mktemp("paths")
    (root / "f").write_text("x")
    (root / "d").mkdir()
    (root / "l").symlink_to(root / "d")
    (root / "loop").symlink_to(root / "loop")
    before = sorted(os.listdir(root))
    try:
        check_output_path(root.joinpath(*parts), "--output")
    except UserError as exc:
        assert exc.field == "--output" and exc.fix
    assert sorted(os.listdir(root)) == before


def test_a_nul_byte_is_refused_not_a_value_error(tmp_path):
    assert "NUL byte" in refused(f"{tmp_path}/a\0b")
