"""group_norm's `SPEC`: cases for `validate`, `bench` and the tests, its cost
model, and the audit findings it closes with the call it suggests (`spec.py`).

Positional arguments of a case are (x, scale, bias); groups, epsilon,
activation and config are keywords. CI shapes are ragged against SMALL's
tiles: rows past whole 16-row tiles, and windows of whole groups that leave
part of the 8-channel tile empty (3 channels a group: 2 groups, 6 channels)
or hold fewer groups in the last window than in the others.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.group_norm import reference
from pallas_kernels._src.ops.group_norm.api import group_norm
from pallas_kernels._src.ops.group_norm.config import MAX_BLOCK_C, Config
from pallas_kernels._src.spec import (Call, CallFacts, Case, Closes, OpSpec, SweepParam,
                                      group_statistics)

#: Ragged on CI shapes: 16-row tiles, windows of up to 8 channels.
SMALL = Config(block_m=16, block_c=8)
_CI = frozenset({"ci"})
_CI_GRAD = frozenset({"ci", "grad"})
_BENCH = frozenset({"bench"})


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  x: tuple[int, ...]
  groups: int
  dtype: str = "float32"
  activation: str | None = None
  epsilon: float | None = None
  config: Config | None = None
  tags: frozenset[str] = _CI
  expect_fallback: str = ""

  @property
  def name(self) -> str:
    parts = [inputs.describe("x", self.x, self.dtype), f"groups={self.groups}"]
    if self.activation:
      parts.append(self.activation)
    if self.epsilon is not None:
      parts.append(f"epsilon={self.epsilon:g}")
    if self.config is not None:
      parts.append(f"blocks:{self.config.block_m}x{self.config.block_c}")
    return " ".join(parts)


CASE_DEFS: tuple[CaseDef, ...] = (
    # 35 rows a sample; 3 groups of 4 channels: windows of 2 groups, then 1.
    CaseDef((2, 5, 7, 12), 3, config=SMALL, tags=_CI_GRAD),
    # 4 groups of 3 channels: 6 of each 8-channel tile used.
    CaseDef((2, 5, 7, 12), 4, "bfloat16", activation="silu", config=SMALL, tags=_CI_GRAD),
    # Rank 3, another epsilon, the default (interpret) blocks.
    CaseDef((3, 9, 20), 5, activation="relu", epsilon=1e-5),
    CaseDef((2, 3, 4, 8), 2, "float16", activation="gelu", config=SMALL),
    # Rank 2: each group's statistics over its channels alone; an instance
    # norm (groups = C) over rank 4.
    CaseDef((4, 24), 6, activation="hard_swish", tags=_CI_GRAD),
    CaseDef((2, 3, 5, 6), 6, config=SMALL),
    # A group wider than the widest tile: XLA runs, and says so.
    CaseDef((2, 2, 2 * MAX_BLOCK_C + 8), 2,
            expect_fallback=f"a group of {MAX_BLOCK_C + 4} channels"),
    # A diffusion UNet's 320 channels in 32 groups, and the audited flax CNN's.
    CaseDef((8, 64, 64, 320), 32, "bfloat16", activation="silu",
            tags=frozenset({"bench", "grad"})),
    CaseDef((8, 32, 32, 32), 8, activation="silu", tags=_BENCH),
)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "group_norm " + d.name)
  c = d.x[-1]
  x = inputs.normal(keys.next(), d.x, d.dtype)
  scale = inputs.normal(keys.next(), (c,), d.dtype)
  bias = inputs.normal(keys.next(), (c,), d.dtype)
  kwargs: dict[str, Any] = {"groups": d.groups}
  if d.activation:
    kwargs["activation"] = d.activation
  if d.epsilon is not None:
    kwargs["epsilon"] = d.epsilon
  if d.config is not None:
    kwargs["config"] = d.config
  return Case(name=d.name, args=(x, scale, bias), kwargs=kwargs, tags=d.tags,
              grad_argnums=(0, 1, 2) if "grad" in d.tags else (),
              expect_fallback=d.expect_fallback)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def call(x, scale, bias, *, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `group_norm` with positional (x, scale, bias)."""
  return group_norm(x, scale, bias, implementation=implementation, **kwargs)


def reference_f32(x, scale, bias, **kwargs: Any):
  """`OpSpec.reference_f32`: y left in float32."""
  kwargs.pop("config", None)
  return reference.group_norm_f32(x, scale, bias, **kwargs)


def bytes_moved(case: Case) -> int:
  """x read once, y written once (the statistics' first read of x left
  out), and the [C] vectors."""
  x, scale, bias = case.args
  return int(2 * x.size * x.dtype.itemsize + scale.size * scale.dtype.itemsize
             + bias.size * bias.dtype.itemsize)


def flops(case: Case) -> int:
  """~9 per element: the two sums, then subtract, scale, shift, activate."""
  return int(9 * math.prod(case.args[0].shape))


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, n: int, h: int, w: int, c: int,
              groups: int, dtype: str = "float32", activation: str | None = None) -> Case:
  """The case at one sweep point: NHWC x [n, h, w, c] in `groups` groups."""
  tags = frozenset(tags) | ({"grad"} if grad else set())
  return build_case(CaseDef((n, h, w, c), groups, dtype, activation=activation, tags=tags),
                    seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("n", "int", 8), SweepParam("h", "int", 32), SweepParam("w", "int", 32),
    SweepParam("c", "int", 32), SweepParam("groups", "int", 8),
    SweepParam("dtype", "dtype", "float32"),
    SweepParam("activation", "str", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    # Its statistics, which XLA sums in kernels of their own re-reading the
    # normalized input, and its backward's scale and shift gradients, column
    # sums of a dy XLA wrote: the backward kernel recomputes dy where it
    # reads the cotangent and sums them beside dx.
    kinds=frozenset({"separate-reduction"}),
    anchors=frozenset({"group_norm_stats", "group_norm_backward"}),
    activations=frozenset(reference.ACTIVATIONS),
    keywords=(("activation", "activation"),),
    statistics="per sample and group")


def suggest(facts: CallFacts) -> Call | None:
  """`group_norm(x, scale, bias, groups=...)` over the normalized image.

  For the statistics, x is the summed operand with the groups' axes merged
  back into the channels (XLA:CPU sums [N, H, W, G, C/G]) and groups is read
  off the statistics. The backward's scale and shift gradients are column
  sums over [N, H, W, C], which cannot tell the groups: `groups=GROUPS` is
  left for the caller to write (the guard is asked with one group a channel,
  which every C takes). The module's norm epsilon is written when it has
  exactly one, else `EPS`."""
  if facts.kind != "separate-reduction":
    return None
  dims = tuple(int(d) for d in facts.boundary.dims)
  if "group_norm_stats" in facts.ops:
    found = group_statistics(facts.statistics)
    if found is None:
      return None
    groups, c = found
    if dims[-1] != c and dims[-2:] == (groups, c // groups):
      dims = dims[:-2] + (c,)
    options: list[tuple[str, str, object]] = [("groups", str(groups), groups)]
  else:
    c = dims[-1]
    options = [("groups", "GROUPS", c)]
  if len(dims) < 2 or dims[-1] != c or (facts.statistics is not None
                                         and dims[0] != int(facts.statistics.dims[0])):
    return None
  eps = facts.epsilon()
  # None: no epsilon, or several: never print a guess as a fact.
  options.append(("epsilon", "EPS", 1e-6) if eps is None else ("epsilon", repr(eps), eps))
  dt = facts.boundary.dtype
  arrays = (("x", dt, dims, True), ("scale", dt, (c,), True), ("bias", dt, (c,), True))
  return Call("group_norm", arrays, tuple(options), f"{dt}[{','.join(map(str, dims))}]")


SPEC = OpSpec(
    name="group_norm",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    api=group_norm,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
