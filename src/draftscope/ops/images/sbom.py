"""Reading an image's SBOM back out of it: the engine argv, and the check that what came out is the CycloneDX JSON
document the image's build wrote (`draftscope.core.sbom`, at `SBOM_PATH`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.images import lock_entry
from draftscope.core.sbom import SBOM_PATH, SPEC_VERSION
from draftscope.ops.images.build import check_engine

__all__ = ["SBOM_PATH", "check_sbom", "sbom_argv"]


def sbom_argv(name: str, engine: str, lock: Mapping[str, Any]) -> list[str]:
    """`ENGINE run --rm --network none --entrypoint cat REF SBOM_PATH`: the file, as the image's own user."""
    reference = lock_entry(name, lock)["reference"]
    return [
        check_engine(engine),
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "cat",
        reference,
        SBOM_PATH,
    ]


def check_sbom(text: str, name: str) -> dict[str, Any]:
    """The parsed SBOM when it is CycloneDX JSON of spec 1.5 naming the image `draftscope-NAME` and listing
    components; a UserError naming what is off otherwise (an image built before SBOMs, another image's file)."""
    source = f"the SBOM of image '{name}' ({SBOM_PATH})"
    fix = f"rebuild it with `invoke images.build {name}` (its build writes the SBOM)"
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise UserError(f"not JSON ({exc})", source=source, value=text[:80], fix=fix) from None
    if not isinstance(document, dict):
        raise UserError("not a JSON object", source=source, value=text[:80], fix=fix)
    expected = {"bomFormat": "CycloneDX", "specVersion": SPEC_VERSION}
    for field, wanted in expected.items():
        if document.get(field) != wanted:
            raise UserError(
                f"is not {wanted!r}", source=source, field=field, value=document.get(field), fix=fix
            )
    component = (document.get("metadata") or {}).get("component") or {}
    if component.get("name") != f"draftscope-{name}":
        raise UserError(
            f"names another image, not draftscope-{name}",
            source=source,
            field="metadata.component.name",
            value=component.get("name"),
            fix=fix,
        )
    if not isinstance(document.get("components"), list) or not document["components"]:
        raise UserError("lists no components", source=source, field="components", fix=fix)
    return document
