"""Records round-trip through Arrow and Parquet, and validation names the field."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    RECORD_TYPES,
    Candidate,
    Finding,
    Message,
    RawModule,
    Rejection,
    SchemaError,
    SftRow,
    Task,
    TensorSpec,
    Verdict,
    content_hash,
)


def _task(**kw) -> Task:
    base = dict(task_id="t1", name="relu", source="src", cpu_source="cpu",
                input_specs=[TensorSpec("x", [16, 1024], "float32")],
                output_specs=[TensorSpec("out", [16, 1024], "float32")],
                op_inventory=["aten.relu"], op_families=["activation"], flops=1.0e4)
    base.update(kw)
    return Task(**base)


def test_every_record_has_versioned_schema_with_table_name():
    for name, cls in RECORD_TYPES.items():
        schema = cls.arrow_schema()
        assert schema.metadata[b"kernelsynth.table"].decode() == name
        assert int(schema.metadata[b"kernelsynth.schema_version"]) >= 1
        assert cls.KEY in schema.names


def test_task_round_trips_through_parquet(tmp_path):
    task = _task()
    path = Task.write_parquet([task], tmp_path / "t.parquet")
    assert Task.read_parquet(path) == [task]
    table = pq.read_table(path)
    assert table.schema.field("input_specs").type == Task.arrow_schema().field("input_specs").type


def test_verdict_with_nested_findings_and_nulls_round_trips():
    v = Verdict(candidate_id="c", task_id="t", status="cheat", stage="correctness", backend="cpu",
                findings=[Finding("torch_compute", "torch.matmul in forward", 12)],
                max_abs_diff=None, speedup=1.5)
    table = Verdict.to_arrow([v])
    assert table.column("findings").to_pylist()[0][0]["line"] == 12
    assert Verdict.from_arrow(table) == [v]


def test_validation_names_field_and_problem():
    with pytest.raises(SchemaError, match=r"Task.level: expected int, got str"):
        _task(level="1").validate()
    with pytest.raises(SchemaError, match=r"input_specs\[0\].shape\[1\]: expected int"):
        _task(input_specs=[TensorSpec("x", [2, "3"], "float32")]).validate()
    with pytest.raises(SchemaError, match=r"row 1: .*Candidate.code: is required"):
        Candidate.to_arrow([
            Candidate("a", "t", "cpu", "template:x", "code"),
            Candidate("b", "t", "cpu", "template:x", None),
        ])


def test_from_arrow_reports_missing_and_mistyped_columns():
    table = Task.to_arrow([_task()])
    with pytest.raises(SchemaError, match="column 'reasoning' is missing"):
        Task.from_arrow(table.drop_columns(["reasoning"]))
    bad = table.set_column(table.schema.get_field_index("flops"), "flops",
                           pa.array(["x"], pa.string()))
    with pytest.raises(SchemaError, match="column 'flops' has type string"):
        Task.from_arrow(bad)


def test_read_parquet_names_the_file_on_corrupt_input(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(SchemaError, match="bad.parquet: not a readable Parquet file"):
        Task.read_parquet(path)


def test_sft_messages_are_trl_conversational():
    row = SftRow(row_id="r", task_id="t", candidate_id="c", backend="cuda", level=1,
                 messages=[Message("system", "s"), Message("user", "u"),
                           Message("assistant", "a")])
    rows = SftRow.to_arrow([row]).to_pylist()
    assert rows[0]["messages"] == [{"role": "system", "content": "s"},
                                   {"role": "user", "content": "u"},
                                   {"role": "assistant", "content": "a"}]


def test_ids_are_content_hashes():
    a = RawModule.make_id("seed", "u", "c", "p", "M", "code")
    assert a == RawModule.make_id("seed", "u", "c", "p", "M", "code")
    assert a != RawModule.make_id("seed", "u", "c", "p", "M", "code2")
    assert content_hash("ab", "c") != content_hash("a", "bc")
    r = Rejection.make("ingest", "x", "f.py", "syntax")
    assert r.rejection_id == Rejection.make("ingest", "x", "f.py", "syntax").rejection_id


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=30), st.integers(-2**40, 2**40),
                          st.floats(allow_nan=False), st.none() | st.text(max_size=5)),
                max_size=8))
def test_candidates_round_trip_arbitrary_text(rows):
    cands = [Candidate(candidate_id=f"c{i}", task_id=t, backend="cpu", generator="g", code=t,
                       turn=abs(n) % 7, parent_id=p, meta=str(f))
             for i, (t, n, f, p) in enumerate(rows)]
    assert Candidate.from_arrow(Candidate.to_arrow(cands)) == cands
