"""One case of an op from its shape parameters (sweeps ask for any point).

`make_case` builds a `Case` as the op's own `arg_specs` build theirs: random
normal arrays from `inputs`, keyword options of the public op. The arrays are
made eagerly; under `jax.eval_shape` they are tracers and nothing is computed.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from pallas_kernels._src import inputs
from pallas_kernels._src.spec import Case


def _matmul(*, seed, tags, grad, m, k, n, batch=None, **options) -> Case:
  from pallas_kernels._src.ops.matmul import arg_specs

  if isinstance(batch, int):
    batch = (batch,)
  d = arg_specs.CaseDef(m=m, k=k, n=n, batch=tuple(batch or ()), tags=tags, grad=grad,
                        **options)
  return arg_specs.build_case(d, seed)


def _rows(op, *, seed, tags, grad, rows, cols, dtype="float32", out_dtype=None,
          **options) -> Case:
  name = f"{op} {inputs.describe('x', (rows, cols), dtype)}"
  keys = inputs.Keys(seed, name)
  args = [inputs.normal(keys.next(), (rows, cols), dtype)]
  kwargs: dict[str, Any] = {}
  if op in ("layer_norm", "rms_norm"):
    args.append(inputs.normal(keys.next(), (cols,), dtype))  # gamma
    if op == "layer_norm":
      args.append(inputs.normal(keys.next(), (cols,), dtype))  # beta
    if options.get("residual"):
      args.append(inputs.normal(keys.next(), (rows, cols), dtype))
    if options.get("quantize"):
      kwargs["quantize"] = options["quantize"]
      grad = False  # Quantized outputs are not differentiable.
  else:  # softmax
    if options.get("scale") is not None:
      kwargs["scale"] = options["scale"]
    if options.get("causal"):
      kwargs["causal"] = True
  if out_dtype:
    kwargs["out_dtype"] = out_dtype
  return Case(name=name, args=tuple(args), kwargs=kwargs, tags=tags,
              grad_argnums=tuple(range(len(args))) if grad else ())


def _norm(op):
  def build(*, seed, tags, grad, rows, cols, dtype="float32", residual=False,
            quantize=None, out_dtype=None) -> Case:
    return _rows(op, seed=seed, tags=tags, grad=grad, rows=rows, cols=cols, dtype=dtype,
                 out_dtype=out_dtype, residual=residual, quantize=quantize)
  return build


def _softmax(*, seed, tags, grad, rows, cols, dtype="float32", scale=None, causal=False,
             out_dtype=None) -> Case:
  return _rows("softmax", seed=seed, tags=tags, grad=grad, rows=rows, cols=cols,
               dtype=dtype, out_dtype=out_dtype, scale=scale, causal=causal)


def _matmul_parameters() -> tuple[str, ...]:
  import dataclasses

  from pallas_kernels._src.ops.matmul import arg_specs
  return tuple(f.name for f in dataclasses.fields(arg_specs.CaseDef)
               if f.name not in ("tags", "grad"))


_BUILDERS = {"matmul": _matmul, "layer_norm": _norm("layer_norm"),
             "rms_norm": _norm("rms_norm"), "softmax": _softmax}


def _parameters(op: str) -> tuple[str, ...]:
  if op == "matmul":
    return _matmul_parameters()
  return tuple(p for p in inspect.signature(_BUILDERS[op]).parameters
               if p not in ("seed", "tags", "grad"))


def make_case(op: str, *, seed: int = 0, tags: Iterable[str] = (), grad: bool = False,
              **params: Any) -> Case:
  """The case of `op` at one point, with deterministic random normal arrays.

  Args:
    op: "matmul", "layer_norm", "rms_norm" or "softmax".
    seed: the integer seed; with the case's name it fixes the arrays.
    tags: the case's tags (what `validate` and `bench` select by).
    grad: check gradients for the array arguments (not for a quantized
      output, which is not differentiable).
    **params: the point. matmul: m, k, n and the optional `batch` (an int or
      a tuple of leading dims), dtype, w_dtype, bias, residual, activation,
      scale ("scalar"/"vector"), w_scale ("scalar"/"channel"/"group"),
      group_size, x_scale ("scalar"/"row"), transpose_x/_w/_out, quantize,
      out_dtype, precision. layer_norm, rms_norm: rows, cols, dtype, residual,
      quantize, out_dtype. softmax: rows, cols, dtype, scale (a float),
      causal, out_dtype.

  Raises:
    ValueError: for an unknown op or parameter (the message lists the known
      ones), or a point the op cannot express.
  """
  if op not in _BUILDERS:
    raise ValueError(f"make_case: unknown op {op!r}; known: {', '.join(_BUILDERS)}")
  known = _parameters(op)
  unknown = sorted(set(params) - set(known))
  if unknown:
    raise ValueError(f"make_case({op!r}): unknown parameter(s) {', '.join(unknown)}; "
                     f"known: {', '.join(known)}")
  return _BUILDERS[op](seed=seed, tags=frozenset(tags), grad=bool(grad), **params)
