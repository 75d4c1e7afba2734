"""Public linear cross-entropy: projection, log-softmax and loss fused, the
[tokens, vocab] logits never written to memory."""

from __future__ import annotations

import functools
import numbers
from typing import Literal

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.linear_cross_entropy import config as config_lib
from pallas_kernels._src.ops.linear_cross_entropy import guard
from pallas_kernels._src.ops.linear_cross_entropy import kernel
from pallas_kernels._src.ops.linear_cross_entropy import reference
from pallas_kernels._src.ops.linear_cross_entropy import vjp

Implementation = Literal["pallas", "xla"]
Reduction = Literal["none", "sum", "mean"]
_IMPLEMENTATIONS = (None, "pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"linear_cross_entropy: {message}")


def _check(x, w, labels, bias, reduction, ignore_index, implementation, config,
           compute_dtype) -> None:
  if x.ndim < 1 or x.shape[-1] == 0:
    _fail(f"x must be [..., D] with D > 0, got shape {x.shape}")
  if w.ndim != 2 or w.shape[0] != x.shape[-1] or w.shape[1] == 0:
    _fail(f"w must be [D, V] with D = x.shape[-1] = {x.shape[-1]} and V > 0, got "
          f"shape {w.shape}")
  for name, a in (("x", x), ("w", w), ("bias", bias)):
    if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
      _fail(f"{name} must be floating point, got {a.dtype} with shape {a.shape}")
  if tuple(labels.shape) != tuple(x.shape[:-1]):
    _fail(f"labels.shape {labels.shape} must be x's leading shape {x.shape[:-1]}")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    _fail(f"labels must be integers, got {labels.dtype} with shape {labels.shape}")
  if bias is not None and tuple(bias.shape) != (w.shape[1],):
    _fail(f"bias.shape {bias.shape} must be (V,) = ({w.shape[1]},)")
  if reduction not in reference.REDUCTIONS:
    _fail(f"reduction must be one of {reference.REDUCTIONS}, got {reduction!r}")
  if ignore_index is not None and (isinstance(ignore_index, bool)
                                   or not isinstance(ignore_index, numbers.Integral)):
    # Baked into the kernels: it must be static.
    _fail(f"ignore_index must be a Python int or None, got {type(ignore_index).__name__}")
  if compute_dtype is not None and not jnp.issubdtype(compute_dtype, jnp.floating):
    _fail(f"compute_dtype must be a floating dtype or None, got {compute_dtype!r}")
  if implementation not in _IMPLEMENTATIONS:
    _fail(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
  if config is not None and not isinstance(config, config_lib.Config):
    _fail(f"config must be a linear_cross_entropy Config, got {type(config).__name__}")


@functools.partial(jax.jit, static_argnames=("reduction", "ignore_index", "compute_dtype"))
def _reference(x, w, labels, bias, *, reduction, ignore_index, compute_dtype):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.linear_cross_entropy(x, w, labels, bias=bias, reduction=reduction,
                                        ignore_index=ignore_index,
                                        compute_dtype=compute_dtype)


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnums=(4, 5))
def _run(x, w, labels, bias, p: kernel.Dims, reduction: str):
  d = x.shape[-1]
  losses = vjp.token_losses(x.reshape(-1, d), w, bias,
                            labels.reshape(-1).astype(jnp.int32), p)
  return reference.reduce(losses.reshape(labels.shape), labels, reduction=reduction,
                          ignore_index=p.ignore_index)


def linear_cross_entropy(x, w, labels, *, bias=None, reduction: Reduction = "mean",
                         ignore_index: int | None = None,
                         implementation: Implementation | None = None,
                         interpret: bool | None = None,
                         config: config_lib.Config | None = None,
                         compute_dtype=None) -> jax.Array:
  """Cross-entropy of softmax(x @ w + bias) against integer labels, fused.

  The logits are formed, reduced to a per-token logsumexp and loss, and
  differentiated tile by tile in registers: neither the forward nor the
  backward writes the [tokens, V] logits (or their gradient) to memory. See
  `linear_cross_entropy/reference.py` for the exact semantics.

  Args:
    x: [..., D] activations (float32, bfloat16 or float16).
    w: [D, V] projection (e.g. the LM head).
    labels: integer [...] (x's leading shape), each in [0, V) or
      `ignore_index`.
    bias: optional [V], added to the logits.
    reduction: "none" (float32 losses shaped like labels), "sum" or "mean"
      (over the tokens not ignored).
    ignore_index: tokens with this label get loss 0 and gradient 0 and do not
      count in the mean (a Python int; None ignores none).
    implementation: "pallas" runs the kernels (interpreted where they cannot
      be compiled); "xla" runs the reference; None runs the kernels on GPU and
      XLA elsewhere unless `interpret=True` asks for the interpreted kernels.
      Arguments the guard rejects run the reference, recorded in
      `pallas_kernels.fallbacks()`.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling of the forward and backward kernels; None uses
      `config.heuristic_config`.
    compute_dtype: x and w are rounded to this dtype as the kernels load
      them, as `x.astype(d) @ w.astype(d)` computes (a mixed-precision head
      keeps f32 parameters and multiplies in bf16): nothing writes the
      rounded copy of w. The gradients keep x's and w's own dtypes. None:
      x's and w's promoted dtype.

  Returns:
    float32: the losses [...] for reduction "none", else a scalar.
    Differentiable in x, w and bias.

  Raises:
    ValueError: for bad arguments; the message names the offending shape.
  """
  x, w, labels = jnp.asarray(x), jnp.asarray(w), jnp.asarray(labels)
  bias = None if bias is None else jnp.asarray(bias)
  _check(x, w, labels, bias, reduction, ignore_index, implementation, config,
         compute_dtype)
  ignore_index = None if ignore_index is None else int(ignore_index)
  compute = None if compute_dtype is None else jnp.dtype(compute_dtype).name

  def run_reference():
    return _reference(x, w, labels, bias, reduction=reduction, ignore_index=ignore_index,
                      compute_dtype=compute)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    return _launch(x, w, labels, bias, reduction=reduction, ignore_index=ignore_index,
                   interp=interp, config=config, run_reference=run_reference,
                   compute=compute)

  return backend_lib.dispatch(interpret, (x, w, labels, bias), launch)


def _launch(x, w, labels, bias, *, reduction, ignore_index, interp: bool, config,
            run_reference, compute):
  """The guarded kernel call for the current target and interpret mode."""
  d, vocab = w.shape
  tokens = int(labels.size)
  reason = guard.unsupported_reason(
      x_shape=tuple(x.shape), x_dtype=x.dtype, w_shape=tuple(w.shape), w_dtype=w.dtype,
      bias_dtype=None if bias is None else bias.dtype, labels_dtype=labels.dtype,
      interpret=interp, config=config, compute_dtype=compute)
  if reason:
    guard_lib.record_fallback("linear_cross_entropy", reason,
                              guard_lib.signature(x=x, w=w, labels=labels, bias=bias))
    return run_reference()
  tiling_backend = backend_lib.Backend.CPU if interp else backend_lib.current_backend()
  # Blocks are sized for the operands as loaded; the dot takes `compute`.
  tiles = jnp.promote_types(x.dtype, w.dtype)
  p = kernel.Dims(
      tokens=tokens, d=int(d), vocab=int(vocab), has_bias=bias is not None,
      ignore_index=ignore_index, compute_dtype=compute or tiles.name,
      cfg=config or config_lib.heuristic_config(tokens, int(d), int(vocab),
                                                tiling_backend, tiles.itemsize),
      interpret=interp)
  return _run(x, w, labels, bias, p, reduction)
