"""Repeated findings as one group: the same class and pattern at the same
source line (per layer, per head, per loop iteration, forward and backward).

Pure functions over the records; every renderer (terminal, JSON, HTML) and
`hlo_audit.testing` group and rank with these, so they show the same rows.
"""

from __future__ import annotations

import dataclasses

from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, Verdict
from hlo_audit._src.analysis.time_model import CAPACITY_KINDS
from hlo_audit._src.hlo.ir import SourceLocation

#: How groups can be ranked: by estimated time saved (the default), by
#: traffic bytes saved, or by peak memory saved.
SORTS = ("time", "bytes", "peak")


@dataclasses.dataclass(frozen=True, slots=True)
class FindingGroup:
  """Findings that differ only in which instance of a pattern they are."""

  kind: FindingKind
  #: The source line the members share (column and function ignored).
  source: SourceLocation | None
  boundary_shape: str
  ops: tuple[str, ...]
  kernel: str | None
  verdict: Verdict
  members: tuple[FusionDecisionRecord, ...]

  @property
  def count(self) -> int:
    return len(self.members)

  @property
  def bytes_saved(self) -> int:
    """Summed over the members (per run)."""
    return sum(f.bytes_saved for f in self.members)

  @property
  def launches_removed(self) -> int:
    return sum(f.launches_removed for f in self.members)

  @property
  def time_saved(self) -> float | None:
    """Estimated seconds per step, summed over the members that have one;
    None when none has (the device is unknown)."""
    values = [f.time_saved for f in self.members if f.time_saved is not None]
    return sum(values) if values else None

  @property
  def capacity(self) -> bool:
    """A change to what memory holds (donation, remat, a replicated
    buffer's split), not to the work: ranked apart, by peak saved."""
    return self.kind in CAPACITY_KINDS

  @property
  def peak_saved(self) -> int | None:
    """Summed `peak_saved` of the members that have one; None when none has
    (records without the field, or what-ifs not computed)."""
    values = [v for v in (getattr(f, "peak_saved", None) for f in self.members)
              if v is not None]
    return sum(values) if values else None

  @property
  def actionable(self) -> bool:
    """Proposes a change (not "keep" and not "already fused")."""
    return self.verdict is not Verdict.KEEP and self.kind is not FindingKind.ALREADY_FUSED

  @property
  def first(self) -> FusionDecisionRecord:
    return self.members[0]

  @property
  def layer(self) -> str:
    """The layer the members come from (JAX's name stack): the one they
    share, else the first and how many more; "" where none names one."""
    layers = list(dict.fromkeys(f.layer for f in self.members if f.layer))
    if len(layers) <= 1:
      return layers[0] if layers else ""
    return f"{layers[0]} (+{len(layers) - 1} more)"


def group_key(f: FusionDecisionRecord) -> tuple:
  """What makes two findings the same pattern: class, source line, boundary
  shape, the work found, the kernel that closes it, and the verdict. Not
  instruction names: XLA numbers those per instance."""
  src = (f.source.file, f.source.line) if f.source is not None else None
  return (f.kind, src, f.boundary_shape, f.ops, f.kernel, f.verdict)


def group_findings(findings) -> tuple[FindingGroup, ...]:
  """Groups in order of first appearance; members in their original order."""
  groups: dict[tuple, list[FusionDecisionRecord]] = {}
  for f in findings:
    groups.setdefault(group_key(f), []).append(f)
  return tuple(
      FindingGroup(kind=m[0].kind, source=m[0].source, boundary_shape=m[0].boundary_shape,
                   ops=m[0].ops, kernel=m[0].kernel, verdict=m[0].verdict, members=tuple(m))
      for m in groups.values())


def rank_key(g: FindingGroup, sort: str = "time") -> tuple:
  """Actionable groups first; then by `sort`: estimated time saved (groups
  without an estimate, e.g. the device unknown, by traffic bytes), traffic
  bytes saved, or peak bytes saved; ties by the other measures and class."""
  kinds = list(FindingKind)
  time = g.time_saved
  # In whole picoseconds: sums of the same floats differ in their last bits
  # between Pythons (3.12's sum() compensates), and must rank alike.
  time = None if time is None else round(time * 1e12)
  if sort == "peak":
    key = (-(g.peak_saved or 0), -(time or 0.0), -g.bytes_saved)
  elif sort == "bytes":
    key = (-g.bytes_saved, -(time or 0.0), -(g.peak_saved or 0))
  elif sort == "time":
    key = (time is None, -(time or 0.0), -g.bytes_saved, -(g.peak_saved or 0))
  else:
    raise ValueError(f"unknown sort {sort!r}; known: {', '.join(SORTS)}")
  return (not g.actionable, *key, kinds.index(g.kind))


def ranked_groups(findings, sort: str = "time") -> tuple[FindingGroup, ...]:
  """`group_findings`, most valuable first (`rank_key`; stable otherwise)."""
  return tuple(sorted(group_findings(findings), key=lambda g: rank_key(g, sort)))


def split_capacity(groups) -> tuple[tuple[FindingGroup, ...], tuple[FindingGroup, ...]]:
  """(groups that change the work, capacity groups ranked by peak saved):
  the report's two sections."""
  work = tuple(g for g in groups if not g.capacity)
  capacity = tuple(sorted((g for g in groups if g.capacity),
                          key=lambda g: rank_key(g, "peak")))
  return work, capacity
