"""JSON rendering: `dataclasses.asdict` shapes, enums as values, stable keys.

Schema (version 4), top level:
  schema_version, module, peak_bytes, xla_peak_bytes, xla_reported_peak_bytes,
  allocation_bytes, heap_peak_bytes, peak_time, kernels_by_kind, kernels,
  buffers, intermediates (buffer names), findings, timeline, notes,
  collectives (per device: opcode, group_size, bytes_sent, bytes_received,
  start_time, done_time, overlapped kernels), what_if
  (the selected what-if replay: changes, peak_bytes, peak_saved, timeline and
  baseline_timeline, live_at_peak; null when none), timing (the estimated
  step on the device: step_time and its split in seconds, assumptions, the
  device facts used with their sources, and every kernel's estimate with the
  model's inputs: bytes, FLOPs by unit, launches, bound; null when the
  device is unknown), xla_estimate (a TPU's: libtpu's optimal_seconds as
  reported, the ConcatBitcast calls it prices at -1 s, and the seconds with
  them undone; null elsewhere), cycles_spread (a TPU's: kernels priced by
  both, our seconds per XLA:TPU estimated cycle, 10th/90th percentile over
  the median; null elsewhere).
Each finding has at least: class (slug), class_name, bytes_saved,
launches_removed, source ("file:line" or null), kernel, verdict, peak_after
and peak_saved (the peak after the finding's change alone, from a what-if
replay; null when not replayed), peak_exact (false: the quick estimate,
which keeps the audited buffer assignment; absent in older files: true),
time_saved (estimated seconds per step; null without an estimate), layer
(the layer in JAX's name stack that made the boundary, "" where none;
absent in older files).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing

from hlo_audit._src.report.report import SCHEMA_VERSION


def _source(loc) -> str | None:
  return f"{loc.file}:{loc.line}" if loc is not None else None


def _location(loc) -> dict | None:
  if loc is None:
    return None
  return {"file": loc.file, "line": loc.line, "column": loc.column,
          "function": loc.function}


class Frames:
  """The stack frames of one JSON document, each written once: rows list
  their `source_stack` as indices into the document's "frames" (a 30k-
  instruction report's rows hold 36k frames of a few thousand kinds; inline,
  they were two thirds of its JSON). `location` is a row's inline
  `source_location`, made once per frame too."""

  __slots__ = ("table", "_made", "_by_value", "_stacks")

  def __init__(self):
    #: The frames, as `{"file", "line", "column", "function"}` dicts.
    self.table: list[dict] = []
    self._made: dict = {}
    self._by_value: dict = {}
    self._stacks: dict = {}

  def _entry(self, loc):
    # By identity first (a dataclass's __eq__ costs more than the dict it
    # saves), keeping each location so that no id is reused; then by value,
    # for equal frames held by different objects.
    made = self._made.get(id(loc))
    if made is None:
      key = (loc.file, loc.line, loc.column, loc.function)
      index = self._by_value.get(key)
      if index is None:
        index = self._by_value[key] = len(self.table)
        self.table.append(_location(loc))
      made = self._made[id(loc)] = (loc, index, self.table[index])
    return made

  def index(self, loc) -> int:
    return self._entry(loc)[1]

  def location(self, loc) -> dict | None:
    return None if loc is None else self._entry(loc)[2]

  def stack(self, stack) -> list[int]:
    # Rows of one instruction (its kernel, buffers, findings) share their
    # stack tuple: indexed once (the tuple is kept, so its id stays unique).
    made = self._stacks.get(id(stack))
    if made is None:
      made = self._stacks[id(stack)] = (stack, [self._entry(loc)[1] for loc in stack])
    return made[1]


def _value(x):
  if isinstance(x, enum.Enum):
    return x.value
  if isinstance(x, tuple):
    return [_value(v) for v in x]
  if isinstance(x, dict):
    return {k: _value(v) for k, v in x.items()}
  return x


def kernel_dict(k, frames: Frames) -> dict:
  return {
      "name": k.name, "computation": k.computation, "kind": k.kind.value,
      "opcode": k.opcode, "detail": k.detail, "fused_ops": dict(k.fused_ops),
      "bytes_read": k.bytes_read, "bytes_written": k.bytes_written,
      "trip_count": k.trip_count, "time": k.time, "op_name": k.op_name,
      "source": _source(k.source), "source_location": frames.location(k.source), "members": list(k.members),
      "source_stack": frames.stack(k.source_stack),
      "on_chip_scratch": k.on_chip_scratch,
  }


def buffer_dict(b, frames: Frames) -> dict:
  return {
      "name": b.name, "instruction": b.instruction, "index": list(b.index),
      "computation": b.computation, "shape": b.shape, "dtype": b.dtype,
      "dims": list(b.dims), "bytes": b.bytes, "producer": b.producer,
      "producer_opcode": b.producer_opcode, "consumers": list(b.consumers),
      "reuse_count": b.reuse_count, "live_range": list(b.live_range),
      "lifetime": b.lifetime.value, "source": _source(b.source), "source_location": frames.location(b.source),
      "op_name": b.op_name, "aliases": list(b.aliases), "placement": b.placement,
      "internal": b.internal,
      "source_stack": frames.stack(b.source_stack),
  }


def finding_dict(f, frames: Frames) -> dict:
  return {
      "class": f.kind.slug, "class_name": f.kind.value,
      "producer": f.producer, "consumers": list(f.consumers),
      "boundary": f.boundary, "boundary_shape": f.boundary_shape,
      "bytes_saved": f.bytes_saved, "launches_removed": f.launches_removed,
      "extra_arithmetic": f.extra_arithmetic, "extra_resources": f.extra_resources,
      "numerical_class": f.numerical_class.value, "guard": f.guard,
      "layout_effect": f.layout_effect, "evidence": f.evidence,
      "verdict": f.verdict.value, "reasons": list(f.reasons),
      "risks": list(f.risks), "ops": list(f.ops), "kernel": f.kernel,
      "trip_count": f.trip_count, "source": _source(f.source), "source_location": frames.location(f.source),
      "computation": f.computation, "suggestion": f.suggestion,
      "guard_verdict": f.guard_verdict,
      "source_stack": frames.stack(f.source_stack),
      "peak_after": f.peak_after, "peak_saved": f.peak_saved,
      "peak_exact": f.peak_exact,
      "notes": list(f.notes), "layer": f.layer, "boundary_kept": f.boundary_kept,
      "time_saved": f.time_saved,
  }


def groups_list(report) -> list[dict]:
  """The finding groups, ranked; members as indices into "findings"."""
  from hlo_audit._src.report.grouping import ranked_groups

  index = {id(f): i for i, f in enumerate(report.findings)}
  return [{"class": g.kind.slug, "source": _source(g.source),
           "boundary_shape": g.boundary_shape, "ops": list(g.ops), "kernel": g.kernel,
           "verdict": g.verdict.value, "count": g.count, "bytes_saved": g.bytes_saved,
           "launches_removed": g.launches_removed, "peak_saved": g.peak_saved,
           "time_saved": g.time_saved,
           "actionable": g.actionable, "members": [index[id(f)] for f in g.members]}
          for g in ranked_groups(report.findings)]


def collective_dict(c) -> dict:
  return {"name": c.name, "done": c.done, "opcode": c.opcode,
          "computation": c.computation, "group_size": c.group_size,
          "bytes_sent": c.bytes_sent, "bytes_received": c.bytes_received,
          "operand_bytes": c.operand_bytes, "result_bytes": c.result_bytes,
          "start_time": c.start_time, "done_time": c.done_time,
          "overlapped": list(c.overlapped), "trip_count": c.trip_count}


def to_dict(report) -> dict:
  m = report.module
  frames = Frames()
  return {
      "schema_version": SCHEMA_VERSION,
      "module": {
          "name": m.name, "platform": m.platform, "device_kind": m.device_kind,
          "jax_version": m.jax_version, "jaxlib_version": m.jaxlib_version,
          "instruction_count": m.instruction_count,
          "computation_count": m.computation_count,
          "schedule_length": m.schedule_length, "is_scheduled": m.is_scheduled,
          "optimized": m.optimized, "origin": m.origin, "path": m.path, "xla_peak_source": m.xla_peak_source,
          # Only for a target: reports of the machine's own backend keep their keys.
          **({"target": m.target, "target_notes": list(m.target_notes)}
             if m.target else {}),
      },
      "peak_bytes": report.peak_bytes,
      "xla_peak_bytes": report.xla_peak_bytes,
      "xla_reported_peak_bytes": report.xla_reported_peak_bytes,
      "allocation_bytes": report.allocation_bytes,
      "heap_peak_bytes": report.heap_peak_bytes,
      "peak_time": report.peak_time,
      "materialized_bytes": report.materialized_bytes,
      "bytes_saved": report.bytes_saved,
      "kernels_by_kind": dict(report.kernels_by_kind()),
      "kernels": [kernel_dict(k, frames) for k in report.kernels],
      "buffers": [buffer_dict(b, frames) for b in report.buffers],
      "intermediates": [b.name for b in report.intermediates],
      "findings": [finding_dict(f, frames) for f in report.findings],
      "groups": groups_list(report),
      "live_at_peak": list(report.live_at_peak),
      "timeline": list(report.timeline),
      "cost_analysis": dict(sorted(report.cost_analysis.items())) if report.cost_analysis else None,
      "notes": list(report.notes),
      "collectives": [collective_dict(c) for c in report.collectives],
      "what_if": (report.what_if_replay.to_dict()
                  if report.what_if_replay is not None else None),
      "timing": report.timing.to_dict() if report.timing is not None else None,
      "xla_estimate": (dataclasses.asdict(report.xla_estimate)
                       if report.xla_estimate is not None else None),
      "cycles_spread": (dataclasses.asdict(report.cycles_spread)
                        if report.cycles_spread is not None else None),
      "frames": frames.table,
  }


#: One JSON value on one line, by the C encoder (`indent` would select the
#: pure-Python one: ten times slower on a 30k-instruction report).
_ONE_LINE = json.JSONEncoder(separators=(", ", ": ")).encode


def render_json(report, indent: int | None = 2) -> str:
  """`to_dict` as JSON. With `indent`, the top level is indented and each
  row of its lists (kernels, buffers, findings, ...) is one line: a row per
  line reads, greps and diffs well."""
  d = to_dict(report)
  if indent is None:
    return json.dumps(d)
  pad = " " * indent
  parts = []
  for key, value in d.items():
    if isinstance(value, list) and value:
      rows = f",\n{pad}{pad}".join(map(_ONE_LINE, value))
      parts.append(f"{pad}{_ONE_LINE(key)}: [\n{pad}{pad}{rows}\n{pad}]")
    else:
      parts.append(f"{pad}{_ONE_LINE(key)}: {_ONE_LINE(value)}")
  return "{\n" + ",\n".join(parts) + "\n}"


def _stack(row: dict, frames: list | None) -> tuple:
  """A row's `source_stack`: indices into the document's frames (schema 3),
  the frames themselves (schema 2), or absent (schema 1)."""
  stack = row.get("source_stack", ())
  if frames is not None:
    return tuple(frames[i] for i in stack)
  return tuple(_loc(loc) for loc in stack)


def _loc(d):
  from hlo_audit._src.hlo.ir import SourceLocation
  if not d:
    return None
  return SourceLocation(file=d["file"], line=d["line"], column=d.get("column", 0),
                        function=d.get("function", ""))


def report_from_dict(d: dict):
  """Rebuilds an AuditReport from `to_dict` output (for `diff` of saved JSON).

  Raises:
    ValueError: for anything but a report of a known schema version: the
      message says where (`findings[3]: missing field 'class'`).
  """
  if not isinstance(d, dict):
    raise ValueError(f"a JSON {_json_kind(d)}, not a report (an object with schema_version)")
  try:
    return _report_from_dict(d)
  except _SchemaError as e:
    raise ValueError(str(e)) from None
  except KeyError as e:
    raise ValueError(f"missing field {e}") from None
  except (TypeError, ValueError, AttributeError, IndexError) as e:
    raise ValueError(f"a field has the wrong type or value ({e})") from None


class _SchemaError(ValueError):
  """A part of a report that is not what the schema says, with where."""


def _json_kind(v) -> str:
  # A row's builder turns arrays into tuples before they are checked.
  return {dict: "object", list: "array", tuple: "array", str: "string", bool: "boolean",
          int: "number", float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _rows(d: dict, section: str, build) -> tuple:
  """`build` of each row of the list `d[section]`; a bad row raises
  `_SchemaError` naming it, e.g. `findings[3]: missing field 'class'`."""
  rows = d[section]
  if not isinstance(rows, list):
    raise _SchemaError(f"{section!r}: expected an array, got a JSON {_json_kind(rows)}")
  out = []
  for i, row in enumerate(rows):
    if not isinstance(row, dict):
      raise _SchemaError(f"{section}[{i}]: expected an object, got a JSON {_json_kind(row)}")
    try:
      out.append(build(row))
    except KeyError as e:
      raise _SchemaError(f"{section}[{i}]: missing field {e}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as e:
      raise _SchemaError(f"{section}[{i}]: a field has the wrong type or value ({e})") from None
  return tuple(out)


def _report_from_dict(d: dict):
  from hlo_audit._src.analysis.backend_traits import KernelKind
  from hlo_audit._src.analysis.buffers import Buffer, Lifetime
  from hlo_audit._src.analysis.kernels import Kernel
  from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                               NumericalClass, Verdict)
  from hlo_audit._src.report.report import AuditReport, ModuleInfo

  version = d.get("schema_version")
  # 1 lacks what 2 added; 2 inlines frames; 3 has no time estimates.
  if version not in (1, 2, 3, SCHEMA_VERSION):
    raise _SchemaError(f"schema_version {version!r}; this hlo-audit reads 1 to "
                       f"{SCHEMA_VERSION}")
  frames = [_loc(f) for f in d["frames"]] if version >= 3 else None
  m = d["module"]
  if not isinstance(m, dict):
    raise _SchemaError(f"'module': expected an object, got a JSON {_json_kind(m)}")
  kernels = _rows(d, "kernels", lambda k: _typed(Kernel,
      name=k["name"], computation=k["computation"], kind=KernelKind(k["kind"]),
      opcode=k["opcode"], detail=k["detail"],
      fused_ops=types.MappingProxyType(k["fused_ops"]), bytes_read=k["bytes_read"],
      bytes_written=k["bytes_written"], trip_count=k["trip_count"], time=k["time"],
      op_name=k["op_name"], source=_loc(k["source_location"]), members=tuple(k["members"]),
      source_stack=_stack(k, frames), on_chip_scratch=int(k.get("on_chip_scratch", 0))))
  buffers = _rows(d, "buffers", lambda b: _typed(Buffer,
      name=b["name"], instruction=b["instruction"], index=tuple(b["index"]),
      computation=b["computation"], shape=b["shape"], dtype=b["dtype"],
      dims=tuple(b["dims"]), bytes=b["bytes"], producer=b["producer"],
      producer_opcode=b["producer_opcode"], consumers=tuple(b["consumers"]),
      live_range=tuple(b["live_range"]), lifetime=Lifetime(b["lifetime"]),
      source=_loc(b["source_location"]), op_name=b["op_name"], aliases=tuple(b["aliases"]),
      placement=b["placement"], internal=b["internal"], source_stack=_stack(b, frames)))
  kinds = {k.slug: k for k in FindingKind}
  findings = _rows(d, "findings", lambda f: _typed(FusionDecisionRecord,
      kind=_finding_kind(kinds, f["class"]), producer=f["producer"],
      consumers=tuple(f["consumers"]),
      boundary=f["boundary"], boundary_shape=f["boundary_shape"],
      bytes_saved=f["bytes_saved"], launches_removed=f["launches_removed"],
      extra_arithmetic=f["extra_arithmetic"], extra_resources=f["extra_resources"],
      numerical_class=NumericalClass(f["numerical_class"]), guard=f["guard"],
      layout_effect=f["layout_effect"], evidence=f["evidence"],
      verdict=Verdict(f["verdict"]), reasons=tuple(f["reasons"]),
      risks=tuple(f["risks"]), ops=tuple(f["ops"]), kernel=f["kernel"],
      trip_count=f["trip_count"], source=_loc(f["source_location"]),
      computation=f["computation"], suggestion=f.get("suggestion", ""),
      guard_verdict=f.get("guard_verdict", ""),
      source_stack=_stack(f, frames), peak_after=f.get("peak_after"),
      peak_saved=f.get("peak_saved"), peak_exact=bool(f.get("peak_exact", True)),
      notes=tuple(f.get("notes", ())),
      layer=f.get("layer", ""), boundary_kept=bool(f.get("boundary_kept", False)),
      time_saved=f.get("time_saved")))
  info = _typed(ModuleInfo, **{k: m[k] for k in (
      "name", "platform", "device_kind", "jax_version", "jaxlib_version",
      "instruction_count", "computation_count", "schedule_length", "is_scheduled",
      "origin", "path")}, xla_peak_source=m.get("xla_peak_source", ""),
      optimized=bool(m.get("optimized", True)),
      target=m.get("target", ""), target_notes=tuple(m.get("target_notes", ())))
  return _typed(
      AuditReport, module=info, kernels=kernels, buffers=buffers, findings=findings,
      peak_bytes=d["peak_bytes"], xla_peak_bytes=d["xla_peak_bytes"],
      xla_reported_peak_bytes=d["xla_reported_peak_bytes"],
      allocation_bytes=d["allocation_bytes"], heap_peak_bytes=d["heap_peak_bytes"],
      peak_time=d["peak_time"], timeline=tuple(d["timeline"]),
      live_at_peak=tuple(d["live_at_peak"]),
      cost_analysis=d.get("cost_analysis"), notes=tuple(d["notes"]),
      what_if_replay=_what_if(d.get("what_if")),
      collectives=tuple(_collective(c) for c in d.get("collectives", ())),
      timing=_timing(d.get("timing")),
      xla_estimate=_xla_estimate(d.get("xla_estimate")),
      cycles_spread=_cycles_spread(d.get("cycles_spread")))


def _xla_estimate(d: dict | None):
  from hlo_audit._src.analysis.xla_estimate import XlaEstimate
  return None if d is None else XlaEstimate(
      seconds=float(d["seconds"]), reported=float(d["reported"]), uncosted=int(d["uncosted"]))


def _cycles_spread(d: dict | None):
  from hlo_audit._src.analysis.xla_estimate import CyclesSpread
  return None if d is None else CyclesSpread(
      kernels=int(d["kernels"]), seconds_per_cycle=float(d["seconds_per_cycle"]),
      low=float(d["low"]), high=float(d["high"]))


@functools.cache
def _hints(cls) -> dict:
  """`cls`'s resolved field types; {} where one cannot be resolved (then
  its fields go unchecked rather than the report unread)."""
  try:
    return typing.get_type_hints(cls)
  except Exception:  # a name only imported for type checking
    return {}


def _fits(value, hint) -> bool:
  """Whether a JSON value (lists for tuples) fits a field's type hint; types
  it does not know (mappings, nested dataclasses) are not checked here."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if hint is typing.Any:
    return True
  if origin in (typing.Union, types.UnionType):
    return any(_fits(value, a) for a in args)
  if hint is type(None):
    return value is None
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if hint is str:
    return isinstance(value, str)
  if origin is tuple:
    if not isinstance(value, (tuple, list)):
      return False
    if len(args) == 2 and args[1] is Ellipsis:
      return all(_fits(v, args[0]) for v in value)
    return not args or (len(args) == len(value) and all(map(_fits, value, args)))
  if isinstance(hint, type) and issubclass(hint, enum.Enum):
    return isinstance(value, hint)
  return True


def _typed(cls, **fields):
  """`cls(**fields)`, each field checked against its type first, so that a
  damaged report fails here, naming the field, not later in arithmetic."""
  hints = _hints(cls)
  for name, value in fields.items():
    hint = hints.get(name)
    if hint is not None and not _fits(value, hint):
      raise ValueError(f"field {name!r}: expected {_hint_text(hint)}, got a JSON "
                       f"{_json_kind(value)}")
  return cls(**fields)


def _hint_text(hint) -> str:
  # A generic alias's __name__ drops its arguments ("tuple" for tuple[int, ...]).
  if typing.get_origin(hint) is None and getattr(hint, "__name__", None):
    return hint.__name__
  return str(hint).replace("typing.", "")


def _finding_kind(kinds: dict, slug):
  if slug not in kinds:
    raise ValueError(f"unknown finding class {slug!r}")
  return kinds[slug]


def _timing(d: dict | None):
  if not d:
    return None
  from hlo_audit._src.analysis.time_model import StepTime

  return StepTime.from_dict(d)


def _collective(c: dict):
  from hlo_audit._src.analysis.collectives import Collective

  return Collective(**{**c, "overlapped": tuple(c["overlapped"])})


def _what_if(d: dict | None):
  if not d:
    return None
  from hlo_audit._src.analysis.replay import WhatIf

  return WhatIf(changes=tuple(d["changes"]), baseline_peak_bytes=d["baseline_peak_bytes"],
                peak_bytes=d["peak_bytes"], peak_time=d["peak_time"],
                live_at_peak=tuple(d["live_at_peak"]),
                baseline_timeline=tuple(d["baseline_timeline"]),
                timeline=tuple(d["timeline"]), notes=tuple(d["notes"]),
                baseline_step_time=d.get("baseline_step_time"), step_time=d.get("step_time"))
