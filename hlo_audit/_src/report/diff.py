"""What changed between two audits: kernels, buffers and findings that
appeared or vanished, and how bytes and launches moved.

Instruction names change between compiles (`fusion.12` becomes `fusion.9`),
so items are matched by what they are: kernels by kind, op_name and source
line; buffers by shape, op_name and source line; findings by class, shape,
source line and work.
"""

from __future__ import annotations

import collections
import dataclasses

from hlo_audit._src.analysis.buffers import Buffer, Lifetime
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.records import FusionDecisionRecord
from hlo_audit._src.report.safe import printable
from hlo_audit._src.report.units import fmt_bytes, fmt_delta_bytes, fmt_source


def kernel_key(k: Kernel) -> tuple:
  return (k.kind.value, k.op_name, fmt_source(k.source))


def buffer_key(b: Buffer) -> tuple:
  return (b.shape, b.op_name, fmt_source(b.source), b.lifetime.value)


def finding_key(f: FusionDecisionRecord) -> tuple:
  """What `AuditDiff` matches a finding by across two compiles (instruction
  names change): class, boundary shape, source line and the ops it holds."""
  return (f.kind.value, f.boundary_shape, fmt_source(f.source), f.ops)


def _multiset_diff(before, after, key):
  b = collections.Counter(key(x) for x in before)
  a = collections.Counter(key(x) for x in after)
  gone_keys, new_keys = b - a, a - b
  gone, new = [], []
  for x in before:
    k = key(x)
    if gone_keys[k] > 0:
      gone.append(x)
      gone_keys[k] -= 1
  for x in after:
    k = key(x)
    if new_keys[k] > 0:
      new.append(x)
      new_keys[k] -= 1
  return tuple(gone), tuple(new)


@dataclasses.dataclass(frozen=True, slots=True)
class AuditDiff:
  """The difference from report `before` to report `after`."""

  before: str
  after: str
  kernels_removed: tuple[Kernel, ...]
  kernels_added: tuple[Kernel, ...]
  buffers_removed: tuple[Buffer, ...]
  buffers_added: tuple[Buffer, ...]
  findings_removed: tuple[FusionDecisionRecord, ...]
  findings_added: tuple[FusionDecisionRecord, ...]
  kernel_count_delta: int
  #: Launches per run, counting trip counts.
  launches_delta: int
  materialized_bytes_delta: int
  peak_bytes_delta: int
  bytes_saved_delta: int

  @property
  def unchanged(self) -> bool:
    return not (self.kernels_removed or self.kernels_added or self.buffers_removed
                or self.buffers_added or self.findings_removed or self.findings_added)

  def __str__(self) -> str:
    lines = [f"diff {self.before} -> {self.after}",
             f"  kernels {self.kernel_count_delta:+d} (launches per run {self.launches_delta:+d}), "
             f"materialized {fmt_delta_bytes(self.materialized_bytes_delta)}, "
             f"peak {fmt_delta_bytes(self.peak_bytes_delta)}, "
             f"HBM traffic a fusion would save {fmt_delta_bytes(self.bytes_saved_delta)}"]
    for title, items, fmt in (
        ("kernels removed", self.kernels_removed, _k),
        ("kernels added", self.kernels_added, _k),
        ("buffers removed", self.buffers_removed, _b),
        ("buffers added", self.buffers_added, _b),
        ("findings removed", self.findings_removed, _f),
        ("findings added", self.findings_added, _f)):
      if items:
        lines.append(f"  {title} ({len(items)}):")
        lines += [f"    - {fmt(x)}" for x in items[:20]]
        if len(items) > 20:
          lines.append(f"    ... {len(items) - 20} more")
    if self.unchanged:
      lines.append("  no kernel, buffer or finding changed")
    # Names, op_names and paths are the inputs' text.
    return "\n".join(printable(line) for line in lines)

  def to_dict(self) -> dict:
    from hlo_audit._src.report import json_report as j
    frames = j.Frames()
    return {
        "before": self.before, "after": self.after,
        "kernel_count_delta": self.kernel_count_delta,
        "launches_delta": self.launches_delta,
        "materialized_bytes_delta": self.materialized_bytes_delta,
        "peak_bytes_delta": self.peak_bytes_delta,
        "bytes_saved_delta": self.bytes_saved_delta,
        "kernels_removed": [j.kernel_dict(k, frames) for k in self.kernels_removed],
        "kernels_added": [j.kernel_dict(k, frames) for k in self.kernels_added],
        "buffers_removed": [j.buffer_dict(b, frames) for b in self.buffers_removed],
        "buffers_added": [j.buffer_dict(b, frames) for b in self.buffers_added],
        "findings_removed": [j.finding_dict(f, frames) for f in self.findings_removed],
        "findings_added": [j.finding_dict(f, frames) for f in self.findings_added],
        "frames": frames.table,
    }


def _k(k: Kernel) -> str:
  return f"{k.name} [{k.kind.value}] {k.op_name} {fmt_source(k.source)}".strip()


def _b(b: Buffer) -> str:
  return f"{b.name} {b.shape} {fmt_bytes(b.bytes)} ({b.lifetime.value}) {fmt_source(b.source)}".strip()


def _f(f: FusionDecisionRecord) -> str:
  return (f"{f.kind.value}: {f.boundary} {f.boundary_shape} saves "
          f"{fmt_bytes(f.bytes_saved)} {fmt_source(f.source)}").strip()


def _launches(kernels) -> int:
  return sum(k.trip_count if k.trip_count is not None else 1 for k in kernels)


def diff_reports(before, after) -> AuditDiff:
  kb, ka = _multiset_diff(before.kernels, after.kernels, kernel_key)
  visible = lambda r: [b for b in r.buffers if not b.internal and  # noqa: E731
                       b.lifetime not in (Lifetime.INPUT,)]
  bb, ba = _multiset_diff(visible(before), visible(after), buffer_key)
  fb, fa = _multiset_diff(before.findings, after.findings, finding_key)
  return AuditDiff(
      before=before.module.name, after=after.module.name,
      kernels_removed=kb, kernels_added=ka, buffers_removed=bb, buffers_added=ba,
      findings_removed=fb, findings_added=fa,
      kernel_count_delta=len(after.kernels) - len(before.kernels),
      launches_delta=_launches(after.kernels) - _launches(before.kernels),
      materialized_bytes_delta=after.materialized_bytes - before.materialized_bytes,
      peak_bytes_delta=after.peak_bytes - before.peak_bytes,
      bytes_saved_delta=after.bytes_saved - before.bytes_saved)
