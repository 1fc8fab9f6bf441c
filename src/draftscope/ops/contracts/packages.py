"""The upstream packages the kit is pinned to: where each pin lives, which wheel to read, and the kit's surface.

Pins are read where the kit keeps them, never repeated here: vLLM's is the backend's `PINNED_VERSION` (the
contract tier checks the images agree); speculators' and SGLang's are the `versions` the images lock records for
the train and sglang images (checked against their requirement locks by `invoke images.check`). The wheel's
platform is the one its image's lock is compiled for (sglang publishes manylinux_2_34 wheels only).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from draftscope.bench.backends.vllm import backend as V
from draftscope.core.errors import UserError
from draftscope.core.images import lock_entry
from draftscope.ops.contracts import surface as S
from draftscope.ops.contracts import wheels
from draftscope.ops.contracts.forms import Sources
from draftscope.ops.contracts.wheels import Release
from draftscope.ops.images.lockfile import LOCK_TARGETS

HS_CONNECTORS = "hs-connectors"  # speculators' hidden-state backends (the trainer's --hidden-states-path)


def image_version(image: str, package: str) -> str:
    """The version of `package` that images.lock.json records for `image`."""
    version = (lock_entry(image).get("versions") or {}).get(package)
    if not version:
        raise UserError(
            f"images.lock.json records no {package} version for the {image} image",
            field=f"images.{image}.versions.{package}",
            fix="restore images/images.lock.json from the repository",
        )
    return str(version)


def wheel_platform(image: str) -> str:
    """The wheel platform tag of an image's lock target: `x86_64-manylinux_2_34` → `manylinux_2_34_x86_64`."""
    arch, _, platform = LOCK_TARGETS[image][1].partition("-")
    return f"{platform}_{arch}"


@dataclass(frozen=True)
class Package:
    name: str
    image: str  # the image that installs it: its lock's platform, and (but for vLLM) its recorded pin
    surface: Callable[[], list[S.Item]]
    pin: Callable[[], str] | None = None  # where the pin is a constant of the kit

    def pinned(self) -> str:
        return self.pin() if self.pin else image_version(self.image, self.name)

    @property
    def platform(self) -> str:
        return wheel_platform(self.image)

    def sources(self, version: str) -> Sources:
        """The release `version` of this package (downloaded into the cache if it is not there)."""
        release = Release(wheels.release_wheel(self.name, version, platform=self.platform))
        extras: dict[str, Release | None] = {}
        if self.name == "speculators":
            pinned = requires(release, HS_CONNECTORS)
            extras[HS_CONNECTORS] = (
                Release(wheels.release_wheel(HS_CONNECTORS, pinned, platform=self.platform))
                if pinned
                else None
            )
        return Sources(release, extras)


PACKAGES = {
    p.name: p
    for p in (
        Package("vllm", "vllm", S.vllm_items, pin=lambda: V.PINNED_VERSION),
        Package("speculators", "train", S.speculators_items),
        Package("sglang", "sglang", S.sglang_items),
    )
}


def requires(release: Release, name: str) -> str | None:
    """The exact version a wheel's METADATA pins `name` to (`Requires-Dist: name==X`), or None."""
    pattern = re.compile(rf"^Requires-Dist: {re.escape(name)}\s*==\s*([^\s;,]+)", re.IGNORECASE)
    for line in release.metadata_lines():
        if match := pattern.match(line):
            return match.group(1)
    return None


# PEP 440 versions and local tags: letters, digits and . + ! - _ only (the value becomes a pip requirement).
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*\Z")


def parse_spec(spec: str) -> tuple[Package, str]:
    """`NAME==VERSION` → (the package, the version); a one-line UserError naming the argument otherwise."""
    valid = ", ".join(PACKAGES)
    name, sep, version = spec.strip().partition("==")
    name, version = name.strip().lower(), version.strip()
    if not sep or not name or not version:
        raise UserError(
            "expected NAME==VERSION",
            field="argument",
            value=spec,
            fix=f"e.g. vllm==0.32.0 (packages: {valid})",
        )
    if name not in PACKAGES:
        raise UserError(f"unknown package {name!r}", field="argument", value=spec, fix=f"use one of: {valid}")
    if not _VERSION.match(version):
        raise UserError(
            f"{version!r} is not a release version",
            field="argument",
            value=spec,
            fix=f"give a released version, e.g. {name}=={PACKAGES[name].pinned()}",
        )
    return PACKAGES[name], version
