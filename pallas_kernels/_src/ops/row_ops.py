"""What the row ops (layer norm, RMS norm, softmax) share in their specs: a
case at any sweep point, the sweep's parameters, and the call that closes a
finding.

A row op reads `x` [rows, cols] (norms also gamma [cols], layer norm beta
[cols], and an optional residual of x's shape) and normalizes over the last
axis.
"""

from __future__ import annotations

from typing import Any

from pallas_kernels._src import inputs
from pallas_kernels._src.spec import Call, CallFacts, Case, SweepParam

_COMMON = (SweepParam("rows", "int", 256), SweepParam("cols", "int", 256),
           SweepParam("dtype", "dtype", "float32"), SweepParam("grad", "bool", False))

#: The sweep parameters of a norm, and of softmax.
NORM_PARAMS: tuple[SweepParam, ...] = (
    *_COMMON, SweepParam("residual", "bool", False),
    SweepParam("out_dtype", "dtype", None, optional=True),
    SweepParam("quantize", "str", None, optional=True))
SOFTMAX_PARAMS: tuple[SweepParam, ...] = (
    *_COMMON, SweepParam("scale", "float", None, optional=True),
    SweepParam("causal", "bool", False),
    SweepParam("out_dtype", "dtype", None, optional=True))


def make_case(op: str, *, seed: int, tags, grad: bool, rows: int, cols: int,
              dtype: str = "float32", out_dtype: str | None = None,
              residual: bool = False, quantize: str | None = None,
              scale: float | None = None, causal: bool = False) -> Case:
  """The case of row op `op` at one point (random normal arrays)."""
  name = f"{op} {inputs.describe('x', (rows, cols), dtype)}"
  keys = inputs.Keys(seed, name)
  args = [inputs.normal(keys.next(), (rows, cols), dtype)]
  kwargs: dict[str, Any] = {}
  if op in ("layer_norm", "rms_norm"):
    args.append(inputs.normal(keys.next(), (cols,), dtype))  # gamma
    if op == "layer_norm":
      args.append(inputs.normal(keys.next(), (cols,), dtype))  # beta
    if residual:
      args.append(inputs.normal(keys.next(), (rows, cols), dtype))
    if quantize:
      kwargs["quantize"] = quantize
      grad = False  # Quantized outputs are not differentiable.
  else:  # softmax
    if scale is not None:
      kwargs["scale"] = scale
    if causal:
      kwargs["causal"] = True
  if out_dtype:
    kwargs["out_dtype"] = out_dtype
  return Case(name=name, args=tuple(args), kwargs=kwargs, tags=frozenset(tags),
              grad_argnums=tuple(range(len(args))) if grad else ())


def suggest(op: str, facts: CallFacts) -> Call | None:
  """The row op's call over the boundary buffer (its last axis)."""
  bdt, bdims = facts.boundary.dtype, tuple(facts.boundary.dims)
  if not bdims:
    return None
  n = bdims[-1]
  arrays = [("x", bdt, bdims, True)]
  options = []
  if op != "softmax":
    arrays.append(("gamma", bdt, (n,), True))
    if op == "layer_norm":
      arrays.append(("beta", bdt, (n,), True))
    eps = facts.epsilon()
    if eps is None:  # none, or several: never print a guess as a fact
      options.append(("eps", "EPS", 1e-6))
    else:
      options.append(("eps", repr(eps), eps))
  return Call(op, tuple(arrays), tuple(options), facts.shape)
