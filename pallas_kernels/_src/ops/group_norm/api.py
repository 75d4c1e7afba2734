"""`pallas_kernels.group_norm`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.group_norm import config as config_lib
from pallas_kernels._src.ops.group_norm import guard
from pallas_kernels._src.ops.group_norm import reference
from pallas_kernels._src.ops.group_norm import vjp
from pallas_kernels._src.ops.group_norm.config import Config

IMPLEMENTATIONS = ("pallas", "xla")


def _fail(message: str) -> None:
  raise ValueError(f"group_norm: {message}")


def _check(x, scale, bias, groups, epsilon, activation, implementation, config) -> str:
  if x.ndim < 2:
    _fail(f"x must be [N, ..., C] with rank >= 2, got shape {tuple(x.shape)}")
  c = x.shape[-1]
  for name, a in (("x", x), ("scale", scale), ("bias", bias)):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      _fail(f"{name} must be floating point, got {a.dtype} with shape {list(a.shape)}")
  for name, a in (("scale", scale), ("bias", bias)):
    if tuple(a.shape) != (c,):
      _fail(f"{name}.shape {tuple(a.shape)} must be (x.shape[-1],) = ({c},) for x of "
            f"shape {tuple(x.shape)}")
  if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
    _fail(f"groups must be a Python int >= 1, got {groups!r}")
  if c % groups:
    _fail(f"x's {c} channels (x of shape {tuple(x.shape)}, scale and bias of shape "
          f"({c},)) do not split into groups={groups}")
  if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
    # A traced epsilon cannot reach the kernels, which bake it in.
    _fail(f"epsilon must be a Python float, got {type(epsilon).__name__}")
  if not (math.isfinite(epsilon) and epsilon >= 0):
    _fail(f"epsilon must be finite and >= 0, got {epsilon}")
  try:
    name = reference.canonical_activation(activation)
  except ValueError as e:
    _fail(str(e))
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a group_norm Config, got {type(config).__name__}")
  return name


@functools.partial(jax.jit, static_argnames=("groups", "epsilon", "activation"))
def _reference(x, scale, bias, *, groups: int, epsilon: float, activation: str):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.group_norm(x, scale, bias, groups=groups, epsilon=epsilon,
                              activation=activation)


@functools.partial(jax.jit, static_argnums=(3,))
def _run(x, scale, bias, static: vjp.Static):
  x3 = x.reshape(x.shape[0], -1, x.shape[-1])
  return vjp.group_norm(x3, scale, bias, static).reshape(x.shape)


def group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, *, groups: int,
               epsilon: float = 1e-6, activation: str | None = None,
               implementation: str | None = None, interpret: bool | None = None,
               config: Config | None = None) -> jax.Array:
  """Group norm over channels-last x, with its activation fused.

  Statistics are per sample (axis 0) and group of C // groups consecutive
  channels, over every middle axis and the group's channels, exactly as
  flax.linen.GroupNorm(num_groups=groups) takes them with its defaults
  (use_fast_variance=True)::

    mean = E[x];  var = max(0, E[x**2] - mean**2)        # f32, per (sample, group)
    y = act((x - mean) * (rsqrt(var + epsilon) * scale) + bias).astype(x.dtype)

  Differentiable in x, scale and bias. The backward kernel recomputes x_hat
  and the activation's derivative from x and the saved per-(sample, group)
  mean and rstd where it reads y's cotangent: neither x_hat nor the
  activation's input is stored.

  Args:
    x: [N, ..., C] float32/bfloat16/float16 (NHWC: [N, H, W, C]).
    scale, bias: [C].
    groups: how many groups the channels split into (a Python int dividing C).
    epsilon: added to the variance (a Python float >= 0; static). flax's default.
    activation: None, "relu", "silu", "gelu", ... (`reference.ACTIVATIONS`).
    implementation: "pallas" (the kernels; interpreted where nothing compiles
      them), "xla" (the reference), or None: the kernels where they compile
      (GPU) or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`.

  Returns:
    y, x's shape and dtype.

  Raises:
    ValueError: for invalid calls (x of rank < 2, scale or bias not [C],
      non-floating arrays, C not divisible by groups, epsilon not a finite
      Python float >= 0, an unknown activation or implementation). A call the
      kernels cannot run (dtypes, a group too wide for one tile, backend, size
      limits) is not an error: it runs the XLA reference and is recorded in
      `pallas_kernels.fallbacks()`.
  """
  x, scale, bias = jnp.asarray(x), jnp.asarray(scale), jnp.asarray(bias)
  act = _check(x, scale, bias, groups, epsilon, activation, implementation, config)
  groups, epsilon = int(groups), float(epsilon)
  return _dispatch(
      x, scale, bias, groups=groups, implementation=implementation, interpret=interpret,
      config=config, kernel=lambda static: _run(x, scale, bias, static),
      fallback=lambda: _reference(x, scale, bias, groups=groups, epsilon=epsilon,
                                  activation=act),
      static=dict(groups=groups, epsilon=epsilon, activation=act))


def _dispatch(x, scale, bias, *, groups: int, implementation, interpret, config, kernel,
              fallback, static: dict):
  """`kernel(vjp.Static)` where the kernels run these arguments, else
  `fallback()` (recorded with the guard's reason where it said no)."""
  if implementation == "xla":
    return fallback()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return fallback()
    n, c = x.shape[0], x.shape[-1]
    cfg = config or config_lib.choose_config(n, math.prod(x.shape[1:-1]), c, groups, interp)
    reason = guard.unsupported_reason(x, scale, bias, groups=groups, interpret=interp,
                                      config=cfg)
    if reason:
      guard_lib.record_fallback("group_norm", reason,
                                guard_lib.signature(x=x, scale=scale, bias=bias))
      return fallback()
    return kernel(vjp.Static(cfg=cfg, interpret=interp, target=backend_lib.target(),
                             **static))

  return backend_lib.dispatch(interpret, (x, scale, bias), launch)


# The swap's two calls for a group norm in a training step: the forward with
# the statistics the program computes beside y, and the backward from them
# (not through `jax.vjp`, which would run the forward again).


@functools.partial(jax.jit, static_argnums=(3, 4))
def _run_statistics(x, scale, bias, static: vjp.Static, pooled: bool):
  y, mean, rstd = vjp.forward(x.reshape(x.shape[0], -1, x.shape[-1]), scale, bias, static,
                              pooled=pooled)
  # The kernel keeps rstd; the program holds the variance. Back and forth
  # (the backward takes rsqrt(var + epsilon) again) moves rstd by an ulp or so.
  return (y if pooled else y.reshape(x.shape), mean,
          1.0 / jnp.square(rstd) - static.epsilon)


@functools.partial(jax.jit, static_argnums=(5, 7))
def _run_backward(x, scale, bias, mean, var, static: vjp.Static, g, dx_sum: bool):
  x3 = x.reshape(x.shape[0], -1, x.shape[-1])
  rstd = jax.lax.rsqrt(var + static.epsilon)
  g = g.reshape(x3.shape if g.size == x.size else (x3.shape[0], x3.shape[2]))
  dx, *rest = vjp.backward(x3, g, scale, bias, mean, rstd, static, dx_sum=dx_sum)
  return dx.reshape(x.shape), *rest


def group_norm_with_statistics(x, scale, bias, *, groups: int, epsilon: float = 1e-6,
                               activation: str | None = None,
                               implementation: str | None = None,
                               interpret: bool | None = None, config: Config | None = None,
                               pooled: bool = False):
  """(y, mean, var): `group_norm`'s y and the f32 [N, G] statistics it
  normalized with (the variance clamped at 0, as the reference's). With
  `pooled`, y's f32 sum over every axis but the first and last ([N, C], what
  a global average pool divides) instead of y, which is then never written."""
  x, scale, bias = jnp.asarray(x), jnp.asarray(scale), jnp.asarray(bias)
  act = _check(x, scale, bias, groups, epsilon, activation, implementation, config)
  groups, epsilon = int(groups), float(epsilon)

  def fallback():
    y = _reference(x, scale, bias, groups=groups, epsilon=epsilon, activation=act)
    if pooled:
      y = jnp.sum(y.astype(jnp.float32), axis=tuple(range(1, x.ndim - 1)))
    return (y, *reference.statistics(x, groups=groups))

  return _dispatch(
      x, scale, bias, groups=groups, implementation=implementation, interpret=interpret,
      config=config, kernel=lambda static: _run_statistics(x, scale, bias, static, pooled),
      fallback=fallback, static=dict(groups=groups, epsilon=epsilon, activation=act))


def group_norm_backward(x, scale, bias, mean, var, cotangent, *, groups: int,
                        epsilon: float = 1e-6, activation: str | None = None,
                        implementation: str | None = None, interpret: bool | None = None,
                        config: Config | None = None, dx_sum: bool = False):
  """(dx, dscale, dbias) of `group_norm` at y's `cotangent`, from the
  forward's f32 [N, G] `mean` and `var`; in x's, scale's and bias's dtypes.
  The cotangent is y's shape, or [N, 1, ..., 1, C]: the same for every
  position of a sample (a global average pool's gradient), read so, never
  broadcast in memory. With `dx_sum`, also dx summed over every axis but the
  last, in f32 (the gradient of a bias added to x: the kernel sums dx as it
  writes it)."""
  x, scale, bias = jnp.asarray(x), jnp.asarray(scale), jnp.asarray(bias)
  act = _check(x, scale, bias, groups, epsilon, activation, implementation, config)
  groups, epsilon = int(groups), float(epsilon)
  mean, var = (jnp.asarray(a, jnp.float32).reshape(x.shape[0], groups) for a in (mean, var))
  cotangent = jnp.asarray(cotangent)
  rows = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
  if cotangent.shape not in (tuple(x.shape), rows):
    _fail(f"cotangent.shape {tuple(cotangent.shape)} must be x's {tuple(x.shape)} or "
          f"{rows}")

  def fallback():
    _, pull = jax.vjp(lambda x, s, b: reference.group_norm(
        x, s, b, groups=groups, epsilon=epsilon, activation=act), x, scale, bias)
    dx, dscale, dbias = pull(jnp.broadcast_to(cotangent, x.shape).astype(x.dtype))
    summed = (jnp.sum(dx.astype(jnp.float32), axis=tuple(range(x.ndim - 1))),)
    return (dx, dscale, dbias) + (summed if dx_sum else ())

  def kernel(static):
    dx, dscale, dbias, *summed = _run_backward(x, scale, bias, mean, var, static,
                                               cotangent, dx_sum)
    return (dx, dscale.astype(scale.dtype), dbias.astype(bias.dtype), *summed)

  return _dispatch(
      x, scale, bias, groups=groups, implementation=implementation, interpret=interpret,
      config=config, kernel=kernel, fallback=fallback,
      static=dict(groups=groups, epsilon=epsilon, activation=act))
