"""What a capture holds: the optimized module, XLA's reports about it, and
where it came from (`Capture`, `MemoryStats`), whichever route made it (a JAX
compile, HLO text, a dump folder)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from hlo_audit._src.hlo.ir import HloModule
from hlo_audit._src.hlo.xla_reports import BufferAssignment, LiveRange
from hlo_audit._src.target.target import Target


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryStats:
  """XLA's `memory_analysis()` of a compiled executable, in bytes."""

  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int
  #: XLA's peak memory estimate (None when this jaxlib does not report it).
  peak_bytes: int | None = None
  host_argument_bytes: int = 0
  host_output_bytes: int = 0
  host_temp_bytes: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Capture:
  """Everything captured about one compiled module."""

  #: The optimized HLO, parsed.
  module: HloModule
  #: The optimized HLO text.
  hlo_text: str
  #: HLO before XLA's optimizations: text, or a function making it on first
  #: use (`pre_optimization_text`; converting a large module costs a few
  #: percent of its compile, and most audits never read it).
  pre_optimization: str | Callable[[], str | None] | None = dataclasses.field(
      default=None, repr=False, compare=False)
  #: "cpu", "gpu", "tpu", or "" when unknown (e.g. a bare text file).
  platform: str = ""
  #: e.g. "NVIDIA H200", "TPU v5 lite", "cpu".
  device_kind: str = ""
  jax_version: str = ""
  jaxlib_version: str = ""
  #: The libtpu that compiled it (XLA:TPU compiles here); "" otherwise, and
  #: for HLO text and dumps, which do not say.
  libtpu_version: str = ""
  #: XLA's cost analysis ("flops", "bytes accessed", ...).
  cost_analysis: Mapping[str, float] | None = None
  memory_stats: MemoryStats | None = None
  #: XLA's buffer assignment (read it as `buffer_assignment`): a
  #: `BufferAssignment`, or a function making it on first read. From an
  #: executable it is made lazily: naming its values takes the executable's
  #: whole module proto (a tenth of a second for a 30k-instruction module),
  #: and an audit reads only `xla_allocated_bytes`.
  xla_buffer_assignment: (BufferAssignment | Callable[[], BufferAssignment | None]
                          | None) = dataclasses.field(default=None, repr=False,
                                                      compare=False)
  #: The bytes of XLA's allocations, thread-local scratch excluded (what
  #: "XLA's peak" sums), when its buffer assignment is known.
  xla_allocated_bytes: int | None = None
  #: XLA's live ranges, when XLA dumped them.
  live_range: LiveRange | None = None
  #: XLA's memory usage report, as text.
  memory_usage_report: str | None = None
  #: Where XLA's buffer assignment came from: "buffer-assignment proto" (the
  #: compiled executable's, no recompile), "dump reports" (XLA's text
  #: reports), or "" when there is none (then "XLA's peak" comes from
  #: `memory_analysis()`, when there is one).
  xla_memory_source: str = ""
  #: Where it came from: "jit", "lowered", "compiled", "dump" or "text".
  origin: str = ""
  #: File the HLO text was read from, for dumps and text files.
  path: str | None = None
  #: Why some of the above is missing, for reports to say.
  notes: tuple[str, ...] = ()
  #: The device compiled for when it is not this machine's (`capture(...,
  #: target=)`); None: the default backend's.
  target: Target | None = None
  #: The jitted function's positional parameter names, by argument number
  #: ("*args" for a var-positional one), to turn the argument paths JAX writes
  #: in parameters' metadata into `donate_argnums`; () when unknown.
  argument_names: tuple[str, ...] = ()

  def __post_init__(self):
    assignment = self.xla_buffer_assignment
    if self.xla_allocated_bytes is None and isinstance(assignment, BufferAssignment):
      object.__setattr__(self, "xla_allocated_bytes", assignment.allocated_bytes())

  @property
  def name(self) -> str:
    return self.module.name

  @property
  def pre_optimization_text(self) -> str | None:
    """HLO before XLA's optimizations, when known."""
    pre = self.pre_optimization
    if callable(pre):
      try:
        pre = pre()
      except Exception:  # noqa: BLE001 - older JAX spells it differently
        pre = None
      object.__setattr__(self, "pre_optimization", pre)
    return pre

  @property
  def buffer_assignment(self) -> BufferAssignment | None:
    """XLA's buffer assignment, when the executable or a dump provides it."""
    assignment = self.xla_buffer_assignment
    if callable(assignment):
      assignment = assignment()
      object.__setattr__(self, "xla_buffer_assignment", assignment)
    return assignment

  def memory_analysis(self) -> MemoryStats | None:
    """XLA's memory analysis (`peak_bytes` is its peak estimate)."""
    return self.memory_stats
