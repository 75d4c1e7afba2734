"""Group norm over channels-last x in plain jax.numpy: the specification, the
XLA fallback and (differentiated by JAX) the backward the kernels must match.

Per sample (axis 0) and group of C // groups consecutive channels, over every
middle axis and the group's channels, as flax.linen.GroupNorm(num_groups=groups)
takes them with its defaults (use_fast_variance=True)::

    mean = E[x];  var = max(0, E[x**2] - mean**2)                  # f32 [N, G]
    y    = act((x - mean) * (rsqrt(var + epsilon) * scale) + bias) # f32, then x.dtype
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops.batch_norm import reference as batch_norm_reference
from pallas_kernels._src.ops.conv2d import reference as conv2d_reference

_F32 = jnp.float32

#: Accepted `activation=` names (None: "identity"): batch_norm's.
ACTIVATIONS = batch_norm_reference.ACTIVATIONS
canonical_activation = batch_norm_reference.canonical_activation


def _grouped(a, groups: int):
  """[N, ..., C] -> f32 [N, R, G, C // G]."""
  return a.astype(_F32).reshape(a.shape[0], -1, groups, a.shape[-1] // groups)


def statistics(x, *, groups: int):
  """(mean, var), f32 [N, G]: flax's fast variance, clamped at 0."""
  xg = _grouped(x, groups)
  mean = jnp.mean(xg, axis=(1, 3))
  var = jnp.maximum(jnp.mean(jnp.square(xg), axis=(1, 3)) - jnp.square(mean), 0.0)
  return mean, var


def _group_norm(x, scale, bias, *, groups: int, epsilon: float, activation: str | None):
  mean, var = statistics(x, groups=groups)
  gs = x.shape[-1] // groups
  mul = (jax.lax.rsqrt(var + jnp.float32(epsilon))[:, None, :, None]
         * scale.astype(_F32).reshape(groups, gs))
  pre = (_grouped(x, groups) - mean[:, None, :, None]) * mul + bias.astype(_F32).reshape(
      groups, gs)
  return conv2d_reference.activate(activation, pre).reshape(x.shape)


def group_norm(x, scale, bias, *, groups: int, epsilon: float = 1e-6,
               activation: str | None = None):
  """y in x.dtype as the module docstring says."""
  return _group_norm(x, scale, bias, groups=groups, epsilon=epsilon,
                     activation=activation).astype(x.dtype)


def group_norm_f32(x, scale, bias, *, groups: int, epsilon: float = 1e-6,
                   activation: str | None = None):
  """The ground truth for validation: `group_norm` with y left in float32.
  No matmul here, so no precision to raise."""
  return _group_norm(x, scale, bias, groups=groups, epsilon=epsilon, activation=activation)
