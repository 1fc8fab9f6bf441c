"""The duplicate prompt id check is linear in the prompt count and names the first few duplicates."""

from __future__ import annotations

import json
import time

import pytest

from draftscope.bench.plan import load_prompts
from draftscope.core.errors import UserError


def test_duplicate_ids_in_a_large_prompt_file_are_found_fast_and_named(tmp_path, monkeypatch):
    n = 20_000  # each id twice: the old count-per-id check did 1.6e9 comparisons here
    items = [{"id": f"p{i % n:05d}", "messages": [{"role": "user", "content": "x"}]} for i in range(2 * n)]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema_version": 1, "name": "big", "prompts": items}))
    monkeypatch.setattr("draftscope.bench.plan.check", lambda *a: None)  # the schema is tested elsewhere
    started = time.monotonic()
    with pytest.raises(UserError) as err:
        load_prompts(str(path))
    line = err.value.render()
    assert "duplicate prompt ids ['p00000', 'p00001', 'p00002', 'p00003', 'p00004'] (and 19995 more)" in line
    assert "fix: give every prompt a unique id" in line
    assert time.monotonic() - started < 5  # quadratic: minutes
