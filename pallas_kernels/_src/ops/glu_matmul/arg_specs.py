"""glu_matmul's `SPEC`: cases for `validate`, `bench` and the tests, its cost
model, sweep parameters, and the audit findings it closes with the call it
suggests (`spec.py`).

Positional arguments of a case are a prefix of (x, w_gate, w_up, bias_gate,
bias_up), the differentiable arrays; activation, out_dtype and config are
keywords. Shapes include 1, primes and sizes that are not multiples of any
block; weights are scaled by 1/sqrt(K) so that the products stay O(1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import inputs
from pallas_kernels._src.ops.glu_matmul import reference
from pallas_kernels._src.ops.glu_matmul.api import glu_matmul
from pallas_kernels._src.ops.glu_matmul.config import Config
from pallas_kernels._src.spec import Call, CallFacts, Case, Closes, OpSpec, SweepParam

_POSITIONAL = ("x", "w_gate", "w_up", "bias_gate", "bias_up")
#: Keywords that steer the implementation, not the math.
_IMPL_KEYWORDS = ("implementation", "interpret", "config")
#: Small blocks: a ragged multi-tile grid and several K steps on CI shapes.
SMALL = Config(block_m=32, block_n=64, block_k=32)


@dataclasses.dataclass(frozen=True, slots=True)
class CaseDef:
  """A case before its arrays exist."""

  m: int
  k: int
  f: int
  dtype: str = "float32"
  batch: tuple[int, ...] = ()
  activation: str = "silu"
  #: None, "gate" (bias_gate only) or "both".
  bias: str | None = None
  out_dtype: str | None = None
  config: Config | None = None
  tags: frozenset[str] = frozenset({"ci"})
  grad: bool = False

  @property
  def name(self) -> str:
    parts = [inputs.describe("x", self.batch + (self.m, self.k), self.dtype),
             inputs.describe("w", (self.k, self.f), self.dtype), self.activation]
    if self.bias:
      parts.append(f"bias:{self.bias}")
    if self.out_dtype:
      parts.append(f"out:{inputs.short_dtype(self.out_dtype)}")
    if self.config is not None:
      c = self.config
      parts.append(f"blocks:{c.block_m}x{c.block_n}x{c.block_k}")
    return " ".join(parts)


def build_case(d: CaseDef, seed: int) -> Case:
  """Materializes a `CaseDef` into a `Case` with deterministic random arrays."""
  keys = inputs.Keys(seed, "glu_matmul " + d.name)
  x = inputs.normal(keys.next(), d.batch + (d.m, d.k), d.dtype)
  scale = 1.0 / math.sqrt(d.k)
  w_gate, w_up = ((jax.random.normal(keys.next(), (d.k, d.f), jnp.float32) * scale
                   ).astype(d.dtype) for _ in range(2))
  args: list[Any] = [x, w_gate, w_up]
  if d.bias in ("gate", "both"):
    args.append(inputs.normal(keys.next(), (d.f,), d.dtype))
  if d.bias == "both":
    args.append(inputs.normal(keys.next(), (d.f,), d.dtype))
  kwargs: dict[str, Any] = {"activation": d.activation}
  if d.out_dtype:
    kwargs["out_dtype"] = d.out_dtype
  if d.config is not None:
    kwargs["config"] = d.config
  return Case(name=d.name, args=tuple(args), kwargs=kwargs, tags=d.tags,
              grad_argnums=tuple(range(len(args))) if d.grad else ())


_CI = frozenset({"ci"})
_CI_GRAD = frozenset({"ci", "grad"})
_BENCH = frozenset({"bench"})

CASE_DEFS: tuple[CaseDef, ...] = (
    CaseDef(1, 1, 1, activation="relu"),
    # Ragged M, K and F against the blocks: a 1x5 grid, three K steps.
    CaseDef(13, 70, 300, bias="both", config=SMALL, tags=_CI_GRAD, grad=True),
    CaseDef(13, 70, 300, "bfloat16", activation="gelu", bias="both", config=SMALL,
            tags=_CI_GRAD, grad=True),
    CaseDef(5, 64, 48, "bfloat16", batch=(2,), activation="gelu_tanh", bias="gate",
            tags=_CI_GRAD, grad=True),
    CaseDef(9, 40, 24, "float16", activation="sigmoid"),
    CaseDef(31, 47, 19, activation="gelu", out_dtype="bfloat16"),
    CaseDef(17, 33, 70, "bfloat16", activation="relu", bias="both", out_dtype="float32"),
    # Llama-3-8B's MLP (SwiGLU, 4096 -> 14336) over 8192 tokens.
    CaseDef(8192, 4096, 14336, "bfloat16", tags=_BENCH),
    # Timed by scripts/device_check.sh when a GPU is lent.
    CaseDef(4096, 4096, 11008, "bfloat16", activation="gelu",
            tags=frozenset({"bench", "device"})),
)


def cases(tag: str, seed: int) -> Iterator[Case]:
  """Yields the cases carrying `tag`, arrays drawn deterministically from `seed`."""
  for d in CASE_DEFS:
    if tag in d.tags:
      yield build_case(d, seed)


def _split(args: tuple[Any, ...]) -> dict[str, Any]:
  if len(args) > len(_POSITIONAL):
    raise TypeError(f"glu_matmul case takes at most {len(_POSITIONAL)} positional arrays")
  return dict(zip(_POSITIONAL, args))


def call(*args: Any, implementation: str | None = None, **kwargs: Any):
  """`OpSpec.fn`: `glu_matmul` with positional (x, w_gate, w_up, bias_gate, bias_up)."""
  named = _split(args)
  x, w_gate, w_up = named.pop("x"), named.pop("w_gate"), named.pop("w_up")
  return glu_matmul(x, w_gate, w_up, implementation=implementation, **named, **kwargs)


def reference_f32(*args: Any, **kwargs: Any):
  """`OpSpec.reference_f32`: float32 operands at Precision.HIGHEST, no final cast."""
  named = _split(args)
  x, w_gate, w_up = named.pop("x"), named.pop("w_gate"), named.pop("w_up")
  options = {k: v for k, v in kwargs.items() if k not in _IMPL_KEYWORDS}
  return reference.glu_matmul_f32(x, w_gate, w_up, **named, **options)


def _nbytes(a: Any) -> int:
  return math.prod(a.shape) * jnp.dtype(a.dtype).itemsize


def bytes_moved(case: Case) -> int:
  """Every array argument read once, the [..., F] result written once."""
  x, w_gate = case.args[0], case.args[1]
  out_dtype = jnp.dtype(case.kwargs.get("out_dtype") or x.dtype)
  out = math.prod(x.shape[:-1]) * w_gate.shape[1] * out_dtype.itemsize
  return int(sum(_nbytes(a) for a in case.args) + out)


def flops(case: Case) -> int:
  """Two products, 2 * M * K * F each (the epilogue's O(M * F) left out)."""
  x, w_gate = case.args[0], case.args[1]
  return int(4 * math.prod(x.shape[:-1]) * x.shape[-1] * w_gate.shape[1])


# --------------------------------------------------------- sweeps ----


def make_case(*, seed: int, tags=(), grad: bool = False, m: int, k: int, f: int,
              dtype: str = "float32", activation: str = "silu", bias: bool = False,
              out_dtype: str | None = None) -> Case:
  """The case at one sweep point (`bias`: both biases)."""
  d = CaseDef(m=m, k=k, f=f, dtype=dtype, activation=activation,
              bias="both" if bias else None, out_dtype=out_dtype, tags=frozenset(tags),
              grad=grad)
  return build_case(d, seed)


SWEEP_PARAMS: tuple[SweepParam, ...] = (
    SweepParam("m", "int", 256), SweepParam("k", "int", 256), SweepParam("f", "int", 256),
    SweepParam("dtype", "dtype", "float32"), SweepParam("grad", "bool", False),
    SweepParam("activation", "str", "silu"), SweepParam("bias", "bool", False),
    SweepParam("out_dtype", "dtype", None, optional=True))


# ---------------------------------------------------- the audit's call ----

CLOSES = Closes(
    kinds=frozenset({"unfused-epilogue"}), anchors=frozenset({"glu"}),
    epilogues=frozenset({"bias", "activation", "multiply", "cast"}),
    activations=frozenset(reference.ACTIVATIONS),
    keywords=(("bias", "bias_gate"), ("activation", "activation"), ("cast", "out_dtype")),
    outputs=1)

#: The `multiply` item with which the audit says the gate and the up
#: projection are the two halves of one product with a concatenated [K, 2F]
#: weight (gate first); a plain "multiply" pairs two products with [K, F]
#: weights, of which the anchor is one.
HALVES = "multiply:halves"


def suggest(facts: CallFacts) -> Call | None:
  """`glu_matmul(x, w_gate, w_up, activation=...)` from the product the audit
  read: x is its lhs [..., K]; w_gate and w_up are its rhs [K, F], or the two
  halves of a concatenated rhs [K, 2F] when the ops hold `HALVES`. None for
  a layout the op does not take (batch dims, a transposed operand) or an
  activation it lacks."""
  anchor = facts.matmul
  if facts.kind != "unfused-epilogue" or anchor is None:
    return None
  lhs, rhs = anchor.lhs, anchor.rhs
  lc, rc = anchor.lhs_contracting, anchor.rhs_contracting
  if lc is not None and len(lhs.dims) == 2 and tuple(lc) == (0,) and \
      tuple(rc) == (len(rhs.dims) - 1,) and not (anchor.lhs_batch or anchor.rhs_batch):
    # XLA computes w^T x^T ([2F, M]) where M is small (a decode step):
    # the weight is the dot's left operand.
    lhs, rhs = rhs, lhs
    lc, rc = (len(lhs.dims) - 1,), (0,)
  if len(rhs.dims) != 2 or not lhs.dims:
    return None
  if lc is not None:  # a dot (a library call has none)
    if (anchor.lhs_batch or anchor.rhs_batch
        or tuple(lc) != (len(lhs.dims) - 1,)
        or tuple(rc) != (0,)):
      return None
  k, n = (int(d) for d in rhs.dims)
  activation, biases, result_dt = None, 0, facts.boundary.dtype
  options: list[tuple[str, str, object]] = []
  for item in facts.ops:
    base, _, arg = item.partition(":")
    if base == "activation":
      activation = arg
    elif base == "bias":
      biases += 1
    elif base == "cast" and arg:
      name = facts.numpy_name(arg)
      options.append(("out_dtype", f"jnp.{name}", name))
      result_dt = arg
  if activation not in reference.ACTIVATIONS:
    return None
  f = n // 2 if HALVES in facts.ops else n
  if f * (2 if HALVES in facts.ops else 1) != n or f == 0:
    return None
  arrays = [("x", lhs.dtype, tuple(lhs.dims), True), ("w_gate", rhs.dtype, (k, f), True),
            ("w_up", rhs.dtype, (k, f), True)]
  for name in ("bias_gate", "bias_up")[:biases]:
    arrays.append((name, facts.boundary.dtype, (f,), False))
  options.insert(0, ("activation", repr(activation), activation))
  result = tuple(lhs.dims[:-1]) + (f,)
  return Call("glu_matmul", tuple(arrays), tuple(options),
              f"{result_dt}[{','.join(map(str, result))}]")


SPEC = OpSpec(
    name="glu_matmul",
    fn=call,
    reference_f32=reference_f32,
    cases=cases,
    bytes_moved=bytes_moved,
    flops=flops,
    api=glu_matmul,
    closes=CLOSES,
    sweep_params=SWEEP_PARAMS,
    make_case=make_case,
    suggest=suggest,
)
