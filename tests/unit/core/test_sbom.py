"""The SBOM generator (draftscope.core.sbom): what it lists against importlib.metadata of this environment, package
URLs, licenses from odd metadata, reproducible bytes, and the official CycloneDX 1.5 schema."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope import __version__
from draftscope.__main__ import main
from draftscope.core import sbom
from draftscope.core.errors import UserError

from support import ROOT

EPOCH = {"SOURCE_DATE_EPOCH": "1700000000"}
PURL = re.compile(r"pkg:pypi/[a-z0-9][a-z0-9-]*@(?:[A-Za-z0-9._~-]|%[0-9A-F]{2})+")


class Fields(dict):
    """Core metadata through the PackageMetadata protocol (get, get_all), holding any string as it is."""

    def get_all(self, key, failobj=None):
        value = self.get(key)
        return failobj if value is None else value if isinstance(value, list) else [value]


class Dist:
    """A distribution with the given core-metadata fields (a list for a repeated field such as Classifier)."""

    def __init__(self, **fields: str | list[str]) -> None:
        self.metadata = Fields({key.replace("_", "-"): value for key, value in fields.items()})


def _validator():
    from cyclonedx.schema import SchemaVersion  # a dev dependency: missing, the test fails rather than skips
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator(SchemaVersion.V1_5)


def _libraries(document) -> list[dict]:
    return [c for c in document["components"] if c["type"] == "library"]


def test_components_are_the_installed_distributions():
    document = sbom.bom("transformers", env=EPOCH)
    listed = {(sbom.normalize(c["name"]), c["version"]) for c in _libraries(document)}
    installed = {
        (sbom.normalize(d.metadata["Name"]), d.version)
        for d in metadata.distributions()
        if d.metadata["Name"] and d.version
    }
    assert listed == installed
    # Ground truth from the modules themselves, not from metadata.
    by_name = {sbom.normalize(c["name"]): c for c in _libraries(document)}
    assert by_name["pytest"]["version"] == pytest.__version__
    import hypothesis

    assert by_name["hypothesis"]["version"] == hypothesis.__version__
    refs = [c["bom-ref"] for c in document["components"]]
    assert len(refs) == len(set(refs)) and [c["purl"] for c in _libraries(document)] == sorted(refs[1:])


def test_metadata_names_the_image_the_kit_and_python():
    document = sbom.bom("vllm-cpu", env=EPOCH)
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.5"
    assert document["metadata"]["component"] == {
        "type": "container",
        "bom-ref": "draftscope-vllm-cpu",
        "name": "draftscope-vllm-cpu",
        "version": __version__,
    }
    assert document["metadata"]["tools"]["components"][0]["name"] == "draftscope"
    assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20Z"
    (python,) = [c for c in document["components"] if c["type"] == "platform"]
    assert python["version"] == platform.python_version()


def test_purls_are_well_formed_and_round_trip():
    for component in _libraries(sbom.bom("transformers", env=EPOCH)):
        assert PURL.fullmatch(component["purl"]), component["purl"]
        name, _, version = component["purl"].removeprefix("pkg:pypi/").partition("@")
        assert (unquote(name), unquote(version)) == (sbom.normalize(component["name"]), component["version"])
    assert sbom.purl("Foo_Bar.baz", "2.13.0+cpu") == "pkg:pypi/foo-bar-baz@2.13.0%2Bcpu"
    packageurl = pytest.importorskip("packageurl")
    parsed = packageurl.PackageURL.from_string(sbom.purl("torch", "2.13.0+cpu"))
    assert (parsed.type, parsed.name, parsed.version) == ("pypi", "torch", "2.13.0+cpu")


def test_duplicates_and_broken_installs():
    dists = [
        Dist(Name="Zeta_Pkg", Version="1.0", License="MIT"),
        Dist(Name="zeta-pkg", Version="1.0", License="GPL-3.0-only"),  # the same, later on sys.path
        Dist(Name="zeta-pkg", Version="2.0"),  # another version installed too: both are there
        Dist(Name="alpha", Version="0.1"),
        Dist(Version="9"),  # no name
        Dist(Name="noversion"),
    ]
    found = sbom.components(dists)
    assert [c["purl"] for c in found] == [
        "pkg:pypi/alpha@0.1",
        "pkg:pypi/zeta-pkg@1.0",
        "pkg:pypi/zeta-pkg@2.0",
    ]
    assert found[1]["licenses"] == [{"expression": "MIT"}] and found[1]["name"] == "Zeta_Pkg"
    assert "licenses" not in found[0]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"License_Expression": "MIT OR Apache-2.0", "License": "BSD"},
            [{"expression": "MIT OR Apache-2.0"}],
        ),
        ({"License_Expression": "(MIT AND", "License": "MIT"}, [{"license": {"name": "(MIT AND"}}]),
        ({"License": "BSD-3-Clause"}, [{"expression": "BSD-3-Clause"}]),
        (
            {"License": "GPL-2.0 WITH Classpath-exception-2.0"},
            [{"expression": "GPL-2.0 WITH Classpath-exception-2.0"}],
        ),
        ({"License": "BSD"}, [{"license": {"name": "BSD"}}]),  # a bare word: a name, not an SPDX id
        ({"License": "Apache 2.0"}, [{"license": {"name": "Apache 2.0"}}]),
        (
            {"License": "UNKNOWN", "Classifier": "License :: OSI Approved :: MIT License"},
            [{"license": {"name": "MIT License"}}],
        ),
        (
            {
                "License": "Copyright (c) 2020 X\n\nPermission is hereby granted",
                "Classifier": ["License :: OSI Approved"],
            },
            [],
        ),
        (
            {
                "Classifier": [
                    "License :: OSI Approved :: BSD License",
                    "License :: Public Domain",
                    "Topic :: X :: Y",
                ]
            },
            [{"license": {"name": "BSD License"}}, {"license": {"name": "Public Domain"}}],
        ),
        ({}, []),
    ],
)
def test_licenses(fields, expected):
    assert sbom.licenses(Dist(**fields).metadata) == expected


@pytest.mark.parametrize(
    ("text", "shaped"),
    [
        ("MIT", True),
        ("(MIT OR Apache-2.0) AND BSD-3-Clause", True),
        ("LicenseRef-Proprietary", True),
        ("GPL-2.0+", True),
        ("MIT AND", False),
        ("AND", False),
        ("()", False),
        ("MIT OR (Apache-2.0", False),
        ("MIT WITH", False),
        ("Apache 2.0", False),
        ("", False),
    ],
)
def test_spdx_shape(text, shaped):
    assert sbom.spdx_like(text) is shaped


def test_same_environment_same_bytes():
    first, second = (sbom.dumps(sbom.bom("train", env=EPOCH)) for _ in range(2))
    assert first == second
    other = sbom.bom("train", env={"SOURCE_DATE_EPOCH": "1700000001"})
    assert other["serialNumber"] != json.loads(first)["serialNumber"]
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", other["serialNumber"])


def test_the_command_writes_reproducible_bytes(tmp_path):
    env = {**os.environ, **EPOCH, "PYTHONPATH": str(ROOT / "src")}
    outputs = []
    for n in range(2):
        out = tmp_path / f"sbom{n}.json"
        argv = [sys.executable, "-m", "draftscope", "sbom", "--image", "sglang", "--output", str(out)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["metadata"]["component"]["name"] == "draftscope-sglang"


def test_the_command_refuses_bad_input(capsys, monkeypatch):
    assert main(["sbom", "--image", "nope"]) == 2
    assert "--image" in capsys.readouterr().err
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    assert main(["sbom", "--image", "transformers"]) == 2
    err = capsys.readouterr().err
    assert "SOURCE_DATE_EPOCH" in err and "yesterday" in err
    with pytest.raises(UserError, match="--image"):
        sbom.bom("Bad Name", env=EPOCH)
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    missing = ROOT / "no-such-folder" / "sbom.json"
    assert main(["sbom", "--image", "transformers", "--output", str(missing)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --output: cannot write the SBOM") and "no-such-folder" in line


def test_the_environment_bom_validates_against_cyclonedx_1_5():
    validator = _validator()
    assert validator.validate_str(sbom.dumps(sbom.bom("transformers", env=EPOCH))) is None
    assert validator.validate_str(sbom.dumps(sbom.bom("transformers", env={}))) is None  # dated now


ODD = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.sampled_from(
            ["MIT", "Apache-2.0", "AND", "OR", "WITH", "(", ")", " ", "\n", "\udce9", "é", "::", "+"]
        ),
        max_size=12,
    ).map("".join),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(expression=ODD, license_=ODD, classifiers=st.lists(ODD.map(lambda s: "License :: " + s), max_size=3))
def test_odd_license_metadata_never_makes_an_invalid_bom(expression, license_, classifiers):
    dist = Dist(
        Name="odd", Version="1.0", License_Expression=expression, License=license_, Classifier=classifiers
    )
    document = sbom.bom("transformers", env=EPOCH, dists=[dist])
    text = sbom.dumps(document)
    text.encode("utf-8")  # no lone surrogate survives
    for entry in document["components"][1].get("licenses", []):
        assert sbom.spdx_like(entry["expression"]) if "expression" in entry else entry["license"]["name"]
    assert _validator().validate_str(text) is None


def test_real_dist_info_metadata(tmp_path):
    """Through importlib.metadata itself: a folded multi-line License (the license's text) is left out."""
    info = tmp_path / "Odd_Pkg-1.2+local.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Odd_Pkg\nVersion: 1.2+local\n"
        "License: Copyright (c) 2020 Someone\n        \n        Permission is hereby granted\n"
        "Classifier: License :: OSI Approved :: MIT License\n",
        encoding="utf-8",
    )
    (found,) = sbom.components(metadata.distributions(path=[str(tmp_path)]))
    assert found["purl"] == "pkg:pypi/odd-pkg@1.2%2Blocal"
    assert found["licenses"] == [{"license": {"name": "MIT License"}}]
