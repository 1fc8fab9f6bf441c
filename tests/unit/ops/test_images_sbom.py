"""The images' SBOMs and provenance labels on the host side: every Dockerfile writes and labels the SBOM after the
kit's install, build_argv labels the lock hashes, `invoke images.sbom` reads the file out and checks it."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess

import pytest
from invoke import Collection, Program

from draftscope import __version__
from draftscope.core import sbom
from draftscope.core.errors import UserError
from draftscope.ops import images as I

from support import ROOT

LOCK = I.load_lock()
EPOCH = {"SOURCE_DATE_EPOCH": "1700000000"}


@pytest.mark.parametrize("name", I.IMAGES)
def test_every_dockerfile_writes_the_sbom_after_the_kit_and_labels_it(name):
    text = (ROOT / "images" / name / "Dockerfile").read_text()
    step = f"python -m draftscope sbom --image {name} --output {sbom.SBOM_PATH}"
    assert text.count(step) == 1
    assert text.index("sh /tmp/install-kit-wheel.sh") < text.index(step)
    assert text.index(step) < text.index("\nLABEL ") < text.index("\nUSER 10001:10001")
    assert f"chmod 0644 {sbom.SBOM_PATH}" in text  # readable by the images' user
    assert f'io.draftscope.sbom="{sbom.SBOM_PATH}"' in text
    if name == "vllm":  # the prefix-head plugin's registration is checked with the kit, before the SBOM
        assert text.index('entry_points(group="vllm.general_plugins")') < text.index(step)


@pytest.mark.parametrize("name", ["transformers", "sglang"])
def test_build_argv_labels_the_kit_version_and_lock_hashes(name):
    argv = I.build_argv(name, I.BuildRequest(revision="c" * 40, epoch=1), LOCK)
    labels = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")
    entry = LOCK["images"][name]
    assert labels["io.draftscope.kit-version"] == __version__
    assert labels["io.draftscope.lock-sha256"] == entry["lock_sha256"]
    lock_file = ROOT / "images" / name / "requirements.lock"
    assert labels["io.draftscope.lock-sha256"] == hashlib.sha256(lock_file.read_bytes()).hexdigest()
    # Recomputed the way images/README.md tells a reviewer to.
    pinned = {k: v for k, v in entry.items() if k != "digest"}
    expected = hashlib.sha256(json.dumps(pinned, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert labels["io.draftscope.images-lock-sha256"] == expected
    assert labels["org.opencontainers.image.revision"] == "c" * 40


def test_the_entry_hash_ignores_the_pushed_digest_and_follows_every_pin():
    entry = json.loads(json.dumps(LOCK["images"]["transformers"]))
    before = I.entry_sha256(entry)
    assert I.entry_sha256({**entry, "digest": "sha256:" + "a" * 64}) == before
    assert I.entry_sha256({**entry, "wheel_sha256": "b" * 64}) != before
    assert I.entry_sha256({**entry, "base": {**entry["base"], "digest": "sha256:" + "c" * 64}}) != before
    assert I.entry_sha256(LOCK["images"]["vllm"]) != before


def test_sbom_argv():
    argv = I.sbom_argv("transformers", "podman", LOCK)
    assert argv == [
        "podman",
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "cat",
        LOCK["images"]["transformers"]["reference"],
        sbom.SBOM_PATH,
    ]
    with pytest.raises(UserError, match="--engine"):
        I.sbom_argv("transformers", "lxc", LOCK)
    with pytest.raises(UserError, match="no image named"):
        I.sbom_argv("nope", "docker", LOCK)


def _bom(image: str) -> str:
    return sbom.dumps(sbom.bom(image, env=EPOCH))


def test_check_sbom_accepts_the_generators_output():
    document = I.check_sbom(_bom("transformers"), "transformers")
    assert document["metadata"]["component"]["name"] == "draftscope-transformers"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("cat: /usr/share/draftscope/sbom.cdx.json: No such file", "not JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({"bomFormat": "SPDX"}), "bomFormat: is not 'CycloneDX'"),
        (json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.4"}), "specVersion: is not '1.5'"),
        (None, "metadata.component.name: names another image"),
        (
            json.dumps({**json.loads(_bom("transformers")), "components": []}),
            "components: lists no components",
        ),
    ],
)
def test_check_sbom_names_what_is_off(text, match):
    with pytest.raises(UserError, match=match) as info:
        I.check_sbom(_bom("vllm") if text is None else text, "transformers")
    assert "invoke images.build transformers" in str(info.value)


def _invoke(*args: str) -> None:
    from draftscope.cli.images import ns_images

    Program(namespace=Collection(ns_images), name="invoke", binary="invoke").run(["invoke", *args])


def test_task_runs_the_argv_it_prints_and_writes_the_file_byte_for_byte(monkeypatch, capsys, tmp_path):
    text = _bom("transformers")
    ran = []

    def fake_execute(argv, **kw):
        ran.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    monkeypatch.setattr(I, "execute", fake_execute)
    _invoke("images.sbom", "transformers", "--dry-run")
    printed = capsys.readouterr()
    assert printed.out == "" and ran == []
    out = tmp_path / "sbom.json"
    _invoke("images.sbom", "transformers", "--output", str(out))
    assert ran == [shlex.split(printed.err.strip())]
    assert out.read_text() == text
    _invoke("images.sbom", "transformers")
    assert capsys.readouterr().out == text  # stdout is the SBOM alone


def test_task_without_the_file_fails_in_one_line(monkeypatch, capsys):
    def fake_execute(argv, **kw):
        message = f"cat: {sbom.SBOM_PATH}: No such file or directory\n"
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr=message)

    monkeypatch.setattr(I, "execute", fake_execute)
    with pytest.raises(SystemExit) as info:
        _invoke("images.sbom", "sglang")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error:") and "No such file" in err and "invoke images.build sglang" in err
    monkeypatch.setattr(
        I, "execute", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, _bom("sglang"), "")
    )
    with pytest.raises(SystemExit) as info:
        _invoke("images.sbom", "sglang", "--output", str(ROOT / "no-such-folder" / "sbom.json"))
    assert info.value.code == 2
    assert "--output: cannot write the SBOM" in capsys.readouterr().err
