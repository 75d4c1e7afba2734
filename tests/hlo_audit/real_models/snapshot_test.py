"""Every committed compile's audit is the one last read (`snapshots.py`):
a change to any analysis shows here as the fields it moved."""

from __future__ import annotations

import pytest

from tests.hlo_audit.real_models import snapshots

KEYS = snapshots.keys()
_UPDATE = "python -m tests.hlo_audit.real_models.snapshots update"


def test_every_kind_of_compile_is_held():
  kinds = {k.split("/")[0] for k in KEYS}
  assert kinds == {"h200", "cpu", "dump"}, kinds
  assert len(KEYS) >= 30, KEYS


def test_no_snapshot_is_left_without_its_compile():
  held = {p.name for p in snapshots.SNAPSHOTS.glob("*.json.gz")}
  assert held == {snapshots.snapshot_path(k).name for k in KEYS}, \
      held ^ {snapshots.snapshot_path(k).name for k in KEYS}


@pytest.mark.parametrize("key", KEYS)
def test_audit_matches_its_snapshot(key):
  old = snapshots.snapshot(key)
  assert old is not None, f"{key} has no snapshot: `{_UPDATE} {key}`, then read it"
  changed = snapshots.differences(old, snapshots.report_dict(key))
  assert not changed, (
      f"the audit of {key} changed ({len(changed)} shown):\n  " + "\n  ".join(changed) +
      f"\nIf the change is meant: `{_UPDATE} {key}`, read what it prints, commit it.")


def test_differences_name_each_changed_field():
  old = {"findings": [{"bytes_saved": 8, "verdict": "safe"}], "peak_bytes": 64, "notes": []}
  new = {"findings": [{"bytes_saved": 8, "verdict": "risky"}, {}], "peak_bytes": 64,
         "notes": ["x"], "groups": []}
  assert snapshots.differences(old, new) == [
      "findings: 1 -> 2 entries",
      'findings[0].verdict: "safe" -> "risky"',
      "groups: added []",
      'notes: 0 -> 1 entries +["x"]',
  ]
  assert snapshots.differences({"live": ["a", "b", "c"]}, {"live": ["a", "c", "d", "e"]}) == [
      'live: 3 -> 4 entries -["b"] +["d", "e"]']
  assert snapshots.differences({"a": 1}, {"a": 1.0}) == ["a: 1 -> 1.0"]
  assert snapshots.differences({"a": 1}, {}) == ["a: removed"]
  assert snapshots.differences(old, old) == []
