"""Snapshots of an audit's findings, compared across compiles.

A snapshot is the list of finding groups as data that survives XLA renaming
its instructions: class, source line, boundary shape, the work found, the
kernel that would close it, verdict and count; never instruction names.
Multi-consumer buffers kept for reuse are left out (their reader counts move
with unrelated changes); everything that proposes a change, and what XLA
already fused, is in.
"""

from __future__ import annotations

import json
import os

from hlo_audit._src.analysis.records import FindingKind
from hlo_audit._src.report.grouping import ranked_groups
from hlo_audit._src.report.units import fmt_bytes, openable_path, parse_bytes

#: Version of the snapshot file format.
SNAPSHOT_VERSION = 1

_KEY = ("class", "source", "shape", "ops", "kernel", "verdict", "count")


def snapshot_of(report, root: str | None = None, min_bytes: int | str = 0,
                min_time: float | str | None = None) -> list[dict]:
  """The report's finding groups as snapshot entries; sources relative to
  `root` (e.g. the test suite's root folder) so snapshots travel between
  machines. Groups that propose a change and save less than `min_bytes`, or
  than `min_time` per step (estimated; `assertions.select`), are left out.
  Estimated times are not stored: they change with the machine's
  calibration, and a snapshot must not.

  Raises:
    AssertionError: for `min_time` on a report without a time estimate.
  """
  from hlo_audit._src.testing.assertions import time_floor, time_reaches

  floor = parse_bytes(min_bytes)
  time_min = time_floor(report, min_time)
  root = os.path.abspath(root or os.getcwd())
  out = []
  for g in ranked_groups(report.findings):
    small = g.bytes_saved < floor or not time_reaches(g.time_saved, time_min)
    if g.kind is FindingKind.KEEP_REUSE or (g.actionable and small):
      continue
    src = None
    if g.source is not None:
      src = f"{openable_path(g.source.file, root)}:{g.source.line}"
    out.append({"class": g.kind.slug, "source": src, "shape": g.boundary_shape,
                "ops": list(g.ops), "kernel": g.kernel, "verdict": g.verdict.value,
                "count": g.count, "bytes_saved": g.bytes_saved})
  return sorted(out, key=lambda e: json.dumps([e[k] for k in _KEY]))


def _key(e: dict) -> str:
  return json.dumps([e.get(k) for k in _KEY])


def compare_snapshots(stored: list[dict], current: list[dict]) -> tuple[list[dict], list[dict]]:
  """(appeared, gone): entries of `current` not in `stored`, and the reverse
  (a changed count shows as one of each)."""
  old = {_key(e): e for e in stored}
  new = {_key(e): e for e in current}
  return ([e for k, e in new.items() if k not in old],
          [e for k, e in old.items() if k not in new])


def entry_line(e: dict) -> str:
  count = f" x{e['count']}" if e.get("count", 1) > 1 else ""
  ops = ",".join(e.get("ops") or ())
  return (f"{e['class']}{count} {e['shape']} [{ops}] {e['verdict']} "
          f"{fmt_bytes(e.get('bytes_saved'))} at {e['source'] or '?'}")


def write_snapshot(path: str, module: str, entries: list[dict]) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"version": SNAPSHOT_VERSION, "module": module, "findings": entries}, f,
              indent=1, sort_keys=True)
    f.write("\n")


def read_snapshot(path: str) -> list[dict]:
  """The stored entries.

  Raises:
    ValueError: for a file that is not a snapshot of this version.
  """
  with open(path, encoding="utf-8") as f:
    try:
      d = json.load(f)
    except ValueError as e:
      raise ValueError(f"{path}: not a JSON snapshot: {e}") from None
  if not isinstance(d, dict) or d.get("version") != SNAPSHOT_VERSION:
    raise ValueError(f"{path}: not an hlo-audit snapshot of version {SNAPSHOT_VERSION}")
  return list(d["findings"])
