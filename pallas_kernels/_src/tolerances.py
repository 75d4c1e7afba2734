"""Numerical tolerances: the one table that tests, `validate` and `verify` share.

Errors are measured as a relative error norm, ||out - ref|| / ||ref||, against a
reference computed in float32 at `Precision.HIGHEST`. Gradients get twice the
forward bound because the backward pass chains two rounded computations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: Forward-pass bound on the relative error norm, by output dtype.
_FORWARD: dict[str, float] = {
    "float64": 1e-12,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1e-2,
    # fp8 outputs carry 2-3 mantissa bits.
    "float8_e4m3fn": 7e-2,
    "float8_e5m2": 1.3e-1,
    # Integer outputs come from quantization: one step of rounding at most.
    "int8": 1e-2,
}

#: Gradients may err by this multiple of the forward bound.
GRADIENT_FACTOR = 2.0


def tolerance(dtype, *, grad: bool = False) -> float:
  """Bound on the relative error norm for outputs of `dtype`.

  Args:
    dtype: the output dtype (anything `jnp.dtype` accepts).
    grad: whether the output is a gradient (twice the forward bound).

  Raises:
    KeyError: if the dtype has no entry; add one here rather than guessing.
  """
  name = jnp.dtype(dtype).name
  bound = _FORWARD[name]
  return bound * GRADIENT_FACTOR if grad else bound


def relative_error(out, ref) -> float:
  """||out - ref||_2 / ||ref||_2 computed in float64 on the host.

  Non-finite entries must match exactly (NaN where NaN, same-signed Inf) and are
  left out of the norm; a mismatch returns `inf`.
  """
  out = np.asarray(jax.device_get(out)).astype(np.float64)
  ref = np.asarray(jax.device_get(ref)).astype(np.float64)
  if out.shape != ref.shape:
    raise ValueError(f"shape mismatch: {out.shape} vs reference {ref.shape}")
  finite = np.isfinite(ref)
  same_nonfinite = np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(
      np.where(np.isinf(ref), ref, 0.0), np.where(np.isinf(out), out, 0.0))
  if not same_nonfinite or not np.all(np.isfinite(out[finite])):
    return float("inf")
  diff = np.linalg.norm((out - ref)[finite])
  norm = np.linalg.norm(ref[finite])
  if norm == 0.0:
    return float(diff)
  return float(diff / norm)
