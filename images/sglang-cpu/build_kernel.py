"""Build SGLang's CPU kernel (`sgl_kernel`, AMX and AVX-512) from its sources into a wheel, against the torch of
the environment that runs this script. Used by images/sglang-cpu/Dockerfile; run as
`python build_kernel.py AOT_DIR OUT_DIR`, where AOT_DIR is `python/sglang/kernels/aot` of the release's sources.

The release builds it with CMake and scikit-build-core (AOT_DIR/csrc/cpu/CMakeLists.txt), which refuses a CUDA
build of torch that finds no CUDA toolkit; PyPI's torch is that build. So the same sources, include folders,
definitions and compiler flags as that CMakeLists.txt (x86_64) go through torch.utils.cpp_extension instead. The
wheel is named and versioned as the release's own (`sglang-kernel-cpu`, AOT_DIR/pyproject_cpu.toml), holds its
Python package `sgl_kernel` unchanged and the extension as `sgl_kernel/common_ops.*.so`, the path its loader falls
back to when no GPU is found (`sgl_kernel/load_utils.py`).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

# The CMakeLists.txt's x86_64 options, in its order, and its one definition (SGLANG_CPU_FP8_CVT_FTZ, on unless the
# environment sets it to something else). C++ 20: torch 2.13's headers use it (the CMake file asks for 17).
COMPILE_ARGS = [
    "-O3",
    "-Wno-unknown-pragmas",
    "-march=x86-64-v4",
    "-mavx512bf16",
    "-mavx512vnni",
    "-mamx-tile",
    "-mamx-bf16",
    "-mamx-int8",
    "-fopenmp",
    "-std=c++20",
    "-g0",  # after Python's own CFLAGS (-g): no debug sections, a faster build and a smaller library
]
ARCH_DIRS = ("x86_64", "aarch64", "ppc64")


def sources(cpu: Path) -> list[str]:
    """Every .cpp under csrc/cpu outside the architecture folders, then the x86_64 folder's (as the CMake file)."""
    found = [p for p in cpu.rglob("*.cpp") if p.relative_to(cpu).parts[0] not in ARCH_DIRS]
    found += list((cpu / "x86_64").rglob("*.cpp"))
    return sorted(str(p) for p in found)


def project(aot: Path) -> tuple[str, str]:
    meta = tomllib.loads((aot / "pyproject_cpu.toml").read_text(encoding="utf-8"))["project"]
    return meta["name"], meta["version"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python build_kernel.py AOT_DIR OUT_DIR", file=sys.stderr)
        return 2
    aot, out = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    cpu = aot / "csrc" / "cpu"
    if not (cpu / "CMakeLists.txt").is_file():
        print(
            f"error: {cpu} holds no CMakeLists.txt: AOT_DIR must be python/sglang/kernels/aot",
            file=sys.stderr,
        )
        return 2
    name, version = project(aot)
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version):
        print(f"error: {aot / 'pyproject_cpu.toml'}: version {version!r} is not a version", file=sys.stderr)
        return 2
    defines = []
    if os.environ.get("SGLANG_CPU_FP8_CVT_FTZ", "1") == "1":
        defines.append(("SGLANG_CPU_FP8_CVT_FTZ", None))

    # Imported here: the usage errors above need no torch.
    from setuptools import find_packages, setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    extension = CppExtension(
        "sgl_kernel.common_ops",
        sources(cpu),
        include_dirs=[str(cpu), str(aot / "csrc"), str(aot / "include")],
        define_macros=defines,
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=["-fopenmp"],
        libraries=["numa"],
    )
    os.chdir(aot)  # setuptools wants the package folder relative to the current one
    setup(
        name=name,
        version=version,
        description="SGLang's CPU kernel, built from the release's sources by draftscope's sglang-cpu image",
        license="Apache-2.0",
        packages=find_packages("python", include=["sgl_kernel", "sgl_kernel.*"]),
        package_dir={"": "python"},
        ext_modules=[extension],
        cmdclass={"build_ext": BuildExtension},
        script_args=["--quiet", "bdist_wheel", "--dist-dir", str(out)],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
