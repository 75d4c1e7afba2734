"""adam_matmul's `SPEC`: cases for `validate`, `bench` and the tests, its cost
model, sweep parameters, and the audit findings it closes with the call it
suggests (`spec.py`).

Positional arguments of a case are (x, dy, param, mu, nu, count); the
learning rate, Adam's constants, transpose_x and config are keywords. Shapes
include 1, primes and sizes that are not multiples of any block. The moments
are drawn as a run of Adam would hold them (mu ~ 0.1 N(0, 1), nu ~ 0.01
|N(0, 1)|, positive), x and dy as standard normal; the learning rate is large
enough (1e-2) that the update shows in param' at float32's tolerance.

Tolerances are `tolerances.py`'s for each output's dtype (1e-5 relative
error norm for float32 state), with no entry of the op's own: mu' and nu'
carry the gradient's f32 summation error (~1e-7); param' moves by
learning_rate * u with |u| about 1 or less, so a wrong term of the update
(1e-3 relative or more at these learning rates and weight decays) fails it by
two orders, while u's division by sqrt(nu_hat) + eps amplifies the
gradient's rounding only where |g| is near eps (an element's sign at a fresh
state), which random gradients of these sizes do not reach.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.adam_matmul import reference
from pallas_kernels._src.ops.adam_matmul.api import adam_matmul
from pallas_kernels._src.ops.adam_matmul.config import Config
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

_POSITIONAL = ("x", "dy", "param", "mu", "nu", "count")
#: Keywords that steer the implementation, not the math.
_IMPL_KEYWORDS = ("implementation", "interpret", "config")
#: Small blocks: a ragged multi-tile grid and several M steps on CI shapes.
SMALL = Config(block_k=32, block_n=64, block_m=32)
#: The learning rate of the cases.
LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  m: int
  k: int
  n: int
  dtype: str = "float32"
  state_dtype: str = "float32"
  count: int = 0
  weight_decay: float = 0.0
  eps_root: float = 0.0
  transpose_x: bool = True
  #: The state optax's `init` gives: mu = nu = 0 (the first step's update
  #: is then about sign(g) * learning_rate).
  fresh: bool = False
  config: Config | None = None
  tags: frozenset[str] = frozenset({"ci"})

  @property
  def name(self) -> str:
    x_shape = (self.m, self.k) if self.transpose_x else (self.k, self.m)
    parts = [inputs.describe("x", x_shape, self.dtype),
             inputs.describe("dy", (self.m, self.n), self.dtype),
             inputs.describe("param", (self.k, self.n), self.state_dtype),
             f"count={self.count}"]
    if self.weight_decay:
      parts.append(f"wd={self.weight_decay:g}")
    if self.eps_root:
      parts.append(f"eps_root={self.eps_root:g}")
    if not self.transpose_x:
      parts.append("x@dy")
    if self.fresh:
      parts.append("mu=nu=0")
    if self.config is not None:
      c = self.config
      parts.append(f"blocks:{c.block_k}x{c.block_n}x{c.block_m}")
    return " ".join(parts)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "adam_matmul " + d.name)
  x_shape = (d.m, d.k) if d.transpose_x else (d.k, d.m)
  x = inputs.normal(keys.next(), x_shape, d.dtype)
  dy = inputs.normal(keys.next(), (d.m, d.n), d.dtype)
  wn = (d.k, d.n)
  param = inputs.normal(keys.next(), wn, d.state_dtype)
  mu = (0.1 * jax.random.normal(keys.next(), wn, jnp.float32)).astype(d.state_dtype)
  nu = (0.01 * jnp.abs(jax.random.normal(keys.next(), wn, jnp.float32))).astype(d.state_dtype)
  if d.fresh:
    mu, nu = jnp.zeros(wn, d.state_dtype), jnp.zeros(wn, d.state_dtype)
  count = jnp.asarray(d.count, jnp.int32)
  kwargs: dict[str, Any] = {"learning_rate": LEARNING_RATE}
  if d.weight_decay:
    kwargs["weight_decay"] = d.weight_decay
  if d.eps_root:
    kwargs["eps_root"] = d.eps_root
  if not d.transpose_x:
    kwargs["transpose_x"] = False
  if d.config is not None:
    kwargs["config"] = d.config
  return Case(name=d.name, args=(x, dy, param, mu, nu, count), kwargs=kwargs, tags=d.tags)


_BENCH = frozenset({"bench"})

CASE_DEFS: tuple[CaseDef, ...] = (
    CaseDef(1, 1, 1),
    # Ragged M, K and N against the blocks: a 3x5 grid, three M steps.
    CaseDef(70, 77, 300, config=SMALL),
    CaseDef(70, 77, 300, count=7, weight_decay=0.1, config=SMALL),
    CaseDef(64, 96, 128, fresh=True, config=SMALL),
    # A bf16 head's dW, cast to f32 for f32 state.
    CaseDef(45, 33, 70, "bfloat16", count=7, config=SMALL),
    CaseDef(29, 40, 24, "float16", eps_root=1e-8),
    CaseDef(37, 19, 48, "bfloat16", "bfloat16", count=3, weight_decay=1e-2),
    CaseDef(41, 23, 36, count=1, transpose_x=False),
    # A 4096-token batch through a 1024 x 1024 dense layer.
    CaseDef(4096, 1024, 1024, tags=_BENCH),
    CaseDef(4096, 1024, 1024, "bfloat16", count=7, weight_decay=1e-4, tags=_BENCH),
)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def _split(args: tuple[Any, ...]) -> tuple[Any, ...]:
  if len(args) != len(_POSITIONAL):
    raise TypeError(f"adam_matmul case takes {len(_POSITIONAL)} positional arrays "
                    f"{_POSITIONAL}, got {len(args)}")
  return args


def call(*args: Any, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `adam_matmul` with positional (x, dy, param, mu, nu, count)."""
  return adam_matmul(*_split(args), implementation=implementation, **kwargs)


def reference_f32(*args: Any, **kwargs: Any):
  """`OpSpec.reference_f32`: float32 operands at Precision.HIGHEST, no final cast."""
  options = {k: v for k, v in kwargs.items() if k not in _IMPL_KEYWORDS}
  return reference.adam_matmul_f32(*_split(args), **options)


def xla_baseline(*args: Any, **kwargs: Any):
  """`OpSpec.baseline`: the step as a user's code gives it to XLA: the weight
  gradient in the operands' dtype (cast to f32), then the update."""
  options = {k: v for k, v in kwargs.items() if k not in _IMPL_KEYWORDS}
  return reference.user_step(*_split(args), **options)


def _nbytes(a: Any) -> int:
  return math.prod(a.shape) * jnp.dtype(a.dtype).itemsize


def bytes_moved(case: Case) -> int:
  """x and dy read once, param, mu and nu read and written once each."""
  x, dy, param, mu, nu, _ = case.args
  return int(_nbytes(x) + _nbytes(dy) + 2 * (_nbytes(param) + _nbytes(mu) + _nbytes(nu)))


def flops(case: Case) -> int:
  """The gradient's 2 * M * K * N (the update's O(K * N) left out)."""
  x, dy = case.args[0], case.args[1]
  return int(2 * math.prod(x.shape) * dy.shape[1])


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, m: int, k: int, n: int,
              dtype: str = "float32", state_dtype: str = "float32", count: int = 0,
              weight_decay: float = 0.0) -> Case:
  """The case at one sweep point (no gradients: it is an optimizer step)."""
  del grad
  d = CaseDef(m=m, k=k, n=n, dtype=dtype, state_dtype=state_dtype, count=count,
              weight_decay=weight_decay, tags=frozenset(tags))
  return build_case(d, seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("m", "int", 4096), SweepParam("k", "int", 1024), SweepParam("n", "int", 1024),
    SweepParam("dtype", "dtype", "float32"), SweepParam("state_dtype", "dtype", "float32"),
    SweepParam("count", "int", 0), SweepParam("weight_decay", "float", 0.0))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    kinds=frozenset({"unfused-epilogue"}), anchors=frozenset({"dot"}),
    epilogues=frozenset({"adam", "cast"}),
    keywords=(("adam", "learning_rate"),),
    outputs=3,
    # Only an optimizer's update makes the gemm this op's: a cast alone is
    # the matmul's.
    requires=frozenset({"adam"}))


def _operands(facts: CallFacts):
  """(x, dy, transpose_x) of the gemm whose [K, N] result is the boundary,
  or None where the anchor does not read as a weight gradient."""
  anchor = facts.matmul
  lhs, rhs = anchor.lhs, anchor.rhs
  if len(lhs.dims) != 2 or len(rhs.dims) != 2 or anchor.lhs_batch or anchor.rhs_batch:
    return None
  boundary = tuple(int(d) for d in facts.boundary.dims)
  result = tuple(int(d) for d in (anchor.result or ()))
  (a0, a1), (b0, b1) = (tuple(int(d) for d in spec.dims) for spec in (lhs, rhs))
  if anchor.lhs_contracting is None:
    # A library call: operands 0 and 1 read as [M, K] x [K, N] too, so only
    # shapes that fit nothing but x^T @ dy (no square x) are read as it.
    if a0 == b0 and (a1, b1) == boundary and result in ((), boundary) and \
        not (a1 == b0 and a0 == a1):
      return lhs, rhs, True
    return None
  lc, rc = tuple(anchor.lhs_contracting), tuple(anchor.rhs_contracting)
  if lc == (0,) and rc == (0,) and a0 == b0:
    if boundary == (a1, b1) and result in ((), boundary):
      return lhs, rhs, True
    if boundary == (b1, a1) and result == (a1, b1):
      # The gemm's kernel stores its result transposed (a weight kept
      # [out, in]): that is rhs^T @ lhs.
      return rhs, lhs, True
  if lc == (1,) and rc == (0,) and a1 == b0 and boundary == (a0, b1) and \
      result in ((), boundary):
    return lhs, rhs, False  # x stored [K, M]
  return None


def suggest(facts: CallFacts) -> Call | None:
  """`adam_matmul(x, dy, param, mu, nu, count, learning_rate=learning_rate)`
  from the weight-gradient gemm the audit read: a dot contracting the
  leading (token) axis of both 2-D operands into the [K, N] boundary (the
  gradient; its operands swapped where the gemm stores the result
  transposed), x stored [K, M] (`transpose_x=False`), or a library call
  whose operands share their leading axis. None for any other layout (batch
  dims, dy contracted on its last axis): no shapes are guessed."""
  if facts.matmul is None or "adam" not in facts.ops:
    return None
  found = _operands(facts)
  if found is None:
    return None
  x, dy, transpose_x = found
  k, n = (int(d) for d in facts.boundary.dims)
  # The state's dtype: the one the gradient is cast to for the update (a
  # bf16 head's dW), else the gradient's own.
  state = facts.boundary.dtype
  for item in facts.ops:
    base, _, arg = item.partition(":")
    if base == "cast" and arg:
      state = arg
  arrays = (("x", x.dtype, tuple(int(d) for d in x.dims), True),
            ("dy", dy.dtype, tuple(int(d) for d in dy.dims), True),
            ("param", state, (k, n), True), ("mu", state, (k, n), True),
            ("nu", state, (k, n), True), ("count", "s32", (), True))
  options = [("learning_rate", "learning_rate", 1e-3)]
  if not transpose_x:
    options.append(("transpose_x", "False", False))
  shape = f"{state}[{k},{n}]"
  return Call("adam_matmul", arrays, tuple(options), f"({shape}, {shape}, {shape})")


SPEC = OpSpec(
    name="adam_matmul",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    baseline=xla_baseline,
    api=adam_matmul,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
