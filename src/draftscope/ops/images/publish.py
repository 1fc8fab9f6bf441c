"""Publishing the kit's images to a registry and pulling them back by digest: the reviewer's path.

`push` tags a built image for a registry, pushes it, reads the manifest back from the registry (`skopeo inspect
--raw`: its SHA-256 is the digest) and checks that the manifest's config is the image that was built (the image ID,
which every engine that pulls it computes the same); a base built on this machine (`localhost/…`) is pushed beside
it, so the lock names a base a reviewer can pull too. The digests go into the lock. `pull` takes only
`repository@sha256:…` — a tag can move, a digest cannot — and tags what it pulled as the lock's reference, the name
the runtimes run it under, after checking its ID against the lock's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.images import is_local, lock_entry, published_reference, split_reference
from draftscope.core.provenance import now
from draftscope.ops.images.build import check_engine
from draftscope.ops.images.lockfile import _DIGEST
from draftscope.ops.images.registry import _COMPONENT, _DESTINATION, REPOSITORY, parse_inspect

# What `invoke images.pull` accepts: a repository and a digest, no tag.
_BY_DIGEST = re.compile(rf"{REPOSITORY}@sha256:[0-9a-f]{{64}}")
BASE_LABEL = "org.opencontainers.image.base.name"
PUSH_FIX = "push it with `invoke images.push NAME --to REGISTRY/NAMESPACE/REPO` (it records the digest)"

# run(argv, capture) -> (exit code, stdout, stderr): the caller's executor (it prints and runs each argv).
Run = Callable[[Sequence[str], bool], tuple[int, str, str]]


@dataclass
class Pushed:
    """What one push put into the registry, read back from it."""

    repository: str
    digest: str
    image_id: str
    base: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def check_digest_reference(reference: str, what: str = "--ref") -> str:
    """`repository@sha256:<64 hex>`, or a UserError: pulling by tag is refused."""
    if _BY_DIGEST.fullmatch(reference) is None:
        raise UserError(
            "pulling by tag is refused: a tag can be moved to another image, a digest cannot",
            field=what,
            value=reference,
            fix="pass REGISTRY/NAMESPACE/REPO@sha256:<64 hex digits> (the digest images.lock.json records)",
        )
    return reference


def pull_steps(name: str, engine: str, lock: Mapping[str, Any], ref: str | None = None) -> list[list[str]]:
    """`ENGINE pull REPO@DIGEST`, then `ENGINE tag REPO@DIGEST REFERENCE` (the name the runtimes run)."""
    entry = lock_entry(name, lock)
    if ref is None:
        ref = published_reference(entry)
        if ref is None:
            raise UserError(
                f"image '{name}' has no published digest in the lock (repository and digest are null)",
                field=f"images.{name}.digest",
                fix=f"{PUSH_FIX}, or point DRAFTSCOPE_IMAGES_LOCK at the lock of whoever published it;"
                f" to build it here instead: make image-{name}",
            )
        what = f"images.{name}.repository/digest"
    else:
        what = "--ref"
    check_digest_reference(ref, what)
    engine = check_engine(engine)
    return [[engine, "pull", ref], [engine, "tag", ref, entry["reference"]]]


def check_pulled(name: str, lock: Mapping[str, Any], inspect_stdout: str) -> str:
    """The pulled image's ID, checked against the one the lock recorded at push time (when it recorded one)."""
    entry = lock_entry(name, lock)
    found = parse_inspect(inspect_stdout)
    if found is None or not found.get("id"):
        raise UserError(f"the engine shows no image {entry['reference']} after the pull", field="image")
    expected = entry.get("image_id")
    if expected and found["id"] != expected:
        raise UserError(
            f"the pulled image's ID {found['id']} is not the one images.lock.json recorded at push time",
            field=f"images.{name}.image_id",
            value=expected,
            fix="the registry serves another image under that digest's repository: check the lock's source",
        )
    return found["id"]


def push_destination(to: str, default_tag: str) -> tuple[str, str]:
    """(repository, tag) of `--to REGISTRY/NAMESPACE/REPO[:TAG]`."""
    if _DESTINATION.fullmatch(to) is None:
        raise UserError(
            "not an image reference (a registry host, lowercase path components, an optional tag)",
            field="--to",
            value=to,
            fix="pass REGISTRY/NAMESPACE/REPO[:TAG], e.g. ghcr.io/me/draftscope-vllm",
        )
    repository, tag, digest = split_reference(to)
    if digest or "/" not in repository or is_local(repository):
        raise UserError(
            "not a registry destination",
            field="--to",
            value=to,
            fix="pass REGISTRY/NAMESPACE/REPO[:TAG], e.g. ghcr.io/me/draftscope-vllm",
        )
    return repository, tag or default_tag


def base_destination(repository: str, base: str) -> tuple[str, str]:
    """Where a local base goes: beside the image (same registry and namespace), under the base's own name."""
    base_repo, base_tag, _ = split_reference(base)
    last = base_repo.rsplit("/", 1)[-1]
    if re.fullmatch(_COMPONENT, last) is None:
        raise UserError(
            "the local base's name is not a registry path component", field=BASE_LABEL, value=base
        )
    return f"{repository.rsplit('/', 1)[0]}/{last}", base_tag or "latest"


def manifest_facts(raw: str, source: str) -> tuple[str, str]:
    """(manifest digest, config digest) of a raw manifest as the registry served it."""
    import hashlib

    digest = "sha256:" + hashlib.sha256(raw.encode()).hexdigest()
    try:
        config = json.loads(raw)["config"]["digest"]
    except (ValueError, LookupError, TypeError):
        config = None
    if not isinstance(config, str) or not _DIGEST.match(config):
        raise UserError(
            "the registry's manifest names no image config (a manifest list is not what an engine pushes)",
            source=source,
        )
    return digest, config


def push_one(engine: str, local: str, repository: str, tag: str, run: Run) -> tuple[str, str]:
    """Tag, push, read back: (manifest digest, image ID). The registry's manifest must describe `local`."""
    code, out, err = run([engine, "image", "inspect", local], True)
    found = parse_inspect(out) if code == 0 else None
    if not found or not found.get("id"):
        raise UserError(f"image {local} is not present for {engine}", field="image", fix="build it first")
    target = f"{repository}:{tag}"
    for argv in ([engine, "tag", local, target], [engine, "push", target]):
        code, _, err = run(argv, False)
        if code != 0:
            raise UserError(f"`{' '.join(argv[:2])}` of {target} exited with {code}", source=engine)
    code, raw, err = run(["skopeo", "inspect", "--raw", f"docker://{target}"], True)
    if code != 0:
        raise UserError(
            f"could not read {target}'s manifest back: {(err.strip().splitlines() or ['no answer'])[-1]}",
            source="skopeo",
            fix="install skopeo (images/local/registry.sh install) and check the registry answers",
        )
    digest, config = manifest_facts(raw, f"docker://{target}")
    if config != found["id"]:
        raise UserError(
            f"the registry holds {config} under {target}, not the image pushed ({found['id']})",
            field="image_id",
            fix="another push raced this one: push again",
        )
    return digest, config


def push_image(name: str, to: str, engine: str, lock: Mapping[str, Any], run: Run) -> Pushed:
    """Push image `name` (and its base when that was built locally) to `to`; what landed, by digest."""
    entry = lock_entry(name, lock)
    engine = check_engine(engine)
    repository, tag = push_destination(to, entry["tag"])
    code, out, _ = run([engine, "image", "inspect", entry["reference"]], True)
    found = parse_inspect(out) if code == 0 else None
    if not found:
        raise UserError(
            f"image {entry['reference']} is not present for {engine}",
            field="image",
            fix=f"build it first: make image-{name}",
        )
    digest, image_id = push_one(engine, entry["reference"], repository, tag, run)
    pushed = Pushed(repository=repository, digest=digest, image_id=image_id)
    base = found["labels"].get(BASE_LABEL)
    if not base:
        pushed.notes.append(f"{name}: the image names no base ({BASE_LABEL}); none recorded")
    elif is_local(base):
        base_repo, base_tag = base_destination(repository, base)
        base_digest, _ = push_one(engine, base, base_repo, base_tag, run)
        pushed.base = {"reference": base, "repository": base_repo, "digest": base_digest}
    else:
        base_repo, _, base_digest = split_reference(base)
        pushed.base = {"reference": base, "repository": base_repo, "digest": base_digest}
        if not base_digest:
            pushed.notes.append(f"{name}: base {base} is not pinned by digest")
    return pushed


def record_push(lock: dict[str, Any], name: str, pushed: Pushed) -> dict[str, Any]:
    """The lock with the push recorded in image `name`'s entry (a new dict; the input is not changed)."""
    data = json.loads(json.dumps(lock))
    entry = data["images"][name]
    entry.update(
        repository=pushed.repository,
        digest=pushed.digest,
        image_id=pushed.image_id,
        pushed_at=now(),
        published_base=pushed.base,
    )
    data["generated_at"] = now()
    return data
