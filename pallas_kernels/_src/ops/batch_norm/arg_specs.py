"""batch_norm's `SPEC`: cases for `validate`, `bench` and the tests, its cost
model, and the audit finding it closes with the call it suggests (`spec.py`).

Positional arguments of a case are (x, gamma, beta); eps, activation and
config are keywords. CI shapes are ragged against SMALL's blocks (rows and
channels), with two splits so that the partials' combine runs. The relu6
case pins channel 0 at gamma 0, beta 6: every pre-activation of that channel
is exactly 6, where relu6's derivative is 0 (jax.nn's), so a mask off by one
comparison moves beta's gradient.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.batch_norm import reference
from pallas_kernels._src.ops.batch_norm.api import batch_norm
from pallas_kernels._src.ops.batch_norm.config import Config
from pallas_kernels._src.spec import (Call, CallFacts, Case, Closes, OpSpec, SweepParam,
                                      channel_statistics)

#: Ragged on CI shapes: 16-row tiles, 8-channel tiles, two splits.
SMALL = Config(block_m=16, block_c=8, splits=2)
_CI = frozenset({"ci"})
_CI_GRAD = frozenset({"ci", "grad"})
_BENCH = frozenset({"bench"})


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  x: tuple[int, ...]
  dtype: str = "float32"
  activation: str | None = None
  eps: float | None = None
  config: Config | None = None
  tags: frozenset[str] = _CI
  #: Pin channel 0 at gamma 0, beta 6 (relu6's upper edge).
  edge: bool = False
  expect_fallback: str = ""

  @property
  def name(self) -> str:
    parts = [inputs.describe("x", self.x, self.dtype)]
    if self.activation:
      parts.append(self.activation)
    if self.eps is not None:
      parts.append(f"eps={self.eps:g}")
    if self.edge:
      parts.append("edge:6")
    if self.config is not None:
      c = self.config
      parts.append(f"blocks:{c.block_m}x{c.block_c}/{c.splits}")
    return " ".join(parts)


CASE_DEFS: tuple[CaseDef, ...] = (
    CaseDef((2, 5, 7, 12), config=SMALL, tags=_CI_GRAD),
    CaseDef((2, 5, 7, 12), "bfloat16", activation="relu6", edge=True, config=SMALL,
            tags=_CI_GRAD),
    # Rank 3, flax's eps, the default (interpret) blocks.
    CaseDef((3, 9, 20), activation="relu", eps=1e-5),
    CaseDef((2, 3, 4, 8), "float16", activation="hard_swish", config=SMALL),
    # Rank 1 has nothing to take batch statistics over: XLA runs, and says so.
    CaseDef((12,), expect_fallback="x float32[12] has no axis before the channels"),
    # MobileNetV3 (batch 64, 56x56, 72 channels), and keras' batch of 8.
    CaseDef((64, 56, 56, 72), "bfloat16", activation="relu6",
            tags=frozenset({"bench", "grad"})),
    CaseDef((8, 16, 16, 72), activation="relu6", tags=_BENCH),
)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "batch_norm " + d.name)
  c = d.x[-1]
  x = inputs.normal(keys.next(), d.x, d.dtype)
  gamma = inputs.normal(keys.next(), (c,), d.dtype)
  beta = inputs.normal(keys.next(), (c,), d.dtype)
  if d.edge:
    gamma, beta = gamma.at[0].set(0), beta.at[0].set(6)
  kwargs: dict[str, Any] = {}
  if d.activation:
    kwargs["activation"] = d.activation
  if d.eps is not None:
    kwargs["eps"] = d.eps
  if d.config is not None:
    kwargs["config"] = d.config
  return Case(name=d.name, args=(x, gamma, beta), kwargs=kwargs, tags=d.tags,
              grad_argnums=(0, 1, 2) if "grad" in d.tags else (),
              expect_fallback=d.expect_fallback)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def call(x, gamma, beta, *, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `batch_norm` with positional (x, gamma, beta)."""
  return batch_norm(x, gamma, beta, implementation=implementation, **kwargs)


def reference_f32(x, gamma, beta, **kwargs: Any):
  """`OpSpec.reference_f32`: y left in float32."""
  kwargs.pop("config", None)
  return reference.batch_norm_f32(x, gamma, beta, **kwargs)


def bytes_moved(case: Case) -> int:
  """x read once, y written once (the statistics' second read of x left
  out), and the [C] vectors."""
  x, gamma, beta = case.args
  return int(2 * x.size * x.dtype.itemsize + gamma.size * gamma.dtype.itemsize
             + beta.size * beta.dtype.itemsize + 2 * 4 * x.shape[-1])


def flops(case: Case) -> int:
  """~9 per element: the two sums, then subtract, scale, shift, activate."""
  return int(9 * math.prod(case.args[0].shape))


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, n: int, h: int, w: int, c: int,
              dtype: str = "float32", activation: str | None = None) -> Case:
  """The case at one sweep point: NHWC x [n, h, w, c]."""
  tags = frozenset(tags) | ({"grad"} if grad else set())
  return build_case(CaseDef((n, h, w, c), dtype, activation=activation, tags=tags), seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("n", "int", 8), SweepParam("h", "int", 16), SweepParam("w", "int", 16),
    SweepParam("c", "int", 72), SweepParam("dtype", "dtype", "float32"),
    SweepParam("activation", "str", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    # The backward's column sums sum(dy) and sum(dy * x_hat) over N, H, W
    # that XLA reads from a dy it wrote: the kernel recomputes dy where it
    # reads the cotangent and sums both there.
    kinds=frozenset({"separate-reduction"}),
    anchors=frozenset({"column_reduction"}),
    activations=frozenset(reference.ACTIVATIONS),
    keywords=(("activation", "activation"),),
    statistics="all but last axis")


def suggest(facts: CallFacts) -> Call | None:
  """`batch_norm(x, gamma, beta)` over the summed operand's shape, for a
  column sum over every axis but the last of a rank >= 4 operand (a batch
  norm's backward over channels-last images, `spec.channel_statistics`);
  None for any other reduction (a [B, D] or [B, T, D] column sum is as often
  a dense layer's bias gradient, another op's). The module's norm epsilon is
  written when it has exactly one."""
  stats = facts.statistics
  if facts.kind != "separate-reduction" or not channel_statistics(stats):
    return None
  dims = tuple(int(d) for d in stats.dims)
  dt, c = facts.boundary.dtype, dims[-1]
  arrays = (("x", dt, dims, True), ("gamma", dt, (c,), True), ("beta", dt, (c,), True))
  options: tuple[tuple[str, str, object], ...] = ()
  eps = facts.epsilon()
  if eps is not None:
    options = (("eps", repr(eps), eps),)
  shape = f"{dt}[{','.join(map(str, dims))}]"
  return Call("batch_norm", arrays, options, f"({shape}, f32[{c}], f32[{c}])")


SPEC = OpSpec(
    name="batch_norm",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    api=batch_norm,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
