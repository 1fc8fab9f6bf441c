import json

import pytest
from jsonschema import Draft202012Validator

from draftscope.core import schema
from draftscope.core.resources import schemas_dir

SCHEMA_FILES = sorted(schemas_dir().glob("*.schema.json"))
REQUIRED = {
    "common",
    "model-preset",
    "experiment",
    "run-manifest",
    "record",
    "summary",
    "images-lock",
    "prompts",
}


def test_the_required_schemas_exist():
    assert set(schema.schema_names()) >= REQUIRED


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: p.name)
def test_each_schema_is_valid_draft_2020_12_with_id_and_version(path):
    doc = json.loads(path.read_text())
    Draft202012Validator.check_schema(doc)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert doc["$id"] == schema.BASE_URI + path.name
    assert doc["schema_version"] == 1


@pytest.mark.parametrize("name", sorted(REQUIRED - {"common"}))
def test_each_schema_compiles_with_its_refs(name):
    # An empty object is invalid for every artifact schema; the call must resolve every $ref to say so.
    assert schema.problems({}, name)


def test_images_lock_example_validates_and_rejects_bad_digest():
    lock = {
        "schema_version": 1,
        "images": {
            "vllm": {
                "reference": "localhost/draftscope-vllm:0.1.0",
                "tag": "0.1.0",
                "base": {"reference": "vllm/vllm-openai:v0.33.0", "digest": None},
                "versions": {"vllm": "0.33.0", "torch": "2.14.0"},
                "lock_sha256": "0" * 64,
                "wheel_sha256": "1" * 64,
            }
        },
    }
    assert schema.problems(lock, "images-lock") == []
    lock["images"]["vllm"]["base"]["digest"] = "sha256:abc"
    found = schema.problems(lock, "images-lock")
    assert found and found[0].path == "$.images.vllm.base.digest"
    lock["images"]["vllm"]["base"]["digest"] = None
    lock["images"]["cuda-extra"] = lock["images"]["vllm"]
    assert schema.problems(lock, "images-lock")
    del lock["images"]["cuda-extra"]
    del lock["images"]["vllm"]["wheel_sha256"]  # every image records the kit wheel it installs
    assert [p.path for p in schema.problems(lock, "images-lock")] == ["$.images.vllm"]


def test_unknown_key_problem_names_the_key_and_the_valid_keys():
    found = schema.problems({"schema_version": 1, "name": "x", "prompts": [], "promtps": 1}, "prompts")
    messages = [p.message for p in found if p.path == "$.promtps"]
    assert messages and "unknown key 'promtps'" in messages[0] and "did you mean 'prompts'" in messages[0]
