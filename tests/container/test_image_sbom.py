"""The built transformers image's SBOM and provenance labels: what `invoke images.sbom` reads out of it lists the
torch and Transformers the image actually has (asked by importing them in a container), and the build's labels
name the SBOM, the kit version and the lock hashes."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote

import pytest

from draftscope import __version__
from draftscope.core.sbom import SBOM_PATH, normalize
from draftscope.ops import images as I

from containerlib import ROOT, docker

pytestmark = pytest.mark.container

ASK = (
    "import json, platform, torch, transformers; print(json.dumps({'torch': torch.__version__,"
    " 'transformers': transformers.__version__, 'python': platform.python_version()}))"
)


@pytest.fixture(scope="module")
def image_sbom(kit_image, tmp_path_factory) -> dict:
    """The SBOM as `invoke images.sbom` writes it. Its `cat` runs as the image's user (10001): success also says that
    the file is readable by it."""
    out = tmp_path_factory.mktemp("sbom") / "transformers.cdx.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "images.sbom",
            "transformers",
            "--engine",
            "docker",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def labels(kit_image) -> dict:
    done = docker("image", "inspect", kit_image)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]["Config"]["Labels"]


def test_the_sbom_lists_what_the_image_has(kit_image, image_sbom):
    done = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python", kit_image, "-c", ASK, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    has = json.loads(done.stdout.strip().splitlines()[-1])
    libraries = {normalize(c["name"]): c for c in image_sbom["components"] if c["type"] == "library"}
    for name in ("torch", "transformers"):
        assert libraries[name]["version"] == has[name], (name, libraries[name], has[name])
        assert libraries[name]["purl"] == f"pkg:pypi/{name}@{quote(has[name], safe='')}"
    assert has["torch"].startswith("2.13.0")  # the CPU wheel of the test build, not the lock's CUDA torch
    assert libraries["draftscope"]["version"] == __version__
    (python,) = [c for c in image_sbom["components"] if c["type"] == "platform"]
    assert python["version"] == has["python"]
    assert image_sbom["metadata"]["component"]["name"] == "draftscope-transformers"


def test_the_labels_name_the_sbom_the_kit_and_the_lock_hashes(labels, image_sbom):
    entry = I.load_lock()["images"]["transformers"]
    assert labels["io.draftscope.sbom"] == SBOM_PATH
    assert labels["io.draftscope.kit-version"] == __version__
    assert labels["io.draftscope.lock-sha256"] == entry["lock_sha256"]
    assert labels["io.draftscope.images-lock-sha256"] == I.entry_sha256(entry)
    assert labels["org.opencontainers.image.revision"]
    # Both dated by the build's SOURCE_DATE_EPOCH: the SBOM is reproducible, not stamped with the build's clock.
    assert image_sbom["metadata"]["timestamp"] == labels["org.opencontainers.image.created"]


def test_the_image_sbom_validates_against_cyclonedx_1_5(image_sbom):
    from cyclonedx.schema import SchemaVersion  # a dev dependency: missing, the test fails rather than skips
    from cyclonedx.validation.json import JsonStrictValidator

    validator = JsonStrictValidator(SchemaVersion.V1_5)
    assert validator.validate_str(json.dumps(image_sbom)) is None
