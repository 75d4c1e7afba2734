"""The GLU matmul in plain jax.numpy: its specification and its XLA fallback.

    g   = x @ w_gate + bias_gate        # f32 accumulation
    u   = x @ w_up + bias_up
    out = (act(g) * u).astype(out_dtype)

Everything after the products runs in float32 and is cast once. The
activations are the matmul op's (`matmul.reference.activate`, jax.nn's
definitions), restricted to the gating ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels._src.ops.matmul import reference as matmul_reference

_F32 = jnp.float32

#: Accepted `activation=` names (SwiGLU: "silu"; GeGLU: "gelu"/"gelu_tanh";
#: ReGLU: "relu"; the original GLU: "sigmoid").
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu", "gelu_tanh", "relu", "sigmoid")


def check_activation(activation: str) -> str:
  """`activation` if it is one of `ACTIVATIONS`.

  Raises:
    ValueError: otherwise.
  """
  if activation not in ACTIVATIONS:
    raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")
  return activation


def _products(x, w_gate, w_up, bias_gate, bias_up, precision):
  if jax.default_backend() == "cpu":
    # XLA:CPU cannot run some bf16 x bf16 -> f32 dots; 16-bit products are
    # exact in f32, so widening first changes only the summation order.
    x, w_gate, w_up = (a.astype(_F32) for a in (x, w_gate, w_up))
  g = jnp.matmul(x, w_gate, precision=precision, preferred_element_type=_F32)
  u = jnp.matmul(x, w_up, precision=precision, preferred_element_type=_F32)
  if bias_gate is not None:
    g = g + bias_gate.astype(_F32)
  if bias_up is not None:
    u = u + bias_up.astype(_F32)
  return g.astype(_F32), u.astype(_F32)


def glu_matmul(x, w_gate, w_up, *, activation: str = "silu", bias_gate=None, bias_up=None,
               out_dtype=None, precision=None) -> jax.Array:
  """`pallas_kernels.glu_matmul` in jax.numpy (the XLA implementation).

  Args:
    x: [..., K]; w_gate, w_up: [K, F]; bias_gate, bias_up: [F] or None.
    activation: one of `ACTIVATIONS`.
    out_dtype: result dtype (default x.dtype).
    precision: of the two products (HIGHEST for the ground truth).
  """
  g, u = _products(x, w_gate, w_up, bias_gate, bias_up, precision)
  y = matmul_reference.activate(check_activation(activation), g) * u
  return y.astype(x.dtype if out_dtype is None else out_dtype)


def glu_matmul_f32(x, w_gate, w_up, *, activation: str = "silu", bias_gate=None,
                   bias_up=None, out_dtype=None) -> jax.Array:
  """Ground truth for validation: float32 operands, Precision.HIGHEST, no final cast."""
  del out_dtype
  x, w_gate, w_up = (a.astype(_F32) for a in (x, w_gate, w_up))
  g, u = _products(x, w_gate, w_up, bias_gate, bias_up, jax.lax.Precision.HIGHEST)
  return matmul_reference.activate(check_activation(activation), g) * u
