# draftscope — every target is a thin call into the kit (tasks.py / invoke) or a standard tool.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU runtime's torch. On machines whose pip serves a CPU wheel for this pin, nothing large is downloaded;
# elsewhere point pip at a CPU wheel index, e.g. `make setup TORCH_SPEC="torch==2.13.0 --index-url URL"`.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

# `make` alone prints this: the targets to start with, then every target's name, read from this file (so a new
# one is listed the day it is written). The comment above each target says what it does.
.DEFAULT_GOAL := help
define HELP
draftscope: make TARGET. The kit's own commands are invoke tasks (invoke --list); read on in docs/index.md.

Start here
  demo               the whole kit on the CPU, on tiny models it builds itself, no GPU: sets up .venv-train
                     first (~6 min from a fresh clone, ~3.5 once set up); then `. .venv-train/bin/activate`
                     puts the kit's `invoke` on PATH
  plan               the default GPU experiment plan: images, pinned models, each step's argv
Environments
  train-env          .venv-train, the CPU path's one environment: the kit, speculators and vLLM's CPU engine,
                     hash-locked in images/vllm-cpu/requirements.lock (vllm-env: the same)
  setup              .venv, the development environment: the kit, its CPU runtime, the test, lint and release
                     tools (what the test and lint targets use)
  run-env            .venv with the kit's CPU runtime only
Tests and lint (docs/develop/testing.md)
  test               lint and the fast tests (< 4 min on 2 cores), CI's first tier; test-slow the slower ones,
                     test-all every tier (test-fast, test-speculators, test-vllm, … one each)
  lint, format       ruff, the import contracts, hadolint; format rewrites what ruff can
Images, release, claims (images/README.md, ARTIFACT.md)
  images, image-NAME the pinned images (make -n image-NAME prints the engine command and builds nothing)
  dist               the wheel and sdist, checked; its SHA-256 recorded in images/images.lock.json
  reproduce CLAIM=ID one claim checked in the pinned images; kick-the-tires: every claim a CPU can check
  clean              removes .venv, build/ and dist/
endef
export HELP

.PHONY: help
help:
	@printf '%s\n\nEvery target:\n' "$$HELP"
	@awk -F: '/^define /{ d = 1 } /^endef/{ d = 0 } !d && /^[a-z][a-z0-9-]*:([^=]|$$)/ { print $$1 }' \
		$(firstword $(MAKEFILE_LIST)) | sort -u | tr '\n' ' ' | fold -s -w 108 | sed 's/^/  /; s/ *$$//'

.PHONY: setup run-env plan train-env vllm-env demo base-image cpu-images reproduce claim-given kick-the-tires test test-fast test-container test-contract test-reliability test-slurm test-vllm test-sglang-image test-sglang-cpu test-all lint format clean

setup: $(VENV)/.installed

# The development environment: the CPU runtime and the dev tools (tests, lint, triton, release). It also stands for
# the lighter one below (both markers).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[local,dev,export]'
	touch $(VENV)/.installed-run $@

# `$(WAIT) LABEL COMMAND…`: runs COMMAND and, while it runs, prints "LABEL: still running (N s)" every 5 s, so a
# long quiet step (pip unpacking torch, say) never leaves the terminal silent; COMMAND's exit status is kept, and
# Ctrl-C stops COMMAND too (a job started with & in a script ignores SIGINT).
WAIT = bash -c 'label=$$1; shift; "$$@" & pid=$$!; trap "kill $$pid 2>/dev/null; exit 130" INT TERM; t=0; while kill -0 $$pid 2>/dev/null; do sleep 1; t=$$((t + 1)); \
	if [ $$((t % 5)) -eq 0 ] && kill -0 $$pid 2>/dev/null; then echo "$$label: still running ($$t s)"; fi; done; \
	wait $$pid' _

# The kit and its CPU runtime alone (`.[local]`: torch, Transformers, resolved to their newest), without the dev
# extra (triton alone is about 1 GB) and without the engines. pip shows its progress here. INSTALL picks the
# installer, e.g. `make run-env INSTALL="uv pip install --python $(VENV)/bin/python"` where uv is on PATH.
INSTALL ?= $(BIN)/python -m pip install
run-env: $(VENV)/.installed-run

$(VENV)/.installed-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(WAIT) "installing torch" $(INSTALL) $(TORCH_SPEC)
	$(WAIT) "installing the kit (.[local])" $(INSTALL) -e '.[local]'
	touch $@

# Set-up, then the default experiment plan: what would run, in which image, on which pinned weights.
plan: setup
	$(BIN)/invoke plan

# The CPU path's one environment (.venv-train): the kit, vLLM's CPU backend (vllm-cpu 0.32.0) and speculators 0.9.0
# together, hash-locked in images/vllm-cpu/requirements.lock (the same lock the CPU vllm image installs). The lock
# also satisfies every requirement of the kit and its `local` extra (speculators caps transformers at 5.19, inside
# the kit's range), so the demo, the README's commands, the train stages, the real vLLM engine on the CPU
# (benchmarks, regen's server, the prefix-head plugin) and their tests all run in it. The CPU torch first, then the
# lock hash-checked without dependency resolution, then the kit (editable, no deps).
TRAIN_VENV ?= .venv-train
ENGINE_LOCK := images/vllm-cpu/requirements.lock

$(TRAIN_VENV)/.installed: $(ENGINE_LOCK) pyproject.toml
	$(PYTHON) -m venv $(TRAIN_VENV)
	$(WAIT) "$(TRAIN_VENV): installing torch" $(TRAIN_VENV)/bin/python -m pip install $(TORCH_SPEC)
	$(WAIT) "$(TRAIN_VENV): installing the engine lock" \
		$(TRAIN_VENV)/bin/python -m pip install --no-deps --require-hashes -r $(ENGINE_LOCK)
	$(TRAIN_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $@

train-env: $(TRAIN_VENV)/.installed

# The same environment under the name of what it also serves.
vllm-env: train-env

# The whole kit on a CPU in minutes: tiny baseline, speculative and prefix-head benchmarks, a head study, the tiny
# pipeline through convert, validation, a report and comparisons (see src/draftscope/ops/demo.py). All of it in the
# one CPU environment, which the README's commands use after it (`. .venv-train/bin/activate`).
demo: train-env
	$(TRAIN_VENV)/bin/invoke demo --train-python $(TRAIN_VENV)/bin/python

# --- tests, by cost (docs/develop/testing.md) ------------------------------------------------------------------
# Each tier is one pytest run over the markers of pyproject.toml; any non-zero exit fails it, pytest's 5 (no test
# collected) included. LOCAL: every test outside the tiers below (container, contract, reliability, Slurm, vLLM);
# `make test` runs its fast part (no network either), `make test-slow` the rest (marked `slow`). gpu tests skip
# without CUDA. TEST_WORKERS pytest-xdist workers (default 2), a test file per worker
# at a time (--dist loadfile: a module's fixtures, such as a tiny run several tests read, are made once);
# TEST_WORKERS=0 runs in this one process.
TEST_WORKERS ?= 2
LOCAL := not container and not contract and not reliability and not slurm and not vllm
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# The README's command and CI's first tier (under 4 min on 2 cores): lint, then the unit tests and the quick
# integration tests: planning, argv, schemas, records, the CLI, the decode loop on the tiny models, the head's math.
test: setup lint
	$(BIN)/python -m pytest -m "$(LOCAL) and not slow" $(XDIST) $(PYTEST_ARGS)

# The rest of LOCAL (~3.5 min on 2 cores; CI runs it right after `make test`): the tiny models' benchmarks, regen,
# pipeline and head study, the tiny build, the Triton kernels (interpreted and compiled), the property tests of
# 2,000 cases, the wheel and a host install in fresh venvs (they install from the package index), research/'s
# verification, hostile run directories. Its report test needs the headless browser (tests/browser-install.sh).
.PHONY: test-slow
test-slow: setup
	$(BIN)/python -m pytest -m "$(LOCAL) and slow" $(XDIST) $(PYTEST_ARGS)

# A quick part of `make test` (about a minute): its unit tests that need no torch (pure Python: planning, argv,
# schemas, configs, records), over every core; no lint.
test-fast: setup
	$(BIN)/python -m pytest tests/unit -m "not torch and not slow" -n auto -q -p no:cacheprovider $(PYTEST_ARGS)

# A real container engine (podman + runc behind its Docker API, driven by the docker CLI; see images/local/):
# builds images/transformers/Dockerfile on a local base and runs benchmarks in it. Needs an answering engine.
# The images install the kit's wheel from dist/ by its recorded hash: `dist` first. The local Debian base is built
# before the tests (minutes on a cold machine, nothing when it exists), not inside the first test's time limit.
test-container: setup dist base-image
	$(BIN)/python -m pytest -m "container and not sglang_image and not sglang_cpu" $(PYTEST_ARGS)

# The real sglang image (built on first use): labels, SBOM, every planned argv through SGLang's own parser, a
# converted tiny draft's config read by SGLang. By hand: it shares no layer with the vllm image (~8 min cold).
test-sglang-image: setup dist base-image train-env
	$(BIN)/python -m pytest -m sglang_image $(PYTEST_ARGS)

# SGLang's CPU engine in the sglang-cpu image (built on first use from SGLANG_CPU_SOURCES=FILE, the kernel sources
# images/sglang-cpu/README.md names; ~15 min cold on 2 cores, the kernel ~6 of them): its self-check and the tests
# marked sglang_cpu. By hand, not in CI: CI has no copy of the sources file.
test-sglang-cpu: setup dist base-image
	@if [ -z "$(SGLANG_CPU_SOURCES)" ]; then echo "usage: make test-sglang-cpu SGLANG_CPU_SOURCES=FILE"; exit 2; fi
	$(ENGINE_UP) SGLANG_CPU_SOURCES='$(SGLANG_CPU_SOURCES)' $(BIN)/python -m pytest -m sglang_cpu $(PYTEST_ARGS)

# Upstream flags, config keys and lock files against the pinned releases (downloads wheels; needs the index).
test-contract: setup
	$(BIN)/python -m pytest -m contract $(PYTEST_ARGS)

# Fault injection (kills, a full disk, concurrent runs), the bad-input corpus and planted secrets, with the figures
# (`invoke reliability`). Root mounts a small tmpfs for the full-disk faults; the train faults use .venv-train.
test-reliability: setup
	$(BIN)/invoke reliability $(if $(PYTEST_ARGS),--pytest-args '$(PYTEST_ARGS)')

# A real single-node Slurm cluster on this machine (root; images/local/slurm-cluster.sh install adds the Debian
# packages): the tiny pipeline's CPU stages as jobs with a two-shard regen array, compared with a local run, a
# cancel, Ctrl-C and a time limit. The tests start the cluster and stop it; ~3 min (the time limit alone ~70 s).
test-slurm: setup
	$(BIN)/python -m pytest -m slurm $(PYTEST_ARGS)

# vLLM's real CPU engine (vllm-cpu, in the CPU engine environment): the vllm backend's tiny benchmarks through the
# CLI (plain; speculative with the tiny draft and the prefix switch), validate, and compare with Transformers; regen
# served by vLLM's OpenAI server, killed and resumed; hidden-state extraction through vLLM, as far as it goes.
test-vllm: setup train-env
	$(TRAIN_VENV)/bin/python -m pytest -m vllm $(PYTEST_ARGS)

# The training stages with the real speculators 0.9.0, in the CPU engine environment (it caps transformers at 5.19):
# pretokenize → prepare → hsextract → train → convert for each draft type (in .venv these tests skip: no speculators),
# and SGLang's layer rules read from a converted config with the transformers SGLang loads it with (5.19.0 here).
.PHONY: test-speculators
test-speculators: setup train-env
	$(TRAIN_VENV)/bin/python -m pytest tests/integration/test_pipeline_speculators.py \
		tests/unit/pipeline/test_pipeline_convert_semantics.py::test_sglang_layer_rules_read_from_the_converted_config \
		$(PYTEST_ARGS)

# Every tier CI runs, cheapest first (CI runs them as .ci/run; not test-sglang-image).
test-all: test test-slow test-contract test-container test-speculators test-vllm test-reliability test-slurm

# The layers (docs/develop/architecture.md): .importlinter's contracts, read from the source on every run (no cache).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/hadolint images/*/Dockerfile

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The local base image of the container tier and the CPU images (images/local/base-image.sh; podman, no registry).
base-image:
	images/local/base-image.sh

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache

# --- claims (research/claims.yaml; `invoke claims` lists them) -------------------------------------------------
# A container engine for the targets below: the one that answers, else the local podman service
# (images/local/podman-engine.sh; root, Debian).
ENGINE_UP = docker version >/dev/null 2>&1 || eval "$$(images/local/podman-engine.sh start)";
# The images the CPU claims run in, built here: transformers on the local Debian base with the CPU torch wheel (the
# host's TORCH_SPEC, for the base's Python 3.11), and vllm-cpu. Cached layers make a rebuild take seconds. With
# DRAFTSCOPE_IMAGES_LOCK naming a lock of published digests nothing is built: the images are pulled by digest.
CPU_IMAGES = $(if $(DRAFTSCOPE_IMAGES_LOCK),,cpu-images)

cpu-images: setup dist base-image
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
		--platform manylinux_2_28_x86_64 -d .wheels $(TORCH_SPEC)
	$(ENGINE_UP) $(BIN)/invoke images.build transformers --base-image localhost/debian-py:ci \
		--torch-wheel "$$(cd .wheels && ls torch-*cp311*.whl | sort | tail -n 1)"
	$(ENGINE_UP) $(BIN)/invoke images.build vllm-cpu

# One claim, checked in the pinned images: `make reproduce CLAIM=tiny-aa-tokens-identical`. Writes
# runs/claims/CLAIM/STAMP/verdict.json: reproduced, not reproduced (with the figures), needs <hardware>, or failed.
reproduce: claim-given setup $(CPU_IMAGES)
	$(ENGINE_UP) $(BIN)/invoke claims.reproduce '$(CLAIM)'

claim-given:
	@if [ -z "$(CLAIM)" ]; then echo "usage: make reproduce CLAIM=<id>   (invoke claims lists them)"; exit 2; fi

# Every claim a CPU can check, from pulled images, then a table of verdicts (runs/kick-the-tires/STAMP/). Without a
# lock of published digests the images built here are pushed to a loopback registry (images/local/registry.sh) and
# pulled by digest into a second, empty engine, which runs every check.
kick-the-tires: setup $(CPU_IMAGES)
	$(ENGINE_UP) $(BIN)/invoke kick-the-tires

# --- images (images/<name>/Dockerfile; `invoke images.build --help`) ---------------------------------------------
# CUDA_ARCH=9.0 (or '8.0;9.0') picks the vllm image's extension architectures; without it the host GPUs decide, and
# with neither the build stops with a one-line message. ENGINE=podman builds with podman.
# Under `make -n` the build line still runs (`+`), with --dry-run: it prints the exact engine argv (pinned base,
# build arguments, labels) and builds nothing.
ENGINE ?= docker
IMAGE_DRY_RUN = $(if $(findstring n,$(firstword -$(MAKEFLAGS))),--dry-run)
IMAGE_ARCH = $(if $(CUDA_ARCH),--cuda-arch '$(CUDA_ARCH)')

.PHONY: images image-transformers image-vllm image-train image-sglang image-vllm-cpu image-sglang-cpu

images: image-transformers image-vllm image-train image-sglang image-vllm-cpu

image-transformers: setup dist
	+$(BIN)/invoke images.build transformers --engine $(ENGINE) $(IMAGE_DRY_RUN)

# sglang: on the local Debian base too (its torch and xgrammar pins differ from vLLM's: nothing else is shared).
image-sglang: setup dist $(if $(IMAGE_DRY_RUN),,base-image)
	+$(BIN)/invoke images.build sglang --engine $(ENGINE) $(IMAGE_DRY_RUN)

# vllm: on the local Debian base (built here first, without a registry); train: on the vllm image, whose layers it
# shares (the build stops with a one-line message when that image is not built yet: `make image-vllm CUDA_ARCH=…`).
image-vllm: setup dist $(if $(IMAGE_DRY_RUN),,base-image)
	+$(BIN)/invoke images.build vllm $(IMAGE_ARCH) --engine $(ENGINE) $(IMAGE_DRY_RUN)

image-train: setup dist
	+$(BIN)/invoke images.build train --engine $(ENGINE) $(IMAGE_DRY_RUN)

# The CPU twin of vllm and train (tests, CI; not a GPU image), on the local base images/local/base-image.sh builds.
# Its torch is the CPU wheel for the base's Python 3.11, fetched into .wheels/ with the host's TORCH_SPEC; the build
# task picks the one of the version images.lock.json records and passes its SHA-256.
image-vllm-cpu: setup dist
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
		--platform manylinux_2_28_x86_64 -d .wheels $(TORCH_SPEC)
	+$(BIN)/invoke images.build vllm-cpu --engine $(ENGINE) $(IMAGE_DRY_RUN)

# The CPU twin of sglang (tests; not a GPU image): SGLang 0.5.18's CPU engine with its kernel built from the release's
# sources, a build input given as a file (SGLANG_CPU_SOURCES=FILE, checked against images.lock.json's
# kernel_sources; the tree never holds it), then the image's self-check: the tiny target served, one completion,
# /metrics scraped (SGLang's CPU engine needs AMX). Not in `images`: it needs that file.
SGLANG_CPU_SOURCES ?=
image-sglang-cpu: setup dist $(if $(IMAGE_DRY_RUN),,base-image)
	@if [ -z "$(SGLANG_CPU_SOURCES)" ]; then echo "usage: make image-sglang-cpu SGLANG_CPU_SOURCES=FILE  (SGLang's CPU kernel sources, images/sglang-cpu/README.md)"; exit 2; fi
	+$(ENGINE_UP) $(BIN)/invoke images.build sglang-cpu --kernel-sources '$(SGLANG_CPU_SOURCES)' --engine $(ENGINE) $(IMAGE_DRY_RUN)
	$(if $(IMAGE_DRY_RUN),,$(ENGINE_UP) images/sglang-cpu/self-check.sh $(ENGINE) "$$($(BIN)/python -c 'from draftscope.core.images import image_reference as r; print(r("sglang-cpu"))')")

# --- release: the wheel and the sdist -----------------------------------------------------------------------------
# `python -m build` (hatchling: the same tree builds the same wheel, byte for byte), `twine check`, then the wheel's
# SHA-256 recorded in images/images.lock.json: every image installs exactly that file (`--require-hashes`).
.PHONY: dist

dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python -m draftscope.ops.images record-wheel dist
