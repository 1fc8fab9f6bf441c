"""The reviewer's path on real parts (issue "The reviewer's path", acceptance 1): the transformers image, built from
its Dockerfile, is pushed to a real registry on loopback (Debian's docker-registry) with its local base; the lock
records the digests the registry serves; a second engine with its own, empty storage pulls by digest only — a tag is
refused — and `invoke reproduce` of a run made on the first engine gives the same token ids there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from draftscope.ops.engines import Engine

from containerlib import docker, registry
from support import ROOT, run_invoke, tiny_benchmark

# Build (cached), a run, two pushes, a pull of 1.6 GB and a reproduction: minutes on 2 cores.
pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]


def engine_docker(engine, *args):
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, env={**os.environ, **engine.env}
    )


def tokens(run):
    lines = (run / "records.jsonl").read_text().splitlines()
    return sorted(
        (r["prompt_id"], r["repeat"], tuple(r["generated_token_ids"])) for r in map(json.loads, lines)
    )


def test_pushed_images_pulled_by_digest_into_an_empty_engine_reproduce_a_run(kit_image, tmp_path):
    address = registry()
    lock = tmp_path / "images.lock.json"
    shutil.copyfile(ROOT / "images" / "images.lock.json", lock)
    run = tmp_path / "made-here"
    made = run_invoke(
        *tiny_benchmark("docker", "--repeats", "1", "--max-new-tokens", "12"),
        "--output",
        str(run),
        timeout=600,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]

    pushed = run_invoke(
        "images.push",
        "transformers",
        "--to",
        f"{address}/draftscope/transformers",
        "--lock",
        str(lock),
        timeout=900,
    )
    assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:]
    entry = json.loads(lock.read_text())["images"]["transformers"]
    (local,) = json.loads(docker("image", "inspect", kit_image).stdout)
    assert entry["repository"] == f"{address}/draftscope/transformers" and entry["image_id"] == local["Id"]
    assert entry["published_base"]["reference"] == "localhost/debian-py:ci"
    assert entry["published_base"]["repository"] == f"{address}/draftscope/debian-py"
    assert entry["published_base"]["digest"].startswith("sha256:")
    assert (
        run_invoke("images.list", timeout=120).returncode == 0
    )  # the checkout's lock is untouched and valid
    assert (
        json.loads((ROOT / "images" / "images.lock.json").read_text())["images"]["transformers"]["digest"]
        is None
    )

    reviewer = Engine(ROOT, tmp_path / "reviewer").start()
    try:
        env = {**reviewer.env, "DRAFTSCOPE_IMAGES_LOCK": str(lock)}
        assert engine_docker(reviewer, "image", "inspect", kit_image).returncode != 0  # an empty machine
        refused = run_invoke("reproduce", str(run), "--output", str(tmp_path / "none"), env=env, timeout=300)
        assert refused.returncode != 0 and "images.pull transformers" in refused.stdout + refused.stderr

        tag = run_invoke(
            "images.pull", "transformers", "--ref", f"{address}/draftscope/transformers:0.1.0", env=env
        )
        assert tag.returncode != 0 and "pulling by tag is refused" in tag.stdout + tag.stderr
        assert engine_docker(reviewer, "image", "inspect", kit_image).returncode != 0

        pulled = run_invoke("images.pull", "transformers", env=env, timeout=900)
        assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
        (there,) = json.loads(engine_docker(reviewer, "image", "inspect", kit_image).stdout)
        assert there["Id"] == local["Id"]
        assert f"{entry['repository']}@{entry['digest']}" in there["RepoDigests"]

        again, comparison = tmp_path / "reproduced-there", tmp_path / "reproduced.json"
        done = run_invoke(
            "reproduce",
            str(run),
            "--output",
            str(again),
            "--comparison",
            str(comparison),
            env=env,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "token ids identical" in done.stdout
        assert tokens(again) == tokens(run)
        verdict = json.loads(comparison.read_text())["reproduction"]
        assert verdict["image_check"] == "matched" and verdict["images"][0]["current"]["id"] == local["Id"]
    finally:
        reviewer.stop()
