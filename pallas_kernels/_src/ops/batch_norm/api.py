"""`pallas_kernels.batch_norm`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.batch_norm import config as config_lib
from pallas_kernels._src.ops.batch_norm import guard
from pallas_kernels._src.ops.batch_norm import reference
from pallas_kernels._src.ops.batch_norm import vjp
from pallas_kernels._src.ops.batch_norm.config import Config

IMPLEMENTATIONS = ("pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"batch_norm: {message}")


def _check(x, gamma, beta, eps, activation, implementation, config) -> str:
  if x.ndim < 1:
    _fail(f"x must have a channel axis, got shape {list(x.shape)}")
  c = x.shape[-1]
  for name, a in (("x", x), ("gamma", gamma), ("beta", beta)):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      _fail(f"{name} must be floating point, got {a.dtype} with shape {list(a.shape)}")
  for name, a in (("gamma", gamma), ("beta", beta)):
    if tuple(a.shape) != (c,):
      _fail(f"{name}.shape {tuple(a.shape)} must be (x.shape[-1],) = ({c},) for x of "
            f"shape {tuple(x.shape)}")
  if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
    # A traced eps cannot reach the kernels, which bake it in.
    _fail(f"eps must be a Python float, got {type(eps).__name__}")
  if not (math.isfinite(eps) and eps >= 0):
    _fail(f"eps must be finite and >= 0, got {eps}")
  try:
    name = reference.canonical_activation(activation)
  except ValueError as e:
    _fail(str(e))
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a batch_norm Config, got {type(config).__name__}")
  return name


@functools.partial(jax.jit, static_argnames=("eps", "activation"))
def _reference(x, gamma, beta, *, eps: float, activation: str):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.batch_norm(x, gamma, beta, eps=eps, activation=activation)


@functools.partial(jax.jit, static_argnums=(3,))
def _run(x, gamma, beta, static: vjp.Static):
  y, mean, var = vjp.batch_norm(x.reshape(-1, x.shape[-1]), gamma, beta, static)
  return y.reshape(x.shape), mean, var


def batch_norm(x: jax.Array, gamma: jax.Array, beta: jax.Array, *, eps: float = 1e-3,
               activation: str | None = None, implementation: str | None = None,
               interpret: bool | None = None, config: Config | None = None
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Training-mode batch norm over channels-last x, with its activation fused.

  Statistics are the batch's, over every axis but the last (N, H, W of an
  NHWC activation), as keras' BatchNormalization and flax's nn.BatchNorm
  (use_running_average=False) take them::

    mean = mean(x, axes);  var = mean((x - mean)**2, axes)        # f32, biased
    y = act((x - mean) * rsqrt(var + eps) * gamma + beta).astype(x.dtype)

  Differentiable in x, gamma and beta, also through the returned mean and
  var. The backward applies the activation's derivative inside the kernel
  that reads y's cotangent and sums gamma's and beta's gradients in that
  pass; a second pass writes dx. dy, the cotangent after the activation, is
  never written.

  Args:
    x: [..., C] float32/bfloat16/float16, channels last.
    gamma, beta: [C], the scale and the shift.
    eps: added to the variance (a Python float >= 0; static). keras' default.
    activation: None, "relu", "relu6", "hard_swish", ... (`reference.ACTIVATIONS`).
    implementation: "pallas" (the kernels; interpreted where nothing compiles
      them), "xla" (the reference), or None: the kernels where they compile
      (GPU) or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`.

  Returns:
    (y in x.dtype, mean f32 [C], var f32 [C]). A caller keeping running
    statistics updates them from mean and var (keras and flax both use the
    biased var).

  Raises:
    ValueError: for invalid calls (gamma or beta not [C], non-floating
      arrays, eps not a finite Python float >= 0, an unknown activation or
      implementation). A call the kernels cannot run (dtypes, rank < 2,
      backend, size limits) is not an error: it runs the XLA reference and is
      recorded in `pallas_kernels.fallbacks()`.
  """
  x, gamma, beta = jnp.asarray(x), jnp.asarray(gamma), jnp.asarray(beta)
  act = _check(x, gamma, beta, eps, activation, implementation, config)

  def run_reference():
    return _reference(x, gamma, beta, eps=float(eps), activation=act)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    m = math.prod(x.shape[:-1]) if x.ndim > 1 else 1
    cfg = config or config_lib.choose_config(m, x.shape[-1], interp)
    reason = guard.unsupported_reason(x, gamma, beta, interpret=interp, config=cfg)
    if reason:
      guard_lib.record_fallback("batch_norm", reason,
                                guard_lib.signature(x=x, gamma=gamma, beta=beta))
      return run_reference()
    static = vjp.Static(eps=float(eps), activation=act, cfg=cfg, interpret=interp,
                        target=backend_lib.target())
    return _run(x, gamma, beta, static)

  return backend_lib.dispatch(interpret, (x, gamma, beta), launch)
