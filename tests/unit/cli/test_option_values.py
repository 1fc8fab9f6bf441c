"""Values checked before a task runs (`cli.command`), path errors and parse errors as one `error:` line."""

from __future__ import annotations

import contextlib
import errno
import io

import pytest
from invoke import Exit

from draftscope.cli import ns
from draftscope.cli.command import check_text, parse_int
from draftscope.cli.handler import exits, path_error
from draftscope.cli.program import DraftscopeProgram
from draftscope.core.errors import UserError


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            DraftscopeProgram(namespace=ns, name="draftscope", binary="draftscope").run(["draftscope", *argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("value", ["nan", "1e309", "ten", "", "1.5"])
def test_parse_int_refuses_what_is_not_an_integer(value):
    with pytest.raises(UserError, match="--n: expected an integer"):
        parse_int(value, "--n")


def test_parse_int_bounds():
    assert parse_int(" 3 ", "--n", 1, 5) == 3
    with pytest.raises(UserError, match="must be at least 1"):
        parse_int("0", "--n", 1)
    with pytest.raises(UserError, match="must be at most 5"):
        parse_int(str(10**30), "--n", 1, 5)


@pytest.mark.parametrize(("value", "phrase"), [("a\x00b", "NUL byte"), ("\udcff", "not valid UTF-8")])
def test_check_text_refuses_nul_and_non_utf8(value, phrase):
    with pytest.raises(UserError, match=phrase):
        check_text(value, "--x")
    assert check_text("é:,=", "--x") == "é:,="


@pytest.mark.parametrize("code", [errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EACCES])
def test_a_path_the_system_cannot_look_up_is_one_error_line(code):
    exc = OSError(code, "x", "/some/" + "y" * 300)
    assert isinstance(path_error(exc), UserError)
    with pytest.raises(Exit) as found, exits():
        raise exc
    assert found.value.code == 2 and found.value.message.startswith("error: ")
    assert "\n" not in found.value.message


def test_other_os_errors_keep_their_traceback():
    assert path_error(OSError(errno.EIO, "io")) is None
    with pytest.raises(OSError), exits():
        raise OSError(errno.EIO, "io")


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (("bench-overhead", "--tokens=nan"), "--tokens: expected an integer"),
        (("bench-overhead", "--rounds=0"), "--rounds: must be at least 1"),
        (("head-study", "--run=x", "-k=-5"), "-k: must be at least 0"),
        (("head-bench", f"--hidden={10**30}"), "--hidden: must be at most"),
        (("tiny.build", "--target-steps=nan"), "--target-steps: expected an integer"),
        (("validate", "--run-dir=a\x00b"), "NUL byte"),
        (("benchmark", "--output=\udcff"), "not valid UTF-8"),
        (("benchmark", "--backend=-x"), "--backend: unknown backend '-x'"),
        (("benchmark", "--backend"), "needed value"),
        (("nosuchtask",), "no task named 'nosuchtask'"),
        (("benchmrk",), "did you mean 'benchmark'?"),
        (("benchmark", "--max-prompt=3"), "did you mean --max-prompts?"),
        (("benchmark", "-a", "3"), "-a was --max-seconds"),
        (("compare", "--base=x", "--candidate=y", f"--resamples={10**9}"), "--resamples: must be at most"),
        (("compare", "--base=x", "--candidate=y", "--output=/"), "--output: not a file name"),
        (("evidence.verify", "--root=/"), "not a research folder"),
    ],
)
def test_refused_with_one_error_line_before_any_work(argv, phrase):
    code, _, err = run(*argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1, err
    assert lines[0].startswith("error:") and phrase in lines[0], lines[0]


def test_integer_options_still_reach_the_task_as_integers(monkeypatch):
    from draftscope.head import bench

    seen = {}
    monkeypatch.setattr(bench, "main", lambda **kw: seen.update(kw))
    code, _, err = run("head-bench", "--hidden=64", "--repeats", "2")
    assert code == 0, err
    assert seen["hidden"] == 64 and seen["repeats"] == 2


def test_integer_options_are_still_shown_as_int_in_the_help():
    code, out, _ = run("--help", "bench-overhead")
    assert code == 0 and "--tokens=INT" in out and "--rounds=INT" in out
