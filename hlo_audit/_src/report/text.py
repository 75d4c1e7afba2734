"""Sentences and table rows shared by the terminal, Markdown and HTML views.

Renderers call these so the three views say the same thing in the same words.
The sentences carry the input's names and paths, so they come out
`safe.printable` (a control character as its escape); table rows are made so
by each renderer (`layout.table`, `safe.markdown_text`, `html.escape`).
"""

from __future__ import annotations

from hlo_audit._src.analysis.buffers import Buffer, Lifetime
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, Verdict
from hlo_audit._src.report import units
from hlo_audit._src.report.safe import printable
from hlo_audit._src.report.units import (fmt_bytes, fmt_pct, fmt_source,
                                         fmt_source_context, fmt_time, fmt_trip)

#: Columns of the method's intermediate-tensor table.
INTERMEDIATE_COLUMNS = ("Buffer", "Shape", "Dtype", "Bytes", "Producer",
                        "Consumer(s)", "Reuse", "Live", "Lifetime",
                        "Removable?", "Strategy", "Source")

KERNEL_COLUMNS = ("Kernel", "Kind", "Detail", "Fused ops", "Read", "Written",
                  "Runs", "Time", "Bound", "Source")

FINDING_COLUMNS = ("#", "Class", "Boundary", "Shape", "Time saved", "Bytes saved",
                   "Launches", "Kernel", "Verdict", "Source", "Layer")


def removable(report, b: Buffer, related=None, short: bool = False) -> tuple[str, str]:
  """("yes"/"no"/"-", strategy) for a buffer, from the findings about it
  (`related`: those findings, when the caller has them indexed; `short`:
  the kernel without its library, for narrow tables)."""
  if b.lifetime is Lifetime.INPUT:
    return "no", "input or carried state"
  if b.lifetime is Lifetime.EXTERNAL_OUTPUT:
    return "no", "program output"
  if related is None:
    related = [f for f in report.findings if f.boundary == b.name]
  for f in related:
    if f.verdict is Verdict.KEEP:
      continue
    kernel = units.short_kernel(f.kernel) if short else f.kernel
    strategy = f.kind.value + (f" -> {kernel}" if f.kernel else "")
    return ("yes" if f.verdict is Verdict.SAFE else "maybe"), strategy
  if any(f.kind is FindingKind.KEEP_REUSE for f in related):
    return "no", f"keep: read by {b.reuse_count} kernels"
  return "-", ""


def is_transient(b: Buffer) -> bool:
  """Written between kernels: neither a program input nor its output."""
  return b.lifetime not in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT)


def intermediate_rows(report, limit: int | None = None,
                      short: bool = False) -> list[tuple[str, ...]]:
  by_boundary: dict[str, list[FusionDecisionRecord]] = {}
  for f in report.findings:
    by_boundary.setdefault(f.boundary, []).append(f)
  rows = []
  for b in report.intermediates[:limit]:
    yes, strategy = removable(report, b, by_boundary.get(b.name, []), short)
    rows.append((b.name, b.shape, b.dtype, fmt_bytes(b.bytes), b.producer or "-",
                 _short_list(b.consumers), str(b.reuse_count),
                 f"{b.live_range[0]}-{b.live_range[1]}", b.lifetime.value, yes,
                 strategy, fmt_source(b.source)))
  return rows


#: What a report of a TPU (whose kernels keep buffers on chip) adds after
#: "Written": on-chip traffic, and the on-chip scratch each kernel reserves.
ON_CHIP_COLUMNS = ("On chip", "Scratch")


def shows_on_chip(report) -> bool:
  """Whether the kernel table has `ON_CHIP_COLUMNS` (a kernel moves or
  reserves on-chip memory)."""
  timing = report.timing
  return any(k.on_chip_scratch for k in report.kernels) or (
      timing is not None and any(t.on_chip_bytes for t in timing.kernels))


def kernel_columns(report) -> tuple[str, ...]:
  """KERNEL_COLUMNS, with `ON_CHIP_COLUMNS` after "Written" where shown."""
  if not shows_on_chip(report):
    return KERNEL_COLUMNS
  i = KERNEL_COLUMNS.index("Written") + 1
  return KERNEL_COLUMNS[:i] + ON_CHIP_COLUMNS + KERNEL_COLUMNS[i:]


def kernel_rows(report, limit: int | None = None) -> list[tuple[str, ...]]:
  """`kernel_columns(report)` rows, the longest estimated time first (the
  most bytes moved first without an estimate)."""
  timing = report.timing
  if timing is not None:
    def key(k):
      t = timing.kernel(k.name)
      return (-(t.time if t is not None else 0.0), -k.bytes_moved)
  else:
    def key(k):
      return -k.bytes_moved
  kernels = sorted(report.kernels, key=key)
  if limit is not None:
    kernels = kernels[:limit]
  on_chip = shows_on_chip(report)
  rows = []
  for k in kernels:
    fused = ", ".join(f"{op}" + (f"x{n}" if n > 1 else "")
                      for op, n in sorted(k.fused_ops.items(), key=lambda x: -x[1])[:6])
    t = timing.kernel(k.name) if timing is not None else None
    chip = ((fmt_bytes(t.on_chip_bytes) if t is not None else "",
             fmt_bytes(k.on_chip_scratch) if k.on_chip_scratch else "") if on_chip else ())
    rows.append((k.name, k.kind.value, k.detail if k.detail != k.opcode else "",
                 fused, fmt_bytes(k.bytes_read), fmt_bytes(k.bytes_written), *chip,
                 fmt_trip(k.trip_count), fmt_time(t.time) if t is not None else "",
                 t.bound.value if t is not None else "", fmt_source(k.source)))
  return rows


def group_rows(groups) -> list[tuple[str, ...]]:
  """FINDING_COLUMNS rows: one per group (numbered by rank), then one per
  member when the group has several (boundary name and bytes)."""
  rows = []
  for i, g in enumerate(groups, 1):
    f = g.first
    boundary = (f.boundary or f.producer) if g.count == 1 else f"x{g.count} buffers"
    rows.append((str(i), g.kind.value, boundary, g.boundary_shape,
                 _time(g.time_saved), fmt_bytes(g.bytes_saved), str(g.launches_removed),
                 g.kernel or "-", g.verdict.value, fmt_source(g.source), g.layer or "-"))
    if g.count > 1:
      rows += [("", "", "- " + (m.boundary or m.producer), "", _time(m.time_saved),
                fmt_bytes(m.bytes_saved), str(m.launches_removed), "", "", "",
                m.layer if m.layer and m.layer != g.layer else "")
               for m in g.members]
  return rows


def _time(seconds: float | None) -> str:
  return fmt_time(seconds) if seconds is not None else "-"


def group_sentence(g) -> str:
  """`finding_sentence` of a group: the first member's, with the count and
  the summed saving when there are several."""
  s = finding_sentence(g.first)
  if g.count == 1:
    return s
  return (f"x{g.count} {s} (each; {fmt_bytes(g.bytes_saved)} and "
          f"{g.launches_removed} launches for all {g.count})")


def finding_sentence(f: FusionDecisionRecord) -> str:
  """One line saying what the finding proposes."""
  where = f" at {fmt_source(f.source)}" if f.source else ""
  if f.kind is FindingKind.ALREADY_FUSED:
    return printable(f"already fused{where}: {f.evidence}")
  if f.kind is FindingKind.KEEP_REUSE:
    return printable(f"keep {f.boundary} ({f.boundary_shape}){where}: {f.evidence}")
  saving = (f"saves ~{fmt_time(f.time_saved)} and " if f.time_saved else "saves ") + \
      f"{fmt_bytes(f.bytes_saved)} of HBM traffic"
  if f.launches_removed:
    saving += f" and {f.launches_removed} launch{'es' if f.launches_removed != 1 else ''}"
  saving += " per run"
  close = f" with {f.kernel}" if f.kernel else ""
  return printable(
      f"{f.kind.value}{where}: {f.boundary} ({f.boundary_shape}); closing it{close} {saving}")


def record_fields(f: FusionDecisionRecord) -> list[tuple[str, str]]:
  """The fusion decision record as (field, value) lines, in the method's order."""
  return [(k, printable(v)) for k, v in _record_fields(f)]


def _record_fields(f: FusionDecisionRecord) -> list[tuple[str, str]]:
  return [
      ("producer and consumer", f"{f.producer or '-'} -> {', '.join(f.consumers) or '-'}"),
      ("boundary removed", f"{f.boundary or '-'} {f.boundary_shape}".strip()),
      ("logical bytes saved", f"{fmt_bytes(f.bytes_saved)} of HBM traffic per run"
       + (f" (x{fmt_trip(f.trip_count)} in loops)" if f.trip_count not in (1, None) else "")),
      ("launches removed", str(f.launches_removed)),
      ("time saved", _time_saved(f)),
      ("extra arithmetic", f.extra_arithmetic),
      ("extra registers/shared memory", f.extra_resources),
      ("numerical class", f.numerical_class.value),
      ("guard/fallback", f.guard),
      ("downstream layout effect", f.layout_effect),
      ("evidence", f.evidence),
      ("legality", f"{f.verdict.value}: " + "; ".join(f.reasons)),
      ("anti-benefit checks", "; ".join(f.risks) or "-"),
      ("source", fmt_source_context(f.source, f.source_stack) or "unknown"),
      ("layer", f.layer or "-"),
  ] + ([("peak after", f"{fmt_bytes(f.peak_after)} ({fmt_bytes(f.peak_saved)} off the peak"
                        + ("" if f.peak_exact else "; estimated, assignment kept") + ")")]
       if f.peak_after is not None else []) + ([("suggested call", f.suggestion), ("guard verdict", f.guard_verdict)]
       if f.suggestion else [])


def _time_saved(f: FusionDecisionRecord) -> str:
  if f.time_saved is None:
    return "not estimated (the device is unknown)"
  if f.time_saved < 0:
    return f"costs ~{fmt_time(-f.time_saved)} per step (estimated)"
  return f"~{fmt_time(f.time_saved)} per step (estimated)"


def time_line(report) -> str | None:
  """The estimated step in one line, or None without an estimate."""
  t = report.timing
  if t is None:
    return None
  split = ", ".join(f"{name} {fmt_time(v)}" for name, v in (
      ("memory-bound", t.memory_time), ("compute-bound", t.compute_time),
      ("launch", t.launch_time), ("communication", t.communication_time)) if v > 0)
  facts = t.facts
  return (f"estimated step on {facts.name} ({facts.description}): {fmt_time(t.step_time)}"
          + (f" ({split})" if split else "")
          + ("" if facts.measured else f"; {facts.checked}")
          + _beside_xla(report))


def _beside_xla(report) -> str:
  """libtpu's own estimate of the step, and ours over it."""
  x = getattr(report, "xla_estimate", None)
  if x is None:
    return ""
  undo = (f", reported as {x.reported:.6g}: -1 s for each of its {x.uncosted} "
          "ConcatBitcast calls it cannot price, undone") if x.uncosted else ""
  ratio = (f"; ours is {report.timing.step_time / x.seconds:.2f}x of it"
           if x.seconds > 0 else "")
  return f"; libtpu's estimate {fmt_time(x.seconds)} (optimal_seconds{undo}){ratio}"


def cycles_line(report) -> str | None:
  """How the kernels' estimates track XLA:TPU's own per-kernel cycles."""
  s = getattr(report, "cycles_spread", None)
  if s is None:
    return None
  return (f"XLA:TPU's per-kernel estimated_cycles beside ours ({s.kernels} kernels): "
          f"80% within {s.low:.2f}x-{s.high:.2f}x of the median ratio "
          f"(ours {s.seconds_per_cycle * 1e9:.3f} ns per XLA cycle)")


def peak_line(report) -> str:
  ours = fmt_bytes(report.peak_bytes)
  heap = fmt_bytes(report.heap_peak_bytes) + _holes(report)
  if report.xla_peak_bytes is None:
    return f"peak {ours} (allocations {fmt_bytes(report.allocation_bytes)} + heap {heap}); XLA's peak unknown"
  return (f"peak {ours} (allocations {fmt_bytes(report.allocation_bytes)} + heap "
          f"{heap}); XLA's {fmt_bytes(report.xla_peak_bytes)} "
          f"({fmt_pct(report.peak_agreement)})") + _what_if_peak(report)


def _holes(report) -> str:
  """What a packed heap (XLA:GPU's) adds to the most bytes live at once."""
  holes = getattr(getattr(report.program, "liveness", None), "fragmentation_bytes", 0)
  return (f", {fmt_bytes(holes)} of it tuple pointer tables and holes left by XLA's "
          "best-fit packing") if holes else ""


def _what_if_peak(report) -> str:
  """The selected what-if's peak, beside the original."""
  w = report.what_if_replay
  if w is None:
    return ""
  return f"; what-if ({'; '.join(w.changes) or 'no change'}): {fmt_bytes(w.peak_bytes)}"


def target_lines(report) -> list[str]:
  """The header's word on the target, when compiled for one without it."""
  m = report.module
  if not m.target:
    return []
  return [f"target {m.target}: compiled on this machine, without the device; "
          + "; ".join(m.target_notes)]


def summary(report) -> str:
  m = report.module
  lines = [f"module {m.name}" + (f" on {m.platform}" if m.platform else "") +
           (f" ({m.device_kind})" if m.device_kind and m.device_kind != m.platform else ""),
           *("  " + t for t in target_lines(report)),
           f"  {m.instruction_count} instructions, {m.computation_count} computations, "
           f"{m.schedule_length} scheduled steps"]
  kinds = ", ".join(f"{n} {kind}" for kind, n in report.kernels_by_kind().items())
  lines.append(f"  kernels: {len(report.kernels)} ({kinds})")
  top = [b for b in report.buffers if not b.internal]
  lines.append(f"  buffers: {len(top)} top-level, {fmt_bytes(sum(b.bytes for b in top))}; "
               f"{len(report.intermediates)} intermediates >= "
               f"{100 * report.options.intermediate_fraction:g}% of peak")
  lines.append("  " + peak_line(report))
  step = time_line(report)
  if step:
    lines.append("  " + step)
  by_class = {}
  for f in report.findings:
    by_class[f.kind.value] = by_class.get(f.kind.value, 0) + 1
  lines.append(f"  findings: {len(report.findings)}" +
               (" (" + ", ".join(f"{n} {k}" for k, n in by_class.items()) + ")" if by_class else "") +
               f"; fusing the gaps would cut HBM traffic (bytes moved, not peak memory) "
               f"by {fmt_bytes(report.bytes_saved)} per run")
  for note in report.notes:
    lines.append(f"  note: {note}")
  return "\n".join(printable(line) for line in lines)


def _short_list(items, n: int = 3) -> str:
  items = list(items)
  if not items:
    return "-"
  more = f" +{len(items) - n}" if len(items) > n else ""
  return ", ".join(items[:n]) + more
