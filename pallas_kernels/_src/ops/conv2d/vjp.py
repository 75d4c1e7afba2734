"""custom_vjp wiring of the conv2d kernel.

Forward: the Pallas kernel. Residuals: the inputs only (x, w, scale, shift,
bias, residual); the prologued input is not stored, because writing it is the
very traffic the fused forward removes.

Backward: by design XLA's, not a kernel and not a fallback: `jax.vjp` of the
reference (`reference.conv2d`, at Precision.HIGHEST for float32), which
recomputes the prologue from x and the pre-activation from the convolution,
and whose transposed convolutions (dx, dw) XLA hands to cuDNN. The
statistics' cotangents flow through the reference's sums like y's. Since it
is the design, the backward records no fallback; `pallas_kernels.conv2d`'s
docstring and docs/ops.md say so.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.conv2d import kernel
from pallas_kernels._src.ops.conv2d import reference
from pallas_kernels._src.ops.conv2d.config import Config


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  stride: tuple[int, int]
  #: ((top, bottom), (left, right)), resolved.
  padding: tuple[tuple[int, int], tuple[int, int]]
  dilation: tuple[int, int]
  groups: int
  prologue_activation: str
  activation: str
  statistics: bool
  out_dtype: str
  config: Config
  interpret: bool
  #: The device traced for; the backward, traced later, re-enters it.
  target: backend_lib.Target


def _geometry(static: Static, x, w) -> kernel.Geometry:
  n, h, wd, c = x.shape
  kh, kw, _, f = w.shape
  ho, wo = reference.output_hw((h, wd), (kh, kw), static.stride, static.dilation,
                               static.padding)
  return kernel.Geometry(n=n, h=h, w=wd, c=c, f=f, kh=kh, kw=kw, groups=static.groups,
                         stride=static.stride, dilation=static.dilation,
                         pad_lo=(static.padding[0][0], static.padding[1][0]), ho=ho, wo=wo)


def _forward(static: Static, x, w, scale, shift, bias, residual):
  with backend_lib.targeting(static.target):
    return kernel.forward(x, w, scale, shift, bias, residual, geom=_geometry(static, x, w),
                          prologue_activation=static.prologue_activation,
                          activation=static.activation, statistics=static.statistics,
                          out_dtype=static.out_dtype, cfg=static.config,
                          interpret=static.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def conv2d(x, w, scale, shift, bias, residual, static: Static):
  """The fused convolution through the Pallas kernel."""
  return _forward(static, x, w, scale, shift, bias, residual)


def _conv_fwd(x, w, scale, shift, bias, residual, static: Static):
  out = _forward(static, x, w, scale, shift, bias, residual)
  return out, (x, w, scale, shift, bias, residual)


def _conv_bwd(static: Static, saved, cotangent):
  precision = (jax.lax.Precision.HIGHEST if saved[0].dtype == jnp.float32 else None)

  def ref(x, w, scale, shift, bias, residual):
    return reference.conv2d(
        x, w, stride=static.stride, padding=static.padding, dilation=static.dilation,
        groups=static.groups, scale=scale, shift=shift,
        prologue_activation=static.prologue_activation, bias=bias,
        activation=static.activation, residual=residual, out_dtype=static.out_dtype,
        statistics=static.statistics, precision=precision)

  _, pullback = jax.vjp(ref, *saved)
  return pullback(cotangent)


conv2d.defvjp(_conv_fwd, _conv_bwd)
