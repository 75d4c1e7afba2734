"""custom_vjp wiring of the GLU matmul kernels.

Residuals: the forward saves only its inputs (x, the weights, the biases),
and the backward recomputes the pre-activations g = x @ w_gate + b_gate and
u = x @ w_up + b_up. Saving them instead would keep 2 * M * F values alive
from the forward to the backward (for a [8192, 4096] x [4096, 14336] layer in
bf16: 470 MB, the very tensors the fused forward avoids writing); recomputing
costs 4 * M * K * F flops, half again the backward's 8 * M * K * F, which is
the usual trade of activation checkpointing in a GLU MLP.

Backward, and what runs it:
  1. Pallas (`kernel.backward`): one pass recomputes g and u tile by tile,
     reads dy and writes dg = dy * u * act'(g) and du = dy * act(g) (in x's
     dtype, the operand dtype of the products below) and f32 column sums of
     both, reduced over row blocks by a small XLA sum: the bias gradients.
  2. Pallas, through `pallas_kernels.matmul` (its own guard and fallback
     records, op "matmul"): dx = du @ w_up^T + dg @ w_gate^T (the second
     product enters the first as its fused residual), dw_gate = x^T @ dg and
     dw_up = x^T @ du; the transposes are read in place through matmul's
     transpose flags. float32 products run at Precision.HIGHEST.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops.glu_matmul import kernel
from pallas_kernels._src.ops.glu_matmul.config import Config
from pallas_kernels._src.ops.matmul.api import matmul

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  activation: str
  out_dtype: str
  config: Config
  interpret: bool
  #: The device traced for; the backward, traced later, re-enters it.
  target: backend_lib.Target


def _forward(static: Static, x, w_gate, w_up, bias_gate, bias_up):
  with backend_lib.targeting(static.target):
    return kernel.forward(x, w_gate, w_up, bias_gate, bias_up, activation=static.activation,
                          out_dtype=static.out_dtype, cfg=static.config,
                          interpret=static.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def glu_matmul(x, w_gate, w_up, bias_gate, bias_up, static: Static):
  """The GLU of 2-D x [M, K] through the Pallas kernels."""
  return _forward(static, x, w_gate, w_up, bias_gate, bias_up)


def _glu_fwd(x, w_gate, w_up, bias_gate, bias_up, static: Static):
  out = _forward(static, x, w_gate, w_up, bias_gate, bias_up)
  return out, (x, w_gate, w_up, bias_gate, bias_up)


def _glu_bwd(static: Static, saved, dy):
  x, w_gate, w_up, bias_gate, bias_up = saved
  with backend_lib.targeting(static.target):
    grads = kernel.backward(x, w_gate, w_up, bias_gate, bias_up, dy,
                            activation=static.activation, grad_dtype=x.dtype,
                            cfg=static.config, interpret=static.interpret)
    mm = functools.partial(matmul, implementation="pallas", interpret=static.interpret,
                           precision="highest" if x.dtype == _F32 else None)
    dx_gate = mm(grads.dg, w_gate, transpose_w=True, out_dtype=_F32)
    dx = mm(grads.du, w_up, transpose_w=True, residual=dx_gate, out_dtype=x.dtype)
    dw_gate = mm(x, grads.dg, transpose_x=True, out_dtype=w_gate.dtype)
    dw_up = mm(x, grads.du, transpose_x=True, out_dtype=w_up.dtype)
  db_gate = None if bias_gate is None else grads.dbias_gate.astype(bias_gate.dtype)
  db_up = None if bias_up is None else grads.dbias_up.astype(bias_up.dtype)
  return dx, dw_gate, dw_up, db_gate, db_up


glu_matmul.defvjp(_glu_fwd, _glu_bwd)
