"""What every op tells the rest of the library about itself: its `OpSpec`.

Each op folder's `arg_specs.py` builds one `OpSpec` (or several, for a folder
of several ops), the one description every consumer reads: `validate` and
`bench` (cases, reference, cost model), `swap` and `check_guard` (the public
function), sweeps (parameters and a case at any point) and the audit's
kernel library (which findings the op closes, and the call it suggests).
`registry.py` finds them, so a new op is one folder: its kernels and its spec.

Plain data and callables; no JAX at import.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
  """One concrete call of an op: arrays, keyword options, and tags."""

  #: Short readable id, e.g. "x=bf16[7,129] w=bf16[129,33] gelu+bias".
  name: str
  #: Positional array arguments (already on device, random normal, never zeros).
  args: tuple[Any, ...]
  #: Keyword options of the public op (activation=..., eps=..., ...).
  kwargs: Mapping[str, Any]
  #: Tags that select cases: "ci" (fast, interpret-friendly), "bench" (realistic
  #: sizes), "grad" (also check gradients), "nonfinite" (inputs hold NaN/Inf).
  tags: frozenset[str] = frozenset()
  #: Positions in `args` that gradients are checked for.
  grad_argnums: tuple[int, ...] = ()
  #: A case that exists to exercise a designed fallback names part of the
  #: reason it must record (e.g. "backward: out_dtype"); with kernels required
  #: it passes only if exactly that fallback happened. Empty: none allowed.
  expect_fallback: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Closes:
  """Which of the audit's findings an op closes: the work it fuses."""

  #: Finding classes, by the audit's slugs ("unfused-epilogue", ...).
  kinds: frozenset[str]
  #: Anchor computations it performs ("dot", "layer_norm", ...).
  anchors: frozenset[str]
  #: Epilogue work it fuses after the anchor ("bias", "activation", ...).
  epilogues: frozenset[str] = frozenset()
  #: Prologue work it fuses before the anchor ("dequantize", "cast", ...).
  prologues: frozenset[str] = frozenset()
  #: Activation names its `activation=` takes.
  activations: frozenset[str] = frozenset()
  #: The keyword argument of the op for each epilogue/prologue item (the
  #: tests hold these to the op's signature).
  keywords: tuple[tuple[str, str], ...] = ()
  #: Outputs one call writes.
  outputs: int = 1
  #: Work a need must hold for the op to close it (an optimizer's update:
  #: without it the gemm is an ordinary matmul's); empty: none required.
  requires: frozenset[str] = frozenset()
  #: Whether, differentiated, the forward also stores the anchor's result
  #: (the pre-epilogue product) from which its backward recomputes the
  #: epilogue's derivative: the values XLA's readers write beside the
  #: epilogue's output for the backward pass are then not needed.
  stores_result: bool = False
  #: Whether it reads an operand's parts (a concatenate's pieces) in place.
  reads_parts: bool = False
  #: For reductions: which statistics it computes. "last axis": one
  #: statistic per row of the operand's last axis, affine parameters of that
  #: axis's size (a norm over several axes, or over groups, is another op);
  #: "all but last axis": one statistic per index of the last axis over every
  #: other axis of an operand of rank >= 4 (`channel_statistics`: a batch
  #: norm over channels-last images); "per sample and group": per index of
  #: the first axis, over the middle axes and each group of the last axis's
  #: channels (`group_statistics`: a group or instance norm); "" when it
  #: closes no reduction.
  statistics: str = ""
  #: Anchors it comes close to without computing them, and why not (e.g.
  #: {"log_softmax": "returns probabilities, not logs"}).
  declines: Mapping[str, str] = dataclasses.field(
      default_factory=lambda: types.MappingProxyType({}))


def channel_statistics(stats) -> bool:
  """Whether a reduction's statistics (`hlo_audit.plugins.Statistics`, or
  None) reduce every axis but the last of an operand of rank >= 4: a batch
  norm's over channels-last images (N, H, W, C). The same sum over a rank-2
  or rank-3 operand ([B, D], [B, T, D]) is as often a dense layer's bias
  gradient, which a statistic's axes cannot tell from a batch norm's."""
  if stats is None:
    return False
  rank = len(stats.dims)
  return rank >= 4 and tuple(stats.axes) == tuple(range(rank - 1))


def group_statistics(stats) -> tuple[int, int] | None:
  """(groups, channels) of per-sample statistics (`hlo_audit.plugins.Statistics`,
  or None): an operand [N, ..., G, C/G] reduced over its middle axes and its
  last (a group norm's over channels-last images), or [N, ..., C] over its
  middle axes (an instance norm's: one group a channel); None for any other
  reduction."""
  if stats is None or len(stats.dims) < 3 or 0 in stats.axes:
    return None
  dims, rank = tuple(int(d) for d in stats.dims), len(stats.dims)
  kept = [i for i in range(1, rank) if i not in stats.axes]
  if kept == [rank - 2] and rank - 1 in stats.axes:
    return dims[-2], dims[-2] * dims[-1]
  if kept == [rank - 1]:
    return dims[-1], dims[-1]
  return None


@dataclasses.dataclass(frozen=True, slots=True)
class SweepParam:
  """One parameter a sweep's grid may set for the op."""

  name: str
  #: "int", "float", "bool", "str" or "dtype".
  kind: str
  default: Any
  #: Whether `none` is a valid value.
  optional: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class CallFacts:
  """What the audit read of one finding, for an op to write its call."""

  #: The finding's class slug, e.g. "unfused-epilogue".
  kind: str
  #: The fused work, e.g. ("bias", "activation:gelu").
  ops: tuple[str, ...]
  #: The boundary buffer: `.dtype` (XLA's name, "f32") and `.dims`.
  boundary: Any
  #: The boundary's shape as the report prints it, e.g. "f32[128,512]".
  shape: str
  #: The matmul the boundary is written by (epilogue) or read by (prologue):
  #: `.lhs`, `.rhs` (arrays), `.result`, `.lhs_contracting`,
  #: `.rhs_contracting`, `.lhs_batch`, `.rhs_batch`; None when none.
  matmul: Any = None
  #: The arrays the boundary's producer reads (a prologue's sources).
  sources: tuple[Any, ...] = ()
  #: The convolution the boundary is written or read by (or that reads it
  #: beside a reduction: a weight gradient's dy), as x (*) w -> y:
  #: `.role`, `.input` (NHWC), `.kernel` (HWIO), `.output`, `.stride`,
  #: `.padding`, `.dilation`, `.input_dilation`, `.groups`; None when none.
  convolution: Any = None
  #: A prologue's pad: (its operand, (low, high) per dimension); None when
  #: the producer pads nothing (or not in one plain pad).
  pad: Any = None
  #: The statistics of the finding's reduction (`plugins.Statistics`: the
  #: reduced operand's `.dims`, the `.axes` reduced); None when it has none.
  statistics: Any = None
  #: The module's norm epsilon, when it has exactly one (asked lazily).
  epsilon: Callable[[], float | None] = lambda: None
  #: An XLA element type's numpy name ("bf16" -> "bfloat16").
  numpy_name: Callable[[str], str] = lambda name: name


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
  """A suggested call of an op: arrays (name, dtype, dims, positional) and
  other keyword arguments (name, source text, value for the guard)."""

  op: str
  arrays: tuple[tuple[str, str, tuple[int, ...], bool], ...]
  options: tuple[tuple[str, str, object], ...]
  #: The result, e.g. "f32[8,32]".
  result: str

  def text(self, library: str = "pallas_kernels") -> str:
    """"pallas_kernels.matmul(x, w, bias=bias)  # x: f32[8,16], ... -> f32[8,32]"."""
    args = [name if positional else f"{name}={name}"
            for name, _, _, positional in self.arrays]
    args += [f"{k}={text}" for k, text, _ in self.options]
    shapes = ", ".join(f"{name}: {dt}[{','.join(map(str, dims))}]"
                       for name, dt, dims, _ in self.arrays)
    return f"{library}.{self.op}({', '.join(args)})  # {shapes} -> {self.result}"


@dataclasses.dataclass(frozen=True, slots=True)
class OpSpec:
  """An op as validation and benchmarking see it."""

  #: Public name in `pallas_kernels`, e.g. "matmul".
  name: str
  #: Calls the op: fn(*args, implementation=..., **kwargs), where
  #: implementation is "pallas" or "xla" (the reference).
  fn: Callable[..., Any]
  #: The reference at float32 and Precision.HIGHEST: the ground truth.
  reference_f32: Callable[..., Any]
  #: Yields cases for a tag, deterministically from the integer seed.
  cases: Callable[[str, int], Iterator[Case]]
  #: Logical bytes the op must read and write for a case (for GB/s and roofline).
  bytes_moved: Callable[[Case], int]
  #: Floating-point operations for a case (for TFLOP/s).
  flops: Callable[[Case], int]
  #: What `bench` times the kernel against: the same user-level computation as
  #: XLA gets it from plain jnp (fn(*args, **kwargs)); None: `fn` with
  #: implementation="xla", when that already is what a user would write.
  baseline: Callable[..., Any] | None = None
  #: The public function, `pallas_kernels.<name>` (swap and guard checks call it).
  api: Callable[..., Any] | None = None
  #: The findings it closes (None: it closes none); a tuple where it closes
  #: findings of different families (a reduction beside its anchor, and an
  #: update that requires work the other does not), each its own `Closes`.
  closes: Closes | tuple[Closes, ...] | None = None
  #: What a sweep's grid may set.
  sweep_params: tuple[SweepParam, ...] = ()
  #: The case at one sweep point: make_case(seed=, tags=, grad=, **params).
  make_case: Callable[..., Case] | None = None
  #: The call closing a finding, from what the audit read (None: no call).
  suggest: Callable[[CallFacts], Call | None] | None = None

  def closings(self) -> tuple[Closes, ...]:
    """`closes` as a tuple: each family of findings the op closes (empty
    when it closes none)."""
    if self.closes is None:
      return ()
    return self.closes if isinstance(self.closes, tuple) else (self.closes,)
