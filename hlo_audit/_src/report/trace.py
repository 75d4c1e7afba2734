"""The estimated timeline as a Chrome trace (JSON Object Format), for
https://ui.perfetto.dev and chrome://tracing.

One complete event ("X") per bar of `StepTime.launches`, named as the kernel
is named in the HLO, on one process named after the module and device, one
thread per row: "compute", then "communication" (asynchronous collectives
run beside the kernels). Bars of one track that overlap (a collective a
caller started still running when a callee's collectives start) go to
further rows, "communication 2", ..., so no two bars of a row overlap. Each event's args carry
its kernel's estimate, per launch, and the actionable findings that name the
kernel with their estimated saving.

Times are whole nanoseconds written in microseconds, the format's unit, and
a bar ends no later than the next one in its row starts: Perfetto cannot
place slices of one thread that overlap without nesting, and seconds summed
along the schedule round differently from the same instant reached another
way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Mapping, Sequence

from hlo_audit._src.analysis.records import FusionDecisionRecord
from hlo_audit._src.errors import HloAuditError

#: Tracks in the order they are drawn.
TRACKS = ("compute", "communication")

#: Seconds two bars of a row may overlap and still count as one after the
#: other: float error of instants reached by different sums, far below a ns.
_TOUCH = 1e-10

_PID = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
  """One row of the timeline: bars that do not overlap, in time order."""

  #: "compute", "communication", "communication 2", ...
  name: str
  #: The track its bars run on ("compute" or "communication").
  track: str
  launches: tuple = ()


def rows(launches: Sequence) -> tuple[Row, ...]:
  """`launches` (`time_model.Launch`) laid out in rows: one per track, more
  where bars of a track overlap, each bar in the first row it fits."""
  tracks = sorted({l.track for l in launches},
                  key=lambda t: (TRACKS.index(t) if t in TRACKS else len(TRACKS), t))
  out = []
  for track in tracks:
    lanes: list[list] = []
    for l in sorted((l for l in launches if l.track == track), key=lambda l: l.start):
      for lane in lanes:
        last = lane[-1]
        if last.start + last.duration <= l.start + _TOUCH:
          lane.append(l)
          break
      else:
        lanes.append([l])
    out += [Row(track if i == 0 else f"{track} {i + 1}", track, tuple(lane))
            for i, lane in enumerate(lanes)]
  return tuple(out)


def findings_by_kernel(report) -> Mapping[str, tuple[FusionDecisionRecord, ...]]:
  """The actionable findings that name each kernel, as producer or consumer."""
  out: dict[str, list[FusionDecisionRecord]] = {}
  for f in report.actionable:
    for name in dict.fromkeys((f.producer, *f.consumers)):
      if name:
        out.setdefault(name, []).append(f)
  return types.MappingProxyType({k: tuple(v) for k, v in out.items()})


#: Why a report read from JSON has no timeline.
NOT_CARRIED = ("the report was read from JSON, which keeps the estimate but not its "
               "timeline (audit the program again for one)")


def no_timeline_reason(report) -> str | None:
  """Why `report` has no estimated timeline, in words (from its notes);
  None when it has one."""
  step = report.timing
  if step is not None:
    return NOT_CARRIED if step.kernels and not step.launches else None
  for note in report.notes:
    if note.startswith("time not estimated"):
      return note.removeprefix("time not estimated").lstrip(": ") or "no time estimate"
  return "this report has no time estimate"


def to_trace(report) -> dict:
  """The report's estimated timeline as Chrome trace JSON data.

  Raises:
    HloAuditError: when the report has no time estimate, or one read from
      JSON (which keeps no timeline).
  """
  why = no_timeline_reason(report)
  if why is not None:
    raise HloAuditError(f"no trace: {why}")
  step = report.timing
  facts = step.facts
  found = findings_by_kernel(report)
  laid = rows(step.launches)
  events: list[dict] = [
      _meta("process_name", 0, name=f"{report.module.name} on {facts.name} (estimated)"),
      _meta("process_labels", 0, labels=facts.description)]
  for tid, row in enumerate(laid, 1):
    events += [_meta("thread_name", tid, name=row.name),
               _meta("thread_sort_index", tid, sort_index=tid)]
  estimates: dict[str, dict] = {}  # a kernel's args, once per kernel
  for tid, row in enumerate(laid, 1):
    ns = [(round(l.start * 1e9), round((l.start + l.duration) * 1e9)) for l in row.launches]
    for i, (l, (begin, end)) in enumerate(zip(row.launches, ns)):
      if i + 1 < len(ns):
        end = min(end, ns[i + 1][0])
      args = estimates.get(l.kernel)
      if args is None:
        args = estimates[l.kernel] = _estimate(step.kernel(l.kernel), found.get(l.kernel, ()))
      events.append({
          "name": l.kernel, "cat": args.get("bound", row.track), "ph": "X",
          "ts": begin / 1e3, "dur": max(0, end - begin) / 1e3, "pid": _PID, "tid": tid,
          "args": {"launches": l.count, **args}})
  return {
      "traceEvents": events,
      "displayTimeUnit": "ns",
      "otherData": {
          "generator": "hlo-audit", "module": report.module.name, "device": facts.name,
          "device_description": facts.description, "checked": facts.checked,
          "step_us": _us(step.step_time),
          "split_us": {k: _us(v) for k, v in step.split.items()},
          "overlapped_communication_us": _us(step.overlapped_communication),
          "assumptions": list(step.assumptions)},
  }


def render_trace(report, indent: int | None = None) -> str:
  """`to_trace` as JSON text (strict: no NaN or Infinity)."""
  return json.dumps(to_trace(report), indent=indent, allow_nan=False, ensure_ascii=False)


def _meta(event: str, tid: int, **args) -> dict:
  return {"name": event, "ph": "M", "pid": _PID, "tid": tid, "args": args}


def _estimate(kernel, findings: Sequence[FusionDecisionRecord]) -> dict:
  """A kernel's args: its estimate per launch (none for a kernel the
  estimate lacks), and the findings that name it."""
  out: dict = {}
  if kernel is not None:
    out.update(bound=kernel.bound.value, bytes=kernel.bytes,
               matrix_flops=kernel.matrix_flops, vector_flops=kernel.vector_flops,
               transcendentals=kernel.transcendentals, intensity=_finite(kernel.intensity),
               time_per_launch_us=_us(kernel.time_per_launch))
  if findings:
    out["findings"] = [{"class": f.kind.value, "boundary": f.boundary or None,
                        "time_saved_us": _us(f.time_saved), "bytes_saved": f.bytes_saved}
                       for f in findings]
  return out


def _finite(x: float | None) -> float | None:
  """`x`, or None where JSON has no number for it."""
  return float(x) if x is not None and math.isfinite(x) else None


def _us(seconds: float | None) -> float | None:
  return _finite(seconds * 1e6) if seconds is not None else None
