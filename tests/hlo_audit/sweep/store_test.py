"""Sweep results on disk: append, resume, repair, merge, lock."""

from __future__ import annotations

import csv
import json
import re

import pytest

from hlo_audit._src.sweep.store import (ResultStore, StoreError, csv_header, load_records,
                                        merge, read_jsonl, shard_stem)


def rec(i: int, status: str = "ok", at: str = "2026-01-01T00:00:00") -> dict:
  audit = {"kernels": i, "peak_bytes": 100 * i, "bytes_saved": 10 * i,
           "findings_by_class": {"unfused-epilogue": 1}} if status == "ok" else None
  return {"id": f"p{i}", "status": status, "params": {"batch": i, "dtype": "float32"},
          "audit": audit, "error": None if status == "ok" else "ValueError: bad",
          "seconds": {"total": 0.5}, "finished_at": at}


def csv_rows(path) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_append_then_reopen_knows_what_is_done(tmp_path):
  with ResultStore(str(tmp_path), ["batch", "dtype"]) as s:
    assert s.state.done == frozenset()
    s.append(rec(1))
    s.append(rec(2, "error"))
  with ResultStore(str(tmp_path), ["batch", "dtype"]) as s:
    assert s.state.done == {"p1", "p2"}
  rows = csv_rows(tmp_path / "results.csv")
  assert [r["id"] for r in rows] == ["p1", "p2"]
  assert rows[0]["batch"] == "1" and rows[0]["peak_bytes"] == "100"
  assert rows[0]["findings_unfused_epilogue"] == "1"
  assert rows[0]["findings_standalone_copy"] == "0"  # Audited: zero, not blank.
  assert rows[1]["status"] == "error" and rows[1]["error"] == "ValueError: bad"
  assert rows[1]["peak_bytes"] == ""


def test_a_torn_last_line_is_dropped_and_the_csv_rebuilt(tmp_path):
  with ResultStore(str(tmp_path), ["batch"]) as s:
    for i in range(3):
      s.append(rec(i))
  jsonl = tmp_path / "results.jsonl"
  # A kill in the middle of writing point 3, and the CSV row of point 2 lost.
  jsonl.write_text(jsonl.read_text() + json.dumps(rec(3))[:40])
  lines = (tmp_path / "results.csv").read_text().splitlines()
  (tmp_path / "results.csv").write_text("\n".join(lines[:-1]) + "\n")
  with ResultStore(str(tmp_path), ["batch"]) as s:
    assert s.state.repaired and s.state.done == {"p0", "p1", "p2"}
    s.append(rec(3))
  records, damaged = read_jsonl(str(jsonl))
  assert not damaged and [r["id"] for r in records] == ["p0", "p1", "p2", "p3"]
  assert [r["id"] for r in csv_rows(tmp_path / "results.csv")] == ["p0", "p1", "p2", "p3"]


def test_retry_failed_drops_failed_records_so_none_is_doubled(tmp_path):
  with ResultStore(str(tmp_path), ["batch"]) as s:
    s.append(rec(1))
    s.append(rec(2, "error"))
  with ResultStore(str(tmp_path), ["batch"], retry_failed=True) as s:
    assert s.state.done == {"p1"} and s.state.retried == 1
    s.append(rec(2, "ok", at="2026-01-02T00:00:00"))
  records, _ = read_jsonl(str(tmp_path / "results.jsonl"))
  assert [(r["id"], r["status"]) for r in records] == [("p1", "ok"), ("p2", "ok")]


def test_merge_prefers_a_finished_point_then_the_later_one():
  merged = merge([rec(1, "ok", "2026-01-01"), rec(1, "error", "2026-01-03"),
                  rec(2, "error", "2026-01-01"), rec(2, "error", "2026-01-02"),
                  rec(3, "error", "2026-01-03"), rec(3, "error", "2026-01-02")])
  assert [(r["id"], r["status"], r["finished_at"]) for r in merged] == [
      ("p1", "ok", "2026-01-01"), ("p2", "error", "2026-01-02"),
      ("p3", "error", "2026-01-03")]  # the later one, whichever came first


def test_shards_write_their_own_files_and_readers_merge_them(tmp_path):
  for index in range(2):
    with ResultStore(str(tmp_path), ["batch"], num_shards=2, shard_index=index) as s:
      s.append(rec(index))
  assert shard_stem(2, 1) == "results-001-of-002"
  assert (tmp_path / "results-001-of-002.jsonl").exists()
  # Shards read in order: their points in the grid's order.
  assert [r["id"] for r in load_records(str(tmp_path))] == ["p0", "p1"]
  # A shard skips points any shard already finished.
  with ResultStore(str(tmp_path), ["batch"], num_shards=2, shard_index=0) as s:
    assert s.state.done == {"p0", "p1"}


def test_a_second_sweep_on_the_same_shard_is_refused(tmp_path):
  with ResultStore(str(tmp_path), ["batch"]):
    with pytest.raises(StoreError, match="another sweep is writing"):
      ResultStore(str(tmp_path), ["batch"]).open()


def test_new_parameter_columns_are_kept_from_older_records(tmp_path):
  with ResultStore(str(tmp_path), ["batch", "dtype"]) as s:
    s.append(rec(1))
  with ResultStore(str(tmp_path), ["seq"]) as s:
    assert s.param_names == ["seq", "batch", "dtype"]
  header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
  assert header == csv_header(["seq", "batch", "dtype"])


def test_unwritable_out_folder(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(StoreError, match="cannot write"):
    ResultStore(str(blocker / "out"), []).open()


TIME_COLUMNS = ["step_time_s", "memory_time_s", "compute_time_s", "launch_time_s",
                "communication_time_s", "time_device"]


def test_the_estimated_step_has_columns_and_older_records_leave_them_blank(tmp_path):
  old = rec(1)  # written before estimates: no time keys at all
  unknown = rec(2)
  unknown["audit"].update(step_time=None, memory_time=None, compute_time=None,
                          launch_time=None, communication_time=None, time_device=None)
  new = rec(3)
  new["audit"].update(step_time=1.5e-3, memory_time=1e-3, compute_time=2.5e-4,
                      launch_time=2e-4, communication_time=5e-5, time_device="h200")
  # An older sweep's files, resumed: the CSV is rebuilt with the new columns.
  (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
  (tmp_path / "results.csv").write_text("id,status,batch\np1,ok,1\n")
  with ResultStore(str(tmp_path), ["batch"]) as s:
    assert s.state.done == {"p1"}
    s.append(unknown)
    s.append(new)
  header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
  assert header[header.index("flops") + 1:header.index("time_device") + 1] == TIME_COLUMNS
  rows = {r["id"]: r for r in csv_rows(tmp_path / "results.csv")}
  assert [rows["p1"][c] for c in TIME_COLUMNS] == [""] * 6
  assert [rows["p2"][c] for c in TIME_COLUMNS] == [""] * 6
  assert [rows["p3"][c] for c in TIME_COLUMNS] == ["0.0015", "0.001", "0.00025", "0.0002",
                                                   "5e-05", "h200"]


@pytest.mark.parametrize("bad, why", [
    ("garbage", "not JSON"),
    ("42", r"not a sweep record \(a JSON number, not an object\)"),
    ("[]", r"not a sweep record \(a JSON array, not an object\)"),
    ('{"id": "p9"}', r"not a sweep record \(no valid status, params\)"),
    ('{"id": "", "status": "ok", "params": {}}', r"not a sweep record \(no valid id\)"),
])
def test_a_bad_line_before_the_last_is_not_a_tear_and_stops_the_store(tmp_path, bad, why):
  with ResultStore(str(tmp_path), ["batch"]) as s:
    for i in range(3):
      s.append(rec(i))
  jsonl = tmp_path / "results.jsonl"
  lines = jsonl.read_text().splitlines(keepends=True)
  jsonl.write_text("".join([lines[0], bad + "\n", *lines[1:]]))
  before = jsonl.read_bytes()
  message = f"^{re.escape(str(jsonl))}:2: {why}; only the last line can be torn by a kill"
  with pytest.raises(StoreError, match=message):
    read_jsonl(str(jsonl))
  with pytest.raises(StoreError, match=message):
    load_records(str(tmp_path))
  with pytest.raises(StoreError, match=message):
    ResultStore(str(tmp_path), ["batch"]).open()
  assert jsonl.read_bytes() == before  # Nothing dropped or rewritten.
  # The lock was let go: a mended file opens.
  jsonl.write_text("".join(lines))
  with ResultStore(str(tmp_path), ["batch"]) as s:
    assert s.state.done == {"p0", "p1", "p2"} and not s.state.repaired


def test_the_last_line_whole_but_without_its_newline_is_kept(tmp_path):
  jsonl = tmp_path / "results.jsonl"
  jsonl.write_text(json.dumps(rec(1)) + "\n" + json.dumps(rec(2)))
  assert [r["id"] for r in read_jsonl(str(jsonl))[0]] == ["p1", "p2"]
  with ResultStore(str(tmp_path), ["batch"]) as s:
    assert s.state.done == {"p1", "p2"} and "no newline" in s.state.repaired
    s.append(rec(3))
  records, damaged = read_jsonl(str(jsonl))
  assert not damaged and [r["id"] for r in records] == ["p1", "p2", "p3"]
  # A last line that is JSON but no record was written by hand, not torn.
  jsonl.write_text(json.dumps(rec(1)) + "\n42")
  with pytest.raises(StoreError, match=":2: not a sweep record"):
    read_jsonl(str(jsonl))


def test_a_failed_point_leaves_its_counts_blank_and_an_audited_one_counts_zero():
  from hlo_audit._src.sweep.store import csv_header, csv_row

  header = csv_header(["b"])
  ok = {"id": "a", "status": "ok", "params": {"b": 1},
        "audit": {"findings_by_class": {"unfused-epilogue": 2}}}
  failed = {"id": "f", "status": "error", "params": {"b": 2}, "error": "boom"}
  row_ok = dict(zip(header, csv_row(ok, ["b"])))
  row_failed = dict(zip(header, csv_row(failed, ["b"])))
  assert row_ok["findings_unfused_epilogue"] == "2"
  assert row_ok["findings_standalone_copy"] == "0"   # audited: none of this class
  assert row_failed["findings_unfused_epilogue"] == row_failed["findings_standalone_copy"] == ""
  assert row_failed["error"] == "boom"


def test_the_unsharded_file_is_read_before_the_shards(tmp_path):
  # A sweep run whole, then sharded into the same folder: the whole run's
  # points come first (glob alone would sort its file after the shards').
  (tmp_path / "results.jsonl").write_text(json.dumps(rec(1)) + "\n")
  (tmp_path / "results-000-of-002.jsonl").write_text(json.dumps(rec(0)) + "\n")
  assert [r["id"] for r in load_records(str(tmp_path))] == ["p1", "p0"]
