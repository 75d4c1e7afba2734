"""One record per boundary: where several detectors saw it, the strongest speaks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, Verdict

#: Which class speaks for a boundary several detectors saw, strongest first.
_STRENGTH = (FindingKind.UNFUSED_EPILOGUE, FindingKind.LAYOUT_CONFLICT,
             FindingKind.UNFUSED_PROLOGUE, FindingKind.MATERIALIZED_SLICE,
             FindingKind.STANDALONE_COPY, FindingKind.EXPANDED_BROADCAST,
             FindingKind.SEPARATE_REDUCTION, FindingKind.LOOP_INVARIANT,
             FindingKind.KEEP_REUSE)
_VERDICT_RANK = {Verdict.SAFE: 0, Verdict.RISKY: 1, Verdict.KEEP: 2}


def epilogue_or_prologue(found: Sequence[FusionDecisionRecord]) -> list[FusionDecisionRecord]:
  """`found` with each prologue whose producer an epilogue reads folded into
  that epilogue as a note: in dot -> elementwise -> dot the elementwise
  kernel is the first dot's epilogue or the second's prologue, not both
  (only one boundary can go)."""
  out = list(found)
  by_consumer = {c: i for i, r in enumerate(out) if r.kind is FindingKind.UNFUSED_EPILOGUE
                 for c in r.consumers}
  folded = set()
  for j, r in enumerate(out):
    i = by_consumer.get(r.producer) if r.kind is FindingKind.UNFUSED_PROLOGUE else None
    if i is None:
      continue
    out[i] = dataclasses.replace(out[i], notes=out[i].notes + (
        f"alternatively a prologue of {', '.join(r.consumers)}: {r.producer} "
        f"writes {r.boundary_shape} ({', '.join(r.ops)}) only for matmuls",))
    folded.add(j)
  return [r for j, r in enumerate(out) if j not in folded] if folded else out


def split_or_relayouts(found: Sequence[FusionDecisionRecord]) -> list[FusionDecisionRecord]:
  """`found` with each split epilogue whose every reader relays its block out
  for a matmul (a fused QKV product cut into q, k and v, each transposed for
  the attention gemms) folded into those layout conflicts as a note: the
  product written in the blocks' layouts, or the blocks read in place, take
  the same traffic away (only one of the two can go)."""
  relayout = {r.producer for r in found if r.kind is FindingKind.LAYOUT_CONFLICT}
  out = list(found)
  for j, r in enumerate(out):
    if r.kind is FindingKind.UNFUSED_EPILOGUE and r.ops[:1] and \
        r.ops[0].startswith("split:") and r.consumers and \
        all(c in relayout for c in r.consumers):
      i = next(i for i, c in enumerate(out)
               if c.kind is FindingKind.LAYOUT_CONFLICT and c.producer == r.consumers[0])
      out[i] = dataclasses.replace(out[i], notes=out[i].notes + (
          f"alternatively an epilogue of {r.producer}: it writes {r.boundary_shape}, of "
          f"which {', '.join(r.consumers)} each relay one block out; writing the blocks "
          "in their readers' layouts takes the same traffic away",))
      out[j] = None
  return [r for r in out if r is not None]


def one_per_boundary(found: Sequence[FusionDecisionRecord]) -> list[FusionDecisionRecord]:
  """One record a boundary: the strongest actionable class speaks, the
  others become its notes; so no buffer is counted twice in a total."""
  groups: dict[tuple[str, str], list[FusionDecisionRecord]] = {}
  out = []
  for r in found:
    if not r.boundary or r.kind is FindingKind.ALREADY_FUSED:
      out.append(r)
    else:
      groups.setdefault((r.computation, r.boundary), []).append(r)
  for records in groups.values():
    records.sort(key=lambda r: (_VERDICT_RANK[r.verdict],
                                _STRENGTH.index(r.kind) if r.kind in _STRENGTH else 99,
                                r.kernel is None, -r.bytes_saved))
    head, rest = records[0], records[1:]
    if rest:
      notes = tuple(f"also {r.kind.value} ({r.verdict.value}): {r.evidence}" for r in rest)
      head = dataclasses.replace(head, notes=head.notes + notes)
    out.append(head)
  return out
