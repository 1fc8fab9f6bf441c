"""The head's AOT Triton cache, torch- and triton-free: CUDA architecture lists, the manifest, the GPU-less file checks
(ELF header of a cubin, PTX target, Triton's group file), the seeding of a writable cache, the command's errors.

The ELF headers here carry the `e_flags` of real cubins that Triton 3.9's ptxas wrote (`cuobjdump -elf` on them:
sm_80 `abi=7 flags=0x500550`, sm_90a `ABI=8 flags=0xa005a04`); the compiled ones are checked in
test_head_triton_aot.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from draftscope.__main__ import main
from draftscope.core.cuda_arch import capabilities, validate_cuda_arch
from draftscope.core.errors import UserError
from draftscope.head import triton_cache as tc

HASH = hashlib.sha256(b"a kernel").hexdigest()


def _cubin(abi: int, flags: int, machine: int = 190) -> bytes:
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5], header[7], header[8] = 2, 1, 0x41 if abi >= 8 else 0x33, abi
    struct.pack_into("<H", header, 18, machine)
    struct.pack_into("<I", header, 48, flags)
    return bytes(header) + b"\0" * 64


CUBIN = {80: _cubin(7, 0x500550), 90: _cubin(8, 0xA005A04)}


# --- architecture lists ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "caps"),
    [
        ("9.0", [90]),
        ("8.0;9.0", [80, 90]),
        ("9.0a", [90]),  # Triton picks sm_90a itself
        ("10.0+PTX 8.6", [86, 100]),
        ("8.0,8.0;9.0a;9.0", [80, 90]),
        (" 12.0 ", [120]),
    ],
)
def test_capabilities_are_tritons_integers(text, caps):
    assert capabilities(text) == caps


@pytest.mark.parametrize("text", ["", " ; ", "all", "9", "sm_90", "9.0b+ptx", "90"])
def test_a_bad_list_is_a_one_line_user_error_naming_the_flag(text):
    with pytest.raises(UserError) as caught:
        capabilities(text, "--cuda-arch")
    line = caught.value.render()
    assert "\n" not in line and "--cuda-arch" in line


def test_the_validator_moved_to_core_is_the_one_images_build_uses():
    from draftscope.ops import images

    assert images.validate_cuda_arch is validate_cuda_arch
    assert validate_cuda_arch("8.0 9.0;8.0") == "8.0;9.0"


def test_head_aot_rejects_a_bad_arch_in_one_line_before_importing_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
        "from draftscope.__main__ import main\n"
        "sys.exit(main(['head-aot', '--cuda-arch', 'all', '--cache-dir', sys.argv[1]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--cuda-arch" in proc.stderr and "'all'" in proc.stderr
    assert not (tmp_path / "c").exists()


def test_head_aot_rejects_a_bad_geometry(capsys):
    assert main(["head-aot", "--cuda-arch", "9.0", "--geometry", "151936x4096"]) == 2
    assert "--geometry" in capsys.readouterr().err


# --- the files of one entry -----------------------------------------------------------------------------------


def test_key_dir_is_tritons_folder_name():
    assert tc.key_dir(HASH) == base64.b32encode(bytes.fromhex(HASH)).decode().rstrip("=")
    cache = pytest.importorskip("triton.runtime.cache")
    assert tc.key_dir(HASH) == cache._base32(HASH)


def test_cubin_sm_reads_both_elf_abis():
    assert tc.cubin_sm(CUBIN[80]) == 80
    assert tc.cubin_sm(CUBIN[90]) == 90
    assert tc.cubin_sm(_cubin(7, 0x500550, machine=62)) is None  # x86-64, not CUDA
    assert tc.cubin_sm(b"\x7fELF") is None
    assert tc.cubin_sm(b"//\n.version 8.7\n.target sm_90a") is None


def test_ptx_targets():
    assert tc.ptx_target("//\n.version 8.7\n.target sm_90a\n.address_size 64") == "sm_90a"
    assert tc.ptx_target(".target sm_80\n") == "sm_80"
    assert tc.ptx_target("no target") is None
    assert [tc.expected_target(a) for a in (80, 86, 90, 100)] == ["sm_80", "sm_86", "sm_90a", "sm_100a"]


def _entry(arch: int = 90, kernel: str = "refine_kernel", cache_key: str = HASH) -> dict:
    return {
        "kernel": kernel,
        "arch": arch,
        "target": tc.expected_target(arch),
        "specialization": {"signature": {"M": "i32"}, "constexprs": {"BLOCK_M": 16}, "attrs": {}},
        "cache_key": cache_key,
        "key_dir": tc.key_dir(cache_key),
        "cubin_sha256": hashlib.sha256(CUBIN[arch]).hexdigest(),
        "shared": 512,
        "num_warps": 4,
        "num_stages": 3,
    }


def _write_entry(folder: Path, entry: dict, *, ptx_target: str | None = None) -> Path:
    """The files Triton writes for one compiled kernel, with the group file naming them by absolute path."""
    key = folder / entry["key_dir"]
    key.mkdir(parents=True)
    name = entry["kernel"]
    meta = {"name": name, "hash": entry["cache_key"], "target": {"backend": "cuda", "arch": entry["arch"]}}
    files = {
        f"{name}.json": json.dumps(meta),
        f"{name}.ptx": f".version 8.7\n.target {ptx_target or tc.expected_target(entry['arch'])}\n",
        f"{name}.ttir": "module {}",
    }
    for fname, text in files.items():
        (key / fname).write_text(text)
    (key / f"{name}.cubin").write_bytes(CUBIN[entry["arch"]])
    children = {p.name: str(p) for p in sorted(key.iterdir())}
    (key / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return key


def _manifest(entries: list[dict]) -> dict:
    return tc.manifest(
        entries,
        triton_version="3.8.0",
        cuda_arch="8.0;9.0",
        geometries=[],
        env={},
        replay={"90": {"hits": 1}},
    )


def test_a_complete_entry_has_no_problems(tmp_path):
    entries = [_entry(80, cache_key=hashlib.sha256(b"80").hexdigest()), _entry(90)]
    for e in entries:
        _write_entry(tmp_path, e)
    data = _manifest(entries)
    assert data["archs"] == [80, 90] and [e["arch"] for e in data["entries"]] == [80, 90]
    assert tc.cache_problems(tmp_path, data) == []


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (lambda key, e: (key / "refine_kernel.cubin").write_bytes(CUBIN[80]), "SHA-256"),
        (
            lambda key, e: (
                e.update(cubin_sha256=hashlib.sha256(CUBIN[80]).hexdigest())
                or (key / "refine_kernel.cubin").write_bytes(CUBIN[80])
            ),
            "ELF for sm 80",
        ),
        (lambda key, e: (key / "refine_kernel.ptx").write_text(".target sm_90\n"), "PTX targets sm_90,"),
        (
            lambda key, e: (key / "refine_kernel.json").write_text('{"name": "refine_kernel", "target": {}}'),
            "target",
        ),
        (lambda key, e: (key / "refine_kernel.ttir").unlink(), "not a file"),
        (lambda key, e: (key / "__grp__refine_kernel.json").write_text("{"), "unreadable"),
    ],
    ids=[
        "cubin-changed",
        "cubin-other-sm",
        "ptx-not-arch-specific",
        "metadata-target",
        "file-gone",
        "group-bad",
    ],
)
def test_a_spoiled_entry_is_named(tmp_path, spoil, expected):
    entry = _entry(90)
    key = _write_entry(tmp_path, entry)
    spoil(key, entry)
    problems = tc.entry_problems(tmp_path, entry)
    assert problems and expected in problems[0] and "refine_kernel sm_90" in problems[0], problems


def test_a_group_file_naming_another_folder_is_a_problem(tmp_path):
    entry = _entry(90)
    _write_entry(tmp_path / "built-here", entry)
    moved = tmp_path / "moved"
    (tmp_path / "built-here").rename(moved)
    assert "not a file of this entry's folder" in tc.entry_problems(moved, entry)[0]


# --- the manifest ---------------------------------------------------------------------------------------------


def test_manifest_round_trip_and_shape_checks(tmp_path):
    data = _manifest([_entry(90)])
    tc.write_manifest(tmp_path, data)
    assert tc.read_manifest(tmp_path) == data
    assert data["kind"] == tc.KIND and data["schema_version"] == tc.SCHEMA_VERSION
    assert tc.manifest_problems({**data, "kind": "x"}) == ["kind is 'x', not 'draftscope.head_triton_aot'"]
    assert tc.manifest_problems({**data, "entries": []}) == ["no entries"]
    bad = {**_entry(90), "key_dir": "OTHER"}
    assert "cache_key and key_dir disagree" in tc.manifest_problems({**data, "entries": [bad]})[0]
    short = {k: v for k, v in _entry(90).items() if k != "cubin_sha256"}
    assert "lacks cubin_sha256" in tc.manifest_problems({**data, "entries": [short]})[0]
    with pytest.raises(ValueError):
        tc.write_manifest(tmp_path, {**data, "entries": []})


def test_a_missing_manifest_is_a_one_line_user_error(tmp_path):
    with pytest.raises(UserError) as caught:
        tc.read_manifest(tmp_path)
    assert "\n" not in caught.value.render() and "head-aot" in caught.value.render()


# --- seeding the engine's writable cache ---------------------------------------------------------------------


def _image(tmp_path: Path) -> Path:
    image = tmp_path / "image"
    entries = [_entry(80, cache_key=hashlib.sha256(b"80").hexdigest()), _entry(90)]
    for e in entries:
        _write_entry(image, e)
    tc.write_manifest(image, _manifest(entries))
    return image


def test_seed_copies_each_entry_once_and_points_its_group_at_the_copies(tmp_path):
    image, cache = _image(tmp_path), tmp_path / "writable"
    data = tc.read_manifest(image)
    assert sorted(tc.seed(image, cache)) == sorted(e["key_dir"] for e in data["entries"])
    assert tc.cache_problems(cache, data) == []  # every file the groups name is in the writable cache
    group = json.loads((cache / _entry(90)["key_dir"] / "__grp__refine_kernel.json").read_text())
    assert all(Path(p).parent == cache / _entry(90)["key_dir"] for p in group["child_paths"].values())
    assert tc.seed(image, cache) == []  # already there: untouched
    assert not [p for p in cache.iterdir() if p.name.startswith(".draftscope-seed-")]
    assert oct(os.stat(cache / _entry(90)["key_dir"]).st_mode & 0o777) == "0o755"


def test_use_image_cache_seeds_the_writable_cache_and_sets_triton_cache_dir(tmp_path):
    image = _image(tmp_path)
    env = {tc.ENV_AOT_CACHE: str(image), "HOME": str(tmp_path / "home")}
    facts = tc.use_image_cache(env)
    default = str(tmp_path / "home" / ".triton" / "cache")
    assert env["TRITON_CACHE_DIR"] == default  # set explicitly: Triton and inductor agree on it
    assert (
        facts["state"] == "seeded" and facts["copied"] == facts["entries"] == 2 and facts["archs"] == [80, 90]
    )
    assert tc.use_image_cache(env)["copied"] == 0


def test_use_image_cache_keeps_a_set_cache_dir_and_reports_env_differences(tmp_path):
    image = _image(tmp_path)
    env = {
        tc.ENV_AOT_CACHE: str(image),
        "TRITON_CACHE_DIR": str(tmp_path / "run"),
        "TRITON_DEFAULT_FP_FUSION": "0",
    }
    facts = tc.use_image_cache(env)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "run") and (tmp_path / "run").is_dir()
    assert facts["state"] == "seeded-env-differs" and facts["env_differs"] == ["TRITON_DEFAULT_FP_FUSION"]


def test_use_image_cache_never_raises(tmp_path):
    assert tc.use_image_cache({tc.ENV_AOT_CACHE: str(tmp_path / "none")})["state"] == "absent"
    assert tc.use_image_cache({tc.ENV_AOT_CACHE: "0"})["state"] == "off"
    image = _image(tmp_path)
    in_place = tc.use_image_cache({tc.ENV_AOT_CACHE: str(image), "TRITON_CACHE_DIR": str(image)})
    assert in_place["state"] == "in-place"
    (tmp_path / "file").write_text("")
    blocked = tc.use_image_cache({tc.ENV_AOT_CACHE: str(image), "TRITON_CACHE_DIR": str(tmp_path / "file")})
    assert blocked["state"] == "not-seeded" and "Error" in blocked["reason"]
