"""Findings as records: the method's fusion decision record, and its enums.

A finding is data, not prose: renderers write the sentences. Every field of
the method's record is here (producer and consumer, boundary removed, logical
bytes saved, launches removed, extra arithmetic, extra registers and shared
memory, numerical class, guard or fallback, downstream layout effect, evidence
of what XLA did), with a legality verdict and the anti-benefit risks to check.
"""

from __future__ import annotations

import dataclasses
import enum

from hlo_audit._src.hlo.ir import SourceLocation


class FindingKind(enum.Enum):
  """The classes of findings, in the order the audit reports them."""

  STANDALONE_COPY = "standalone copy or transpose"
  LAYOUT_CONFLICT = "layout conflict"
  EXPANDED_BROADCAST = "expanded broadcast"
  UNFUSED_EPILOGUE = "unfused epilogue"
  UNFUSED_PROLOGUE = "unfused prologue"
  SEPARATE_REDUCTION = "separate reduction"
  #: A slice, dynamic-slice or concatenate written to memory for one reader
  #: that could read the parts in place.
  MATERIALIZED_SLICE = "materialized slice or concatenate"
  #: Work inside a while body whose inputs do not change across iterations.
  LOOP_INVARIANT = "loop-invariant work"
  KEEP_REUSE = "multi-consumer buffer worth keeping"
  ALREADY_FUSED = "already fused"
  # Memory findings (memory_findings.py): changes that lower the peak.
  UNDONATED_ARGUMENT = "argument not donated"
  REMAT_CANDIDATE = "saved buffer cheap to recompute"
  COSTLY_REMAT = "remat whose recompute dominates"
  # Sharded programs: communication and layout around collectives.
  EXPOSED_COLLECTIVE = "exposed communication"
  RESHARD_AROUND_COLLECTIVE = "resharding copy around a collective"
  COLLECTIVE_MATMUL = "all-gather feeding a dot"
  REPLICATED_BUFFER = "replicated buffer the sharding could split"
  #: A donated buffer XLA rewrites whole every run where its update (a
  #: dynamic-update-slice, a scatter) was meant to run in place.
  LOST_IN_PLACE = "in-place update lost"

  @property
  def slug(self) -> str:
    """Short id for flags and JSON, e.g. "unfused-epilogue"."""
    return self.name.lower().replace("_", "-")

  @property
  def fix(self) -> str:
    """How the finding's change is replayed (`AuditReport.what_if`): "fuse"
    (a kernel takes its boundary away), "donate", "remat", or "" where the
    replay has no such change (already fused; a sharding or schedule)."""
    return _FIX.get(self, "")


_FIX = {
    **{k: "fuse" for k in (
        FindingKind.STANDALONE_COPY, FindingKind.LAYOUT_CONFLICT,
        FindingKind.EXPANDED_BROADCAST, FindingKind.UNFUSED_EPILOGUE,
        FindingKind.UNFUSED_PROLOGUE, FindingKind.SEPARATE_REDUCTION,
        FindingKind.MATERIALIZED_SLICE, FindingKind.LOOP_INVARIANT, FindingKind.KEEP_REUSE,
        # The dot reads the gathered shards as they arrive: the gathered
        # buffer goes, as a fusion's boundary does.
        FindingKind.COLLECTIVE_MATMUL)},
    FindingKind.UNDONATED_ARGUMENT: "donate",
    FindingKind.REMAT_CANDIDATE: "remat",
}


class NumericalClass(enum.Enum):
  """How fusing changes the numbers."""

  #: Same bits: data movement only.
  EXACT = "bit-exact"
  #: Same operations in the same precision; compilers may contract a*b+c
  #: into an FMA, so last-bit differences are possible.
  SAME_OPS = "same ops (FMA contraction may differ in the last bit)"
  #: The fused kernel applies the epilogue to the f32 accumulator before
  #: rounding: more precise than XLA's, not bit-identical.
  MORE_PRECISE = "more precise (epilogue on the f32 accumulator)"
  #: Reductions are reassociated (tile-local partials).
  REASSOCIATED = "reassociated reduction"
  #: Removing the boundary removes a rounding the program asked for (e.g.
  #: an f32 -> bf16 -> f32 round trip): different numbers, by design.
  PRECISION_CHANGE = "precision change (removes a rounding)"


class Verdict(enum.Enum):
  """Outcome of the method's legality test."""

  SAFE = "safe"
  RISKY = "risky"
  KEEP = "keep"


def _axes(axes: tuple[int, ...]) -> str:
  return "{" + ",".join(map(str, axes)) + "}"


@dataclasses.dataclass(frozen=True, slots=True)
class Statistics:
  """What a reduction's statistics cover, read from the HLO: which axes of
  which operand each statistic reduces, and the affine parameters applied
  with them. A norm kernel is the right one only when it computes the same
  statistics (a last-axis layer norm is not a norm over a whole sample)."""

  #: The reduced operand's dims, in the boundary buffer's shape where the
  #: reduce reads it through a reshape (e.g. (16, 64, 128)).
  dims: tuple[int, ...]
  #: The axes of `dims` each statistic reduces, e.g. (1, 2).
  axes: tuple[int, ...]
  #: The scale's (gamma's) dims where one is applied with the statistics
  #: (e.g. (64, 128)); None when none was found.
  affine: tuple[int, ...] | None = None

  @property
  def elements(self) -> int:
    """Elements each statistic reduces."""
    n = 1
    for a in self.axes:
      n *= self.dims[a]
    return n

  @property
  def kept(self) -> tuple[int, ...]:
    """The axes that survive (one statistic per index of these)."""
    return tuple(a for a in range(len(self.dims)) if a not in self.axes)

  @property
  def last_axis(self) -> bool:
    """Whether it reduces the last axis alone (one statistic per row)."""
    return bool(self.dims) and self.axes == (len(self.dims) - 1,)

  @property
  def row(self) -> bool:
    """Row statistics: the last axis alone, with no scale or one of that
    axis's size (what a row kernel computes)."""
    return self.last_axis and self.affine in (None, self.dims[-1:])

  def describe(self) -> str:
    """e.g. "dims {1,2} of [16,64,128] (8192 elements per statistic, affine
    [64,128])"."""
    shape = "[" + ",".join(map(str, self.dims)) + "]"
    affine = (f", affine [{','.join(map(str, self.affine))}]"
              if self.affine is not None else "")
    return (f"dims {_axes(self.axes)} of {shape} ({self.elements} elements per "
            f"statistic{affine})")


@dataclasses.dataclass(frozen=True, slots=True)
class KernelNeed:
  """What a fused kernel must compute to close one finding, library-neutral."""

  kind: FindingKind
  #: The computation the kernel is built around: "dot", "convolution",
  #: "layer_norm", "rms_norm", "softmax", "log_softmax", "batch_norm_stats",
  #: "column_reduction", ...
  anchor: str
  #: The work it fuses around the anchor, e.g. ("bias", "activation:gelu",
  #: "cast:bf16"); for a prologue, the work before the anchor.
  ops: tuple[str, ...] = ()
  #: Outputs the fused kernel writes (several readers transforming one
  #: matmul result each need their own).
  outputs: int = 1
  #: Whether it must read parts (a concatenate's pieces) in place.
  reads_parts: bool = False
  #: For a reduction: the statistics it computes (the kernel must compute
  #: the same: same axes, elements per statistic and affine shape).
  statistics: Statistics | None = None
  #: The kernel that computes the anchor when it is neither the finding's
  #: producer nor its reader (a cross-entropy's logits gemm, for a finding
  #: on the logits' gradient); "" when it is one of them.
  anchor_kernel: str = ""

  def describe(self) -> str:
    """The kernel in words, e.g. "a dot kernel with its epilogue (bias,
    activation:gelu) fused"."""
    work = f" ({', '.join(self.ops)})" if self.ops else ""
    anchor = self.anchor.replace("_", " ")
    if self.kind is FindingKind.UNFUSED_EPILOGUE:
      many = f" writing {self.outputs} outputs" if self.outputs > 1 else ""
      return f"a {anchor} kernel with its epilogue{work} fused{many}"
    if self.kind is FindingKind.UNFUSED_PROLOGUE:
      return f"a {anchor} kernel with its prologue{work} fused"
    if self.kind is FindingKind.LAYOUT_CONFLICT:
      return f"a {anchor} kernel that reads its operand in the original layout"
    if self.reads_parts:
      return f"a {anchor} kernel that reads the parts in place"
    if self.statistics is not None and not self.statistics.row:
      return f"a fused {anchor} kernel over {self.statistics.describe()}"
    return f"a fused {anchor} kernel"


@dataclasses.dataclass(frozen=True, slots=True)
class FusionDecisionRecord:
  """One finding: a boundary XLA left, and what closing it would do."""

  kind: FindingKind
  #: Kernel that writes the boundary buffer ("" when none, e.g. a parameter).
  producer: str
  #: Kernel(s) that read it.
  consumers: tuple[str, ...]
  #: The buffer whose write and read the fusion would remove.
  boundary: str
  #: e.g. "f32[128,512]".
  boundary_shape: str
  #: Logical bytes saved per run: ~2*N*s per removed write/read pair, times
  #: the trip count of enclosing loops.
  bytes_saved: int
  launches_removed: int
  #: Work the fused kernel adds, e.g. "none", "broadcast index math".
  extra_arithmetic: str
  #: Expected extra registers/shared memory, e.g. "one f32 tile of bias".
  extra_resources: str
  numerical_class: NumericalClass
  #: When the fused kernel cannot run, what runs instead.
  guard: str
  #: What the next consumers see, e.g. "none: same layout".
  layout_effect: str
  #: What XLA did, read from the HLO (fusion kinds, library epilogues).
  evidence: str
  verdict: Verdict
  #: Why the verdict: items of the method's safe/risky lists.
  reasons: tuple[str, ...]
  #: Anti-benefit checklist items to check for this fusion.
  risks: tuple[str, ...]
  #: The epilogue or prologue work found, e.g. ("bias", "activation:gelu").
  ops: tuple[str, ...] = ()
  #: The kernel library's op that would close it, e.g. "pallas_kernels.matmul"
  #: (chosen by the installed kernel libraries for `need`).
  kernel: str | None = None
  #: Times the boundary is crossed per run (enclosing loops); None: unknown.
  trip_count: int | None = 1
  source: SourceLocation | None = None
  #: Computation the boundary lives in.
  computation: str = ""
  #: A ready-to-paste call of `kernel` with the finding's shapes and dtypes
  #: ("" when no kernel applies).
  suggestion: str = ""
  #: The op's guard on those shapes: whether the kernel would run, or why it
  #: would fall back to XLA ("" when no kernel applies).
  guard_verdict: str = ""
  #: What other detectors saw at the same boundary (merged into this record:
  #: one buffer, one verdict), e.g. "also read by 3 kernels (keep-reuse)".
  notes: tuple[str, ...] = ()
  #: The stack `source` was chosen from, innermost frame first: the library
  #: frames above the user's line are context (`source.context`).
  source_stack: tuple[SourceLocation, ...] = ()
  #: The layer that made the boundary, from JAX's name stack (`layers.py`),
  #: e.g. "Model/MoE/router", "eqx.nn.MLP/eqx.nn.Linear"; "" where it names
  #: none. Says where inside a library's model the user's line is.
  layer: str = ""
  #: The fusion keeps the boundary buffer in memory (another reader needs
  #: it): traffic goes down, the peak does not.
  boundary_kept: bool = False
  #: The peak after this change alone, from a what-if replay of the liveness
  #: (None: not replayed, e.g. a boundary that is no buffer of the program).
  peak_after: int | None = None
  #: Peak bytes the change saves: the audited peak minus `peak_after`.
  peak_saved: int | None = None
  #: Whether `peak_after` is a full replay's (or provably the audited peak):
  #: False where the audit's replay budget left it the quick estimate, which
  #: keeps the audited buffer assignment (replay.replay_budget).
  peak_exact: bool = True
  #: Estimated seconds per step the change saves on the audited device
  #: (`time_model.time_saved`): negative where it costs time (a remat's
  #: recompute); None where the device is unknown or the model has no price.
  time_saved: float | None = None
  #: What a fused kernel must compute to close the finding (None: no kernel
  #: applies, e.g. a change to the program); kernel libraries answer it with
  #: `kernel`. Not compared: it is the question, `kernel` the answer kept.
  need: KernelNeed | None = dataclasses.field(default=None, compare=False)


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(FusionDecisionRecord))
_RECORD_FIELD_SET = frozenset(_RECORD_FIELDS)


def with_changes(record: FusionDecisionRecord, **changes) -> FusionDecisionRecord:
  """`dataclasses.replace(record, **changes)`, without its per-field checks
  (every field is an init field): an audit copies each record a few times,
  thousands in all, and `replace` took a third more time per copy."""
  if not _RECORD_FIELD_SET.issuperset(changes):
    raise TypeError(f"FusionDecisionRecord has no field(s) "
                    f"{sorted(set(changes) - _RECORD_FIELD_SET)}")
  new = object.__new__(FusionDecisionRecord)
  set_ = object.__setattr__
  for name in _RECORD_FIELDS:
    set_(new, name, changes[name] if name in changes else getattr(record, name))
  return new
