"""The audit report: one frozen object that every renderer reads.

`AuditReport` holds the results of the analyses (kernels, buffers, liveness,
findings) for one module, and the renderers turn it into a terminal view,
JSON, Markdown or HTML; they format, they compute nothing new.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import Buffer, Lifetime
from hlo_audit._src.analysis.options import AuditOptions
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord, Verdict

#: Version of the JSON schema written by `to_json` (2: findings' peak_after
#: and peak_saved, the what_if section; 3: rows' `source_stack` as indices
#: into the document's "frames"; 4: the time estimate, findings' time_saved).
SCHEMA_VERSION = 4


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleInfo:
  """What module was audited, from where."""

  name: str
  platform: str = ""
  device_kind: str = ""
  jax_version: str = ""
  jaxlib_version: str = ""
  instruction_count: int = 0
  computation_count: int = 0
  #: Length of the flattened schedule.
  schedule_length: int = 0
  is_scheduled: bool = False
  #: Whether XLA optimized the module (scheduled or fused); an unoptimized
  #: one gets no findings.
  optimized: bool = True
  #: "jit", "lowered", "compiled", "dump" or "text".
  origin: str = ""
  path: str | None = None
  #: Where XLA's peak came from: "buffer-assignment proto" (the executable's,
  #: no recompile), "dump reports", "memory_analysis", or "" (none).
  xla_peak_source: str = ""
  #: The target compiled for without its device ("h200", "8x h200"); "" when
  #: compiled for the machine's own backend (or read from HLO).
  target: str = ""
  #: How that compile differs from one on the device (not autotuned, ...).
  target_notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class AuditReport:
  """The materialization audit of one compiled module."""

  module: ModuleInfo
  #: Every kernel launch, in schedule order.
  kernels: tuple[Kernel, ...]
  #: Every materialized buffer, largest first.
  buffers: tuple[Buffer, ...]
  #: Fusion decision records, grouped by class, largest saving first.
  findings: tuple[FusionDecisionRecord, ...]
  #: Our peak memory (allocations + heap peak), in XLA's accounting.
  peak_bytes: int
  #: XLA's own total (its allocations + temp buffer), when known.
  xla_peak_bytes: int | None
  #: `memory_analysis().peak_memory_in_bytes` as XLA reports it.
  xla_reported_peak_bytes: int | None
  #: Bytes of allocations (parameters, outputs, constants).
  allocation_bytes: int
  #: Peak of the temporaries' heap, and when it happens.
  heap_peak_bytes: int
  peak_time: int
  #: Live bytes per schedule step.
  timeline: tuple[int, ...]
  #: Buffers live at the peak (names).
  live_at_peak: tuple[str, ...]
  #: XLA's cost analysis, when captured.
  cost_analysis: Mapping[str, float] | None = None
  notes: tuple[str, ...] = ()
  options: AuditOptions = AuditOptions()
  #: Collectives of a partitioned program, per device (see collectives.py).
  collectives: tuple = ()
  #: The what-if replay selected for display (`with_what_if`), if any.
  what_if_replay: Any = None
  #: The analysed program, for what-if replays (None for reports read from JSON).
  program: Any = dataclasses.field(default=None, compare=False, repr=False)
  #: The kernel libraries the audit consulted that swap fixes in, by name
  #: (e.g. "pallas_kernels"; a library whose calls another swaps is named
  #: by its findings' `kernel` only).
  kernel_libraries: tuple[str, ...] = ()
  #: The estimated step on the device (`time_model.StepTime`): every
  #: kernel's time and bound, the step and its split; None where the device
  #: is unknown (the notes say why).
  timing: Any = None
  #: The backend's own estimate of the step (`xla_estimate.XlaEstimate`:
  #: libtpu's, for a TPU), to set beside `timing`; None where it gives none.
  xla_estimate: Any = None
  #: How the kernels' estimates track XLA:TPU's per-kernel
  #: `estimated_cycles` (`xla_estimate.CyclesSpread`); None elsewhere.
  cycles_spread: Any = None

  # --------------------------------------------------------- what-ifs ----

  def what_if(self, *, fuse: Sequence[FusionDecisionRecord] = (),
              donate: Sequence[int | str] = (), remat: Sequence[str] = (),
              drop: Sequence[str] = (), unsplit: Sequence[str] = ()):
    """Replays the liveness with changes made; returns a `WhatIf` (new peak,
    timeline and buffers live at the new peak).

    Args:
      fuse: findings whose boundary the change fuses away.
      donate: arguments to donate: argument numbers (as `donate_argnums`),
        names, or pytree paths such as "params['dense']['kernel']".
      remat: buffers (by name, as in `buffers`) recomputed before their late uses.
      drop: buffers removed outright.
      unsplit: split-K partial sums (buffer names, see `split_k`) whose gemm
        writes its [M, N] result once instead, as a kernel replacing it that
        does not split K would.

    Raises:
      WhatIfError: for a name the program lacks, or a report read from JSON.
    """
    from hlo_audit._src.analysis.program import WhatIfError
    from hlo_audit._src.analysis.replay import replay

    if self.program is None:
      raise WhatIfError("this report carries no program to replay (read from JSON?); "
                        "audit the function or HLO again")
    fusions, kept = [], []
    for f in fuse:
      if not isinstance(f, FusionDecisionRecord) or not f.boundary:
        raise WhatIfError(f"fuse: expected findings with a boundary buffer, got {f!r:.80}")
      if f.kind.fix != "fuse":
        # Replayed as a fusion, it would take away a buffer no kernel can.
        raise WhatIfError(
            f"fuse: a {f.kind.value!r} finding ({f.boundary}) is not closed by a fusion; " + (
                f"replay it with {f.kind.fix}=[{f.boundary!r}]" if f.kind.fix else
                "the replay does not model its change"))
      if f.boundary_kept:
        kept.append(f.boundary)  # another reader needs it: traffic goes, not memory
      else:
        fusions.append((f.boundary, f.producer, f.consumers))
    result = replay(self.program, fuse=fusions, donate=list(donate), remat=list(remat),
                    drop=list(drop), unsplit=list(unsplit))
    if self.timing is not None:
      result = dataclasses.replace(
          result, baseline_step_time=self.timing.step_time,
          step_time=self._step_after(fuse, remat))
    if kept:
      result = dataclasses.replace(result, notes=(*result.notes, *(
          f"fuse {b}: other readers keep the buffer (fewer reads, the same memory)"
          for b in kept)))
    return result

  def _step_after(self, fuse, remat) -> float:
    """The estimated step once `fuse` findings are fixed and the `remat`
    buffers are recomputed (each producer kernel runs once more)."""
    from hlo_audit._src.analysis.time_model import step_after

    step = step_after(self.timing, list(fuse))
    for name in remat:
      producer = self.program.buffers.get(name)
      k = self.timing.kernel(producer.producer) if producer is not None else None
      if k is not None:
        step += k.time_per_launch
    return step

  @property
  def split_k(self):
    """The split-K gemms of the program (XLA:GPU): a `SplitK` per buffer of
    partial sums, largest first; () for a report without its program."""
    from hlo_audit._src.analysis.split_k import split_k_partials

    if self.program is None:
      return ()
    return tuple(sorted(split_k_partials(self.program).values(), key=lambda s: -s.bytes))

  def with_what_if(self, what_if) -> AuditReport:
    """This report with `what_if` selected for display (terminal, JSON, HTML)."""
    return dataclasses.replace(self, what_if_replay=what_if)

  # ------------------------------------------------------------ views ----

  @property
  def intermediates(self) -> tuple[Buffer, ...]:
    """The method's intermediate-tensor table: buffers other than inputs and
    outputs holding at least `options.intermediate_fraction` of peak."""
    floor = self.options.intermediate_fraction * self.peak_bytes
    return tuple(b for b in self.buffers
                 if b.lifetime not in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT)
                 and not b.internal and b.bytes >= floor)

  @property
  def peak_agreement(self) -> float | None:
    """(ours - XLA's) / XLA's peak; None when XLA's is unknown."""
    if not self.xla_peak_bytes:
      return None
    return (self.peak_bytes - self.xla_peak_bytes) / self.xla_peak_bytes

  def kernels_by_kind(self) -> Mapping[str, int]:
    counts = collections.Counter(k.kind.value for k in self.kernels)
    return types.MappingProxyType(dict(counts.most_common()))

  def findings_of(self, kind: FindingKind | str) -> tuple[FusionDecisionRecord, ...]:
    """Findings of one class (a `FindingKind` or its slug, e.g. "unfused-epilogue")."""
    if isinstance(kind, str):
      kind = finding_kind(kind)
    return tuple(f for f in self.findings if f.kind is kind)

  @property
  def actionable(self) -> tuple[FusionDecisionRecord, ...]:
    """Findings that propose a change (not "keep" or "already fused")."""
    return tuple(f for f in self.findings if f.verdict is not Verdict.KEEP)

  @property
  def bytes_saved(self) -> int:
    """HBM traffic (bytes moved, not memory) per run the actionable
    findings would save, each boundary counted once (several findings may
    name the same buffer)."""
    return _saving(self.actionable)

  def bytes_saved_by_class(self) -> Mapping[str, int]:
    """`bytes_saved` of each class's actionable findings alone, by slug
    (a boundary two classes name counts in both)."""
    by_class: dict[str, list[FusionDecisionRecord]] = {}
    for f in self.actionable:
      by_class.setdefault(f.kind.slug, []).append(f)
    return types.MappingProxyType({k: _saving(v) for k, v in by_class.items()})

  @property
  def materialized_bytes(self) -> int:
    """Bytes of buffers the program writes that are neither its inputs nor
    its outputs (Pallas-internal buffers excluded)."""
    return sum(b.bytes for b in self.buffers
               if b.lifetime not in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT)
               and not b.internal)

  def buffer(self, name: str) -> Buffer:
    for b in self.buffers:
      if b.name == name:
        return b
    raise KeyError(f"no buffer {name!r} in the audit of {self.module.name}")

  def kernel(self, name: str) -> Kernel:
    for k in self.kernels:
      if k.name == name:
        return k
    raise KeyError(f"no kernel {name!r} in the audit of {self.module.name}")

  def summary(self) -> str:
    """A few lines: module, kernels by kind, buffers, peak, findings."""
    from hlo_audit._src.report import text

    return text.summary(self)

  # -------------------------------------------------------- renderers ----

  def __str__(self) -> str:
    """The terminal report (`to_text()`), at the CLI's width: $COLUMNS, else
    the terminal's, else 160 when stdout is not a terminal."""
    return self.to_text()

  def to_text(self, width: int | None = None, *, all: bool = False,  # noqa: A002
              top: int | None = None, sort: str = "time") -> str:
    """The terminal report as text: the summary and the `top` (default 15)
    finding groups ranked by `sort` ("time": the estimated time saved, where
    the device is known; "bytes"; "peak"); `all=True` adds every table and
    every group's decision record. Names never break mid-word."""
    from hlo_audit._src.report import terminal

    return terminal.render_text(self, width, all=all, sort=sort,
                                top=terminal.TOP if top is None else top)

  @property
  def groups(self):
    """Findings grouped (same class and pattern at one source line) and
    ranked: actionable first, by estimated time saved (by traffic where the
    device is unknown; see `grouping`)."""
    from hlo_audit._src.report.grouping import ranked_groups

    return ranked_groups(self.findings)

  def to_dict(self) -> dict:
    """The JSON document as Python data (see `to_json`)."""
    from hlo_audit._src.report import json_report

    return json_report.to_dict(self)

  def to_json(self, indent: int | None = 2) -> str:
    """JSON with top-level `schema_version`, `module`, `kernels`, `buffers`,
    `findings`, `peak_bytes`, `xla_peak_bytes` (schema in docs/reports.md)."""
    from hlo_audit._src.report import json_report

    return json_report.render_json(self, indent=indent)

  def to_markdown(self) -> str:
    from hlo_audit._src.report import markdown

    return markdown.render_markdown(self)

  def to_html(self, path: str | None = None) -> str:
    """A self-contained HTML page; written to `path` when given."""
    from hlo_audit._src.report import html

    page = html.render_html(self)
    if path is not None:
      with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return page

  def to_trace(self, path: str | None = None) -> str:
    """The estimated timeline as Chrome trace JSON (one event per kernel
    launch; open it in https://ui.perfetto.dev or chrome://tracing);
    written to `path` when given.

    Raises:
      HloAuditError: when the report has no time estimate (the notes say
        why), or was read from JSON (which keeps no timeline).
    """
    from hlo_audit._src.report import trace

    doc = trace.render_trace(self)
    if path is not None:
      with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return doc

  def diff(self, other: AuditReport):
    """What changed from this report to `other` (see `AuditDiff`)."""
    from hlo_audit._src.report.diff import diff_reports

    return diff_reports(self, other)

  def print(self, console=None, *, all: bool = False) -> None:  # noqa: A002
    """Prints the terminal report to `console` (a rich Console or a text
    stream; stdout when None)."""
    from hlo_audit._src.report import terminal

    terminal.render_terminal(self, console, all=all)


def _saving(findings) -> int:
  """Bytes the findings would save, each boundary counted once."""
  best: dict[str, int] = {}
  for f in findings:
    key = f.boundary or f"{f.producer}:{f.kind.slug}"
    best[key] = max(best.get(key, 0), f.bytes_saved)
  return sum(best.values())


def finding_kind(slug: str) -> FindingKind:
  """A finding class from its slug ("unfused-epilogue") or value.

  Raises:
    ValueError: naming the known classes.
  """
  for k in FindingKind:
    if slug in (k.slug, k.value, k.name):
      return k
  raise ValueError(f"unknown finding class {slug!r}; known: "
                   + ", ".join(k.slug for k in FindingKind))


def is_lifetime_transient(b: Buffer) -> bool:
  return b.lifetime not in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT)


__all__ = ["AuditReport", "ModuleInfo", "SCHEMA_VERSION", "finding_kind",
           "KernelKind"]
