"""A software bill of materials (CycloneDX 1.5 JSON) of the Python environment this runs in: what an image holds.

Every image writes one at build time, after the kit's install, to `SBOM_PATH` (`python -m draftscope sbom`), and
labels itself `io.draftscope.sbom` with that path; `invoke images.sbom NAME` reads it back out of a built image.

Stdlib only, read from `importlib.metadata` (nothing is imported): one `library` component per installed
distribution, sorted and deduplicated by package URL, with its licenses where the metadata names them, and one
`platform` component for the Python interpreter. The bytes are reproducible: with SOURCE_DATE_EPOCH set (as in an
image build) the timestamp is that time, and the serial number is a UUID derived from the rest of the document, so
the same environment gives the same file.
"""

from __future__ import annotations

import json
import platform
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from typing import Any
from urllib.parse import quote

from draftscope import __version__
from draftscope.core import settings
from draftscope.core.errors import UserError

# Inside every image; readable by the images' user (uid 10001). The Dockerfiles name it (a unit test checks).
SBOM_PATH = "/usr/share/draftscope/sbom.cdx.json"
SPEC_VERSION = "1.5"
_SERIAL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/draftscope/draftscope#sbom")

# A license-id-looking token: SPDX ids and LicenseRef-/DocumentRef- references, `+` for "or later".
_ID = re.compile(r"(?:DocumentRef-[A-Za-z0-9.-]+:)?(?:LicenseRef-)?[A-Za-z0-9][A-Za-z0-9.-]*\+?")
_TOKEN = re.compile(r"[()]|[^\s()]+")
_OPERATORS = ("AND", "OR", "WITH")


# SPDX ids with neither a digit nor a dash: the ones a free-text License field is likely to hold. Any other bare word
# there ("BSD", "PSFL") is a name, not an id (`spdx_like(text, strict=True)`).
_BARE_IDS = frozenset({"MIT", "ISC", "Zlib", "Unlicense", "PostgreSQL", "NCSA", "X11", "WTFPL", "curl"})


def spdx_like(text: str, *, strict: bool = False) -> bool:
    """Whether `text` has the shape of an SPDX license expression: ids joined by AND/OR, `id WITH exception`,
    parentheses. Shape only: the ids are not looked up in the SPDX list; `strict` also refuses bare words that
    are not well-known ids, for the free-text License field."""
    tokens = _TOKEN.findall(text)
    position = _expression(tokens, 0) if tokens else None
    if position != len(tokens):
        return False
    return not strict or all(_specific(t) for t in tokens if _is_id(t))


def _specific(token: str) -> bool:
    return (
        token in _BARE_IDS
        or token.startswith(("LicenseRef-", "DocumentRef-"))
        or bool(re.search(r"[-\d]", token))
    )


def _expression(tokens: list[str], i: int) -> int | None:
    """Parse `term ((AND|OR) term)*` from tokens[i:]; the index after it, or None."""
    i = _term(tokens, i)
    while i is not None and i < len(tokens) and tokens[i] in ("AND", "OR"):
        i = _term(tokens, i + 1)
    return i


def _term(tokens: list[str], i: int | None) -> int | None:
    if i is None or i >= len(tokens):
        return None
    if tokens[i] == "(":
        i = _expression(tokens, i + 1)
        return i + 1 if i is not None and i < len(tokens) and tokens[i] == ")" else None
    if not _is_id(tokens[i]):
        return None
    if i + 1 < len(tokens) and tokens[i + 1] == "WITH":
        return i + 3 if i + 2 < len(tokens) and _is_id(tokens[i + 2]) else None
    return i + 1


def _is_id(token: str) -> bool:
    return token not in _OPERATORS and _ID.fullmatch(token) is not None


def _text(value: object) -> str:
    """One line of valid UTF-8: metadata may carry undecodable bytes (surrogate escapes) and odd whitespace."""
    return " ".join(str(value).encode("utf-8", "replace").decode("utf-8").split())


def licenses(meta: Mapping[str, Any] | Any) -> list[dict[str, Any]]:
    """CycloneDX licenses from core metadata: License-Expression, else a short License field, else the license
    classifiers. An SPDX-shaped text becomes an `expression`, anything else a license `name`. A License field of
    several lines is the license's text, not its name, and is left out."""
    for field in ("License-Expression", "License"):
        raw = meta.get(field)
        if not raw or "\n" in str(raw).strip():
            continue
        text = _text(raw)
        if text and text.upper() != "UNKNOWN" and len(text) <= 200:
            if spdx_like(text, strict=field == "License"):
                return [{"expression": text}]
            return [{"license": {"name": text}}]
    names = []
    for classifier in meta.get_all("Classifier") or []:
        parts = [p.strip() for p in str(classifier).split("::")]
        if len(parts) > 1 and parts[0] == "License" and parts[-1] != "OSI Approved":
            names.append(_text(parts[-1]))
    return [{"license": {"name": n}} for n in dict.fromkeys(n for n in names if n)]


def normalize(name: str) -> str:
    """The PEP 503 form of a distribution name (the one a pypi package URL uses)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{quote(normalize(name), safe='')}@{quote(version, safe='')}"


def components(dists: Iterable[metadata.Distribution] | None = None) -> list[dict[str, Any]]:
    """One `library` component per distribution with a name and a version, deduplicated by package URL (the first
    on sys.path wins, as for imports) and sorted by it."""
    found: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions() if dists is None else dists:
        meta = dist.metadata
        name, version = meta.get("Name"), meta.get("Version")
        if not name or not version:
            continue  # a broken install: no name or version to report
        name, version = _text(name), _text(version)
        ref = purl(name, version)
        if ref in found:
            continue
        component: dict[str, Any] = {"type": "library", "bom-ref": ref, "name": name, "version": version}
        component["purl"] = ref
        if found_licenses := licenses(meta):
            component["licenses"] = found_licenses
        found[ref] = component
    return [found[ref] for ref in sorted(found)]


def timestamp(env: Mapping[str, str] | None = None) -> str:
    """SOURCE_DATE_EPOCH (reproducible builds) as RFC 3339 UTC, else now."""
    seconds = settings.SOURCE_DATE_EPOCH.get(env)
    moment = datetime.fromtimestamp(seconds, UTC) if seconds is not None else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def bom(
    image: str,
    *,
    env: Mapping[str, str] | None = None,
    dists: Iterable[metadata.Distribution] | None = None,
) -> dict[str, Any]:
    """The BOM of this environment as the image `image` (draftscope-<image>)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", image or ""):
        raise UserError(
            "not an image name", field="--image", value=image, fix="pass e.g. --image transformers"
        )
    python = {
        "type": "platform",
        "bom-ref": f"python:{platform.python_implementation()}@{platform.python_version()}",
        "name": platform.python_implementation(),
        "version": platform.python_version(),
        "description": "the Python interpreter the libraries are installed for",
    }
    document: dict[str, Any] = {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "timestamp": timestamp(env),
            "tools": {"components": [{"type": "application", "name": "draftscope", "version": __version__}]},
            "component": {
                "type": "container",
                "bom-ref": f"draftscope-{image}",
                "name": f"draftscope-{image}",
                "version": __version__,
            },
        },
        "components": [python, *components(dists)],
    }
    serial = uuid.uuid5(_SERIAL_NAMESPACE, json.dumps(document, sort_keys=True, ensure_ascii=False))
    return {"bomFormat": "CycloneDX", "specVersion": SPEC_VERSION, "serialNumber": serial.urn, **document}


def dumps(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
