"""custom_vjp wiring of the group-norm kernels.

The forward saves x, scale, bias and the f32 [N, G] mean and rstd; nothing of
x's size besides x itself (not x_hat, nor the activation's input). The
backward is one kernel (`kernel.backward`): dx, and dscale and dbias as
per-sample partial sums it adds over N.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.group_norm import kernel
from pallas_kernels._src.ops.group_norm.config import Config


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  groups: int
  epsilon: float
  #: Canonical activation name ("identity" for none).
  activation: str
  cfg: Config
  interpret: bool
  #: The device traced for (part of the trace cache's key).
  target: backend_lib.Target


def forward(x3, scale, bias, static: Static, pooled: bool = False):
  """(y, mean, rstd) of [N, R, C] x3 (y summed over R with `pooled`): the
  forward kernel."""
  return kernel.forward(x3, scale, bias, groups=static.groups, epsilon=static.epsilon,
                        activation=static.activation, cfg=static.cfg,
                        interpret=static.interpret, pooled=pooled)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def group_norm(x3, scale, bias, static: Static):
  """y of [N, R, C] x3 through the Pallas kernels."""
  return forward(x3, scale, bias, static)[0]


def _fwd(x3, scale, bias, static: Static):
  y, mean, rstd = forward(x3, scale, bias, static)
  return y, (x3, scale, bias, mean, rstd)


def backward(x3, g3, scale, bias, mean, rstd, static: Static, dx_sum: bool = False):
  """(dx, dscale f32, dbias f32[, dx's sum f32]) from the cotangent g3 and
  the forward's statistics: the backward kernel."""
  return kernel.backward(x3, g3, scale, bias, mean, rstd, groups=static.groups,
                         activation=static.activation, cfg=static.cfg,
                         interpret=static.interpret, dx_sum=dx_sum)


def _bwd(static: Static, saved, g3):
  x3, scale, bias, mean, rstd = saved
  dx, dscale, dbias = backward(x3, g3, scale, bias, mean, rstd, static)
  return dx, dscale.astype(scale.dtype), dbias.astype(bias.dtype)


group_norm.defvjp(_fwd, _bwd)
