"""The checkout's tasks.py hands invoke the package's namespace, nothing else."""

from __future__ import annotations

import importlib.util

from support import ROOT


def test_checkout_and_package_agree_on_the_namespace():
    spec = importlib.util.spec_from_file_location("checkout_tasks", ROOT / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from draftscope.cli import ns

    assert module.ns is ns and module.__all__ == ["ns"]
