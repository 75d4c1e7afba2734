"""One point of a sweep: what a worker is given (`Task`) and how it runs it
(`execute`), the same wherever it runs: in the sweep's process, a local
worker process, or a Ray task."""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Mapping
from typing import Any

from hlo_audit._src.sweep import store as store_lib
from hlo_audit._src.sweep.targets import Measure, Target, TargetRef, make_target


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedPoint:
  """One point to run."""

  id: str
  #: Position in the expanded grid.
  index: int
  #: The grid's values at this point.
  values: Mapping[str, Any]
  #: The target's full, canonical parameters.
  params: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
  """What a worker needs for one point (picklable)."""

  target: TargetRef
  point: PlannedPoint
  measure: Measure
  html_path: str | None = None


def record_of(task: Task, error: str | None = None) -> dict[str, Any]:
  """A point's record before its measurements."""
  return {"schema": store_lib.RECORD_SCHEMA, "id": task.point.id,
          "index": task.point.index, "target": task.target.text,
          "params": dict(task.point.params), "status": "error" if error else "ok",
          "error": error}


def execute(task: Task, targets: dict[TargetRef, Target] | None = None) -> dict[str, Any]:
  """Runs one point and returns its record; never raises (errors are recorded)."""
  t0 = time.perf_counter()
  record = record_of(task)
  try:
    cache = targets if targets is not None else {}
    if task.target not in cache:
      cache[task.target] = make_target(task.target)
    record.update(cache[task.target].run(task.point.params, task.measure,
                                         task.html_path))
  except Exception as e:  # noqa: BLE001 - every failure is the point's result.
    record.update(status="error", error=error_line(e),
                  traceback=traceback.format_exc(limit=-8))
  seconds = dict(record.get("seconds", {}))
  seconds["total"] = time.perf_counter() - t0
  record["seconds"] = seconds
  record["pid"] = os.getpid()
  return record


def error_line(e: BaseException) -> str:
  """`Type: first line of the message`, at most 500 characters."""
  first = str(e).strip().splitlines()[0] if str(e).strip() else ""
  return f"{type(e).__name__}: {first}"[:500]
