"""`invoke images.push` / `images.pull` against a stand-in engine and registry (the container tier does it for real,
tests/container/test_publish_by_digest.py): the digest recorded is the one the registry serves, checked against the image
that was pushed; a local base is pushed beside its image; a pull takes a digest and refuses a tag."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.ops import images as I

LOCK = I.load_lock()
BASE = "localhost/debian-py:ci"


class Stand:
    """An engine (images by reference: ID and labels) and a registry (target -> raw manifest) in one."""

    def __init__(self):
        self.images = {
            "localhost/draftscope-transformers:0.1.0": ("sha256:" + "a" * 64, {I.BASE_LABEL: BASE}),
            BASE: ("sha256:" + "b" * 64, {}),
        }
        self.registry: dict[str, str] = {}
        self.calls: list[list[str]] = []
        self.swap = None  # a target whose manifest another push replaced

    def __call__(self, argv, capture):
        self.calls.append(list(argv))
        engine, verb, *rest = argv
        if engine == "skopeo":
            raw = self.registry.get(rest[-1].removeprefix("docker://"))
            return (0, raw, "") if raw else (1, "", "manifest unknown")
        if verb == "image":
            found = self.images.get(rest[-1])
            if not found:
                return 1, "", "no such image"
            return 0, json.dumps([{"Id": found[0], "Config": {"Labels": found[1]}}]), ""
        if verb == "tag":
            self.images[rest[1]] = self.images[rest[0]]
            return 0, "", ""
        if verb == "push":
            image_id = self.images[rest[0]][0] if rest[0] != self.swap else "sha256:" + "f" * 64
            manifest = {"schemaVersion": 2, "config": {"digest": image_id}, "layers": []}
            self.registry[rest[0]] = json.dumps(manifest, separators=(",", ":"))
            return 0, "", ""
        raise AssertionError(argv)


def digest_of(raw):
    return "sha256:" + hashlib.sha256(raw.encode()).hexdigest()


def test_a_push_records_the_registrys_digest_and_pushes_a_local_base_beside_it():
    stand = Stand()
    pushed = I.push_image("transformers", "127.0.0.1:5000/ds/transformers", "docker", LOCK, stand)
    target = "127.0.0.1:5000/ds/transformers:0.1.0"
    assert pushed.digest == digest_of(stand.registry[target]) and pushed.image_id == "sha256:" + "a" * 64
    assert pushed.base == {
        "reference": BASE,
        "repository": "127.0.0.1:5000/ds/debian-py",
        "digest": digest_of(stand.registry["127.0.0.1:5000/ds/debian-py:ci"]),
    }
    assert ["docker", "push", target] in stand.calls
    lock = I.record_push(LOCK, "transformers", pushed)
    schema.check(lock, "images-lock", "lock")
    entry = lock["images"]["transformers"]
    assert (entry["repository"], entry["digest"]) == ("127.0.0.1:5000/ds/transformers", pushed.digest)
    assert LOCK["images"]["transformers"].get("repository") is None  # the input is not changed
    assert I.pull_steps("transformers", "podman", lock) == [
        ["podman", "pull", f"127.0.0.1:5000/ds/transformers@{pushed.digest}"],
        ["podman", "tag", f"127.0.0.1:5000/ds/transformers@{pushed.digest}", entry["reference"]],
    ]


def test_a_registry_holding_another_image_under_the_tag_is_not_recorded():
    stand = Stand()
    stand.swap = "r.example/ds/transformers:0.1.0"
    with pytest.raises(UserError, match="not the image pushed") as info:
        I.push_image("transformers", "r.example/ds/transformers", "docker", LOCK, stand)
    assert info.value.field == "image_id"


def test_pushing_an_image_that_was_not_built_names_the_make_target():
    stand = Stand()
    with pytest.raises(UserError, match="not present") as info:
        I.push_image("vllm", "r.example/ds/vllm", "docker", LOCK, stand)
    assert "make image-vllm" in info.value.render() and stand.calls == [stand.calls[0]]


def test_a_pull_needs_a_published_digest_and_refuses_a_tag():
    with pytest.raises(UserError, match="no published digest") as info:
        I.pull_steps("vllm", "docker", LOCK)
    assert info.value.field == "images.vllm.digest" and "DRAFTSCOPE_IMAGES_LOCK" in info.value.render()
    for ref in (
        "r.example/ds/vllm:0.1.0",
        "r.example/ds/vllm",
        "r.example/ds/vllm@sha256:abc",
        "vllm@sha256:" + "1" * 64,
    ):
        with pytest.raises(UserError, match="pulling by tag is refused") as info:
            I.pull_steps("vllm", "docker", LOCK, ref)
        assert info.value.field == "--ref" and info.value.value == ref
    lock = copy.deepcopy(LOCK)
    lock["images"]["vllm"].update(repository="r.example/ds/vllm:0.1.0", digest="sha256:" + "1" * 64)
    with pytest.raises(UserError, match="pulling by tag is refused"):  # a hand-edited lock naming a tag
        I.pull_steps("vllm", "docker", lock)


def test_a_pulled_image_must_have_the_id_the_lock_recorded():
    lock = copy.deepcopy(LOCK)
    lock["images"]["vllm"].update(image_id="sha256:" + "a" * 64)
    same = json.dumps([{"Id": "sha256:" + "a" * 64}])
    assert I.check_pulled("vllm", lock, same) == "sha256:" + "a" * 64
    with pytest.raises(UserError, match=r"not the one images\.lock\.json recorded"):
        I.check_pulled("vllm", lock, json.dumps([{"Id": "sha256:" + "e" * 64}]))
    with pytest.raises(UserError, match="no image"):
        I.check_pulled("vllm", lock, "")


def test_a_push_destination_must_be_a_registry_repository():
    assert I.push_destination("registry:5000/x/y:t", "0.1.0") == ("registry:5000/x/y", "t")
    assert I.push_destination("ghcr.io/me/draftscope-train", "0.1.0") == (
        "ghcr.io/me/draftscope-train",
        "0.1.0",
    )
    for bad in ("localhost/foo", "foo", "ghcr.io/me/x@sha256:" + "1" * 64, "ghcr.io/Me/x"):
        with pytest.raises(UserError, match="--to"):
            I.push_destination(bad, "0.1.0")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(min_size=1, max_size=40).filter(lambda s: any(c in s for c in " ;$`|&()<>'\"\\\n\t*?!{}")))
def test_a_reference_with_any_shell_or_space_character_is_refused(text):
    with pytest.raises(UserError, match="--to"):
        I.push_destination("ghcr.io/me/" + text, "0.1.0")
    with pytest.raises(UserError, match="--ref"):
        I.check_digest_reference("ghcr.io/me/" + text + "@sha256:" + "1" * 64)
