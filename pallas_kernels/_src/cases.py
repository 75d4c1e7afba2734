"""One case of an op from its shape parameters (sweeps ask for any point).

`make_case` builds a `Case` as the op's own `arg_specs` build theirs (its
spec's `make_case`): random normal arrays from `inputs`, keyword options of
the public op. The arrays are made eagerly; under `jax.eval_shape` they are
tracers and nothing is computed.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any

from pallas_kernels._src import registry
from pallas_kernels._src.spec import Case, OpSpec


def _builders() -> dict[str, OpSpec]:
  return {name: spec for name, spec in registry.specs().items() if spec.make_case}


def parameters(spec: OpSpec) -> tuple[str, ...]:
  """The point parameters `spec.make_case` takes (its keyword-only
  arguments, or the fields of the dataclass behind its `**options`)."""
  sig = inspect.signature(spec.make_case)
  out = []
  for p in sig.parameters.values():
    if p.name in ("seed", "tags", "grad"):
      continue
    if p.kind is p.VAR_KEYWORD:
      # matmul: every CaseDef field (see its arg_specs.make_case).
      case_def = getattr(inspect.getmodule(spec.make_case), "CaseDef", None)
      if case_def is not None:
        out += [f.name for f in dataclasses.fields(case_def)
                if f.name not in ("tags", "grad") and f.name not in out]
      continue
    if p.name not in out:
      out.append(p.name)
  return tuple(out)


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
  builders = _builders()
  if op not in builders:
    raise ValueError(f"make_case: unknown op {op!r}; known: {', '.join(builders)}")
  spec = builders[op]
  known = parameters(spec)
  unknown = sorted(set(params) - set(known))
  if unknown:
    raise ValueError(f"make_case({op!r}): unknown parameter(s) {', '.join(unknown)}; "
                     f"known: {', '.join(known)}")
  return spec.make_case(seed=seed, tags=frozenset(tags), grad=bool(grad), **params)
