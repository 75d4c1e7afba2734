"""`pallas_kernels.glu_matmul`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.glu_matmul import config as config_lib
from pallas_kernels._src.ops.glu_matmul import guard
from pallas_kernels._src.ops.glu_matmul import reference
from pallas_kernels._src.ops.glu_matmul import vjp
from pallas_kernels._src.ops.glu_matmul.config import Config

IMPLEMENTATIONS = ("pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"glu_matmul: {message}")


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def _check(x, w_gate, w_up, bias_gate, bias_up, activation, implementation, config) -> None:
  for name, a in (("x", x), ("w_gate", w_gate), ("w_up", w_up), ("bias_gate", bias_gate),
                  ("bias_up", bias_up)):
    if a is None:
      continue
    dt = jnp.dtype(a.dtype)
    if not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
      _fail(f"{name} must be a real floating or integer array, got {dt.name}{_shape(a)}")
  if x.ndim < 1:
    _fail(f"x must have at least one axis [..., K], got shape {_shape(x)}")
  if w_gate.ndim != 2 or _shape(w_gate) != _shape(w_up):
    _fail(f"w_gate and w_up must both be [K, F], got w_gate{_shape(w_gate)} "
          f"w_up{_shape(w_up)}")
  k, f = _shape(w_gate)
  if x.shape[-1] != k:
    _fail(f"contraction mismatch: x{_shape(x)} has K={x.shape[-1]} but w_gate"
          f"{_shape(w_gate)} has K={k}")
  for name, b in (("bias_gate", bias_gate), ("bias_up", bias_up)):
    if b is not None and _shape(b) != [f]:
      _fail(f"{name} must have shape [F]=[{f}], got {_shape(b)}")
  reference.check_activation(activation)
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a glu_matmul Config, got {type(config).__name__}")


@functools.partial(jax.jit, static_argnames=("activation", "out_dtype"))
def _reference(x, w_gate, w_up, bias_gate, bias_up, *, activation, out_dtype):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.glu_matmul(x, w_gate, w_up, activation=activation, bias_gate=bias_gate,
                              bias_up=bias_up, out_dtype=out_dtype)


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnums=(5,))
def _run(x, w_gate, w_up, bias_gate, bias_up, static: vjp.Static):
  k, f = w_gate.shape
  y = vjp.glu_matmul(x.reshape(-1, k), w_gate, w_up, bias_gate, bias_up, static)
  return y.reshape(x.shape[:-1] + (f,))


def glu_matmul(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, *,
               activation: Literal["silu", "gelu", "gelu_tanh", "relu", "sigmoid"] = "silu",
               bias_gate: jax.Array | None = None, bias_up: jax.Array | None = None,
               out_dtype: Any = None, implementation: str | None = None,
               interpret: bool | None = None, config: Config | None = None) -> jax.Array:
  """The gate/up pair of a GLU MLP in one kernel: act(x @ w_gate + b_gate) * (x @ w_up + b_up).

  SwiGLU is activation="silu", GeGLU "gelu" (or "gelu_tanh"). The kernel reads
  each x tile once for both products, keeps both accumulators in registers
  and writes only the product; XLA writes both [M, F] products (or one
  [M, 2F]) and reads them back. The jnp equivalent (`reference.glu_matmul`)::

    g = jnp.matmul(x, w_gate, preferred_element_type=f32) + bias_gate
    u = jnp.matmul(x, w_up, preferred_element_type=f32) + bias_up
    out = (act(g) * u).astype(out_dtype)

  What runs where, with implementation="pallas":
    * forward: one Pallas kernel (two f32 accumulators, epilogue with biases,
      activation, product and cast);
    * backward: one Pallas kernel recomputes g and u and writes dg, du and
      the bias gradients' partial column sums (summed by XLA); dx, dw_gate
      and dw_up are `pallas_kernels.matmul` Pallas kernels (see `vjp.py`).
      Nothing of size [M, F] is saved between forward and backward.
  With implementation="xla" (or a guard fallback) the reference runs and is
  differentiated by JAX.

  Args:
    x: [..., K], float32/bfloat16/float16.
    w_gate, w_up: [K, F], x's dtype.
    activation: "silu", "gelu" (exact erf form), "gelu_tanh", "relu" or
      "sigmoid", applied to the gate (jax.nn's definitions).
    bias_gate, bias_up: [F], added to the products before the activation
      and the multiply.
    out_dtype: dtype of the result (default x.dtype).
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling of both kernels; None picks `config.heuristic_config`.
      float32 operands multiply in IEEE float32 (Precision.HIGHEST).

  Returns:
    [..., F] in out_dtype. Differentiable with respect to x, the weights and
    the biases.

  Raises:
    ValueError: for invalid calls (shapes that do not fit, an unknown
      activation or implementation). A call the kernel cannot run (dtypes,
      backend, size limits) is not an error: it runs the XLA reference and is
      recorded in `pallas_kernels.fallbacks()`.
  """
  x, w_gate, w_up = jnp.asarray(x), jnp.asarray(w_gate), jnp.asarray(w_up)
  bias_gate = None if bias_gate is None else jnp.asarray(bias_gate)
  bias_up = None if bias_up is None else jnp.asarray(bias_up)
  _check(x, w_gate, w_up, bias_gate, bias_up, activation, implementation, config)
  odt = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
  operands = (x, w_gate, w_up, bias_gate, bias_up)

  def run_reference():
    return _reference(*operands, activation=activation, out_dtype=odt.name)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    k, f = w_gate.shape
    cfg = config or config_lib.choose_config(math.prod(x.shape[:-1]), f, k, x.dtype, interp)
    reason = guard.unsupported_reason(x, w_gate, w_up, bias_gate=bias_gate, bias_up=bias_up,
                                      out_dtype=odt, interpret=interp, config=cfg)
    if reason:
      guard_lib.record_fallback("glu_matmul", reason, guard_lib.signature(
          x=x, w_gate=w_gate, w_up=w_up, bias_gate=bias_gate, bias_up=bias_up))
      return run_reference()
    static = vjp.Static(activation=activation, out_dtype=odt.name, config=cfg,
                        interpret=interp, target=backend_lib.target())
    return _run(*operands, static)

  return backend_lib.dispatch(interpret, operands, launch)
