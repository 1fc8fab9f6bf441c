"""A run directory that cannot lie (issue 19, acceptance 4): the summary carries its records' SHA-256 and follows
from them; `validate` and `analyze`/`compare` recompute both and refuse any disagreement, naming the field."""

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_analysis_synthetic import make_run

from draftscope.analysis.compare import compare_runs
from draftscope.analysis.load import load_run
from draftscope.core import integrity
from draftscope.core.errors import UserError
from draftscope.core.jsonio import sha256_file
from draftscope.core.validate import validate_run


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    make_run(root / "base", seed=1)
    make_run(root / "spec", seed=2, draft=True)
    return root


@pytest.fixture
def run(pristine, tmp_path):
    shutil.copytree(pristine / "spec", tmp_path / "spec")
    return tmp_path / "spec"


def lines(run):
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def write_lines(run, records):
    """As the run's appender writes them (sorted keys): unchanged records give the file back byte for byte."""
    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    (run / "records.jsonl").write_text(text, encoding="utf-8")


def summary(run):
    return json.loads((run / "summary.json").read_text())


def failure(run):
    report = validate_run(run)
    assert not report.ok
    return report.first_failure()


def test_a_written_summary_carries_its_records_hash_and_validates(run):
    assert summary(run)["records_sha256"] == sha256_file(run / "records.jsonl")
    write_lines(run, lines(run))  # the tests' rewrite alone changes nothing
    assert summary(run)["records_sha256"] == sha256_file(run / "records.jsonl")
    report = validate_run(run)
    assert report.ok, report.first_failure()
    assert not any("warning" in v.detail for v in report.verdicts)


def test_one_token_id_changed_in_a_record_fails_naming_records_sha256(run, pristine):
    records = lines(run)
    records[3]["generated_token_ids"][5] += 1
    write_lines(run, records)
    assert failure(run).startswith("summary.json: $.records_sha256: records.jsonl has SHA-256")
    with pytest.raises(UserError, match=r"\$\.records_sha256"):
        load_run(run)
    with pytest.raises(UserError, match=r"\$\.records_sha256"):
        compare_runs(load_run(pristine / "base"), load_run(run))


def test_a_summary_with_tripled_medians_fails_naming_the_field(run):
    doc = summary(run)
    stored = doc["overall"]["request_tok_s"]["median"]
    doc["overall"]["request_tok_s"]["median"] = stored * 3
    (run / "summary.json").write_text(json.dumps(doc))
    message = failure(run)
    assert message.startswith("summary.json: $.overall.request_tok_s.median: the summary says")
    assert f"says {stored * 3!r} but its records give {stored!r}" in message
    with pytest.raises(UserError, match=r"\$\.overall\.request_tok_s\.median"):
        load_run(run)


def test_records_made_five_times_slower_with_the_summary_untouched_fail(run):
    records = lines(run)
    for r in records:
        r["request_seconds"] *= 5
        r["token_timestamps"] = [t * 5 for t in r["token_timestamps"]]
        r["request_tok_s"] /= 5
        r["decode_tok_s"] /= 5
    write_lines(run, records)
    assert "$.records_sha256" in failure(run)
    # A forger who also stamps the new hash is caught by the recomputed figures.
    doc = summary(run)
    doc["records_sha256"] = sha256_file(run / "records.jsonl")
    (run / "summary.json").write_text(json.dumps(doc))
    assert failure(run).startswith("summary.json: $.overall.decode_tok_s.max: the summary says")
    with pytest.raises(UserError, match=r"\$\.overall\.decode_tok_s\.max"):
        load_run(run)


def test_analyze_and_compare_read_the_same_recomputed_summary(run, pristine):
    loaded = load_run(run)
    assert loaded.summary == integrity.recompute(
        summary(run), loaded.records, integrity.prompt_ids(run), False
    )
    assert not any("records_sha256" in n for n in loaded.notes)


def test_a_summary_written_before_the_hash_warns_and_is_still_recomputed(run):
    doc = summary(run)
    del doc["records_sha256"], doc["overall"]["acceptance"]  # an older kit: no hash, no acceptance ledger
    (run / "summary.json").write_text(json.dumps(doc))
    report = validate_run(run)
    assert report.ok, report.first_failure()
    (warned,) = [v for v in report.verdicts if "warning" in v.detail]
    assert warned.line().startswith("ok   summary.json (summary): warning: records_sha256: missing")
    assert any("records_sha256: missing" in n for n in load_run(run).notes)
    doc["overall"]["request_seconds"]["min"] *= 2  # ... but every figure it has must still follow
    (run / "summary.json").write_text(json.dumps(doc))
    assert "$.overall.request_seconds.min" in failure(run)


def leaves(doc, where=()):
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from leaves(value, (*where, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from leaves(value, (*where, i))
    else:
        yield where, doc


def mutated(value, factor):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + max(1, int(factor))
    if isinstance(value, float):  # at least 1e-4 relative (or 0.01 from zero): far outside the 1e-9 tolerance
        return value * (1 + factor / 100) if value else factor
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 0.5
    return ["x"] if isinstance(value, list) else {"x": 1}  # an empty list or mapping gains an item


def put(doc, where, value):
    for key in where[:-1]:
        doc = doc[key]
    doc[where[-1]] = value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), factor=st.floats(min_value=0.01, max_value=300))
def test_any_single_field_change_of_a_record_or_a_summary_is_detected(run, data, factor):
    records_before = (run / "records.jsonl").read_bytes()
    summary_before = (run / "summary.json").read_bytes()
    try:
        if data.draw(st.booleans(), label="in a record"):
            records = lines(run)
            i = data.draw(st.integers(0, len(records) - 1), label="record")
            where, value = data.draw(st.sampled_from(sorted(leaves(records[i]), key=str)), label="field")
            put(records[i], where, mutated(value, factor))
            write_lines(run, records)
        else:
            doc = summary(run)
            where, value = data.draw(st.sampled_from(sorted(leaves(doc), key=str)), label="figure")
            put(doc, where, mutated(value, factor))
            (run / "summary.json").write_text(json.dumps(doc))
        assert not validate_run(run).ok
    finally:
        (run / "records.jsonl").write_bytes(records_before)
        (run / "summary.json").write_bytes(summary_before)


def test_a_run_of_the_first_max_prompts_is_recomputed_over_those_prompts(tmp_path):
    """`--max-prompts N` (or `--dataset NAME` with it): the summary covers the first N prompts of the copied file, and
    so does the recomputation; the prompts past N are not 'missing'."""
    import json

    from test_analysis_synthetic import make_run

    from draftscope.core.integrity import prompt_ids
    from draftscope.core.validate import validate_run

    run = make_run(tmp_path / "r")
    manifest = json.loads((run / "manifest.json").read_text())
    everything = prompt_ids(run)
    assert everything and len(everything) > 2
    manifest["config"]["max_prompts"] = 2
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert prompt_ids(run) == everything[:2]
    report = validate_run(run)
    assert (
        not report.ok
        and "$.prompts_completed: the summary says 12 but its records give 2" in report.first_failure()
    )
