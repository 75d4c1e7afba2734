"""`pallas_kernels.adam_matmul`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.adam_matmul import config as config_lib
from pallas_kernels._src.ops.adam_matmul import guard
from pallas_kernels._src.ops.adam_matmul import kernel
from pallas_kernels._src.ops.adam_matmul import reference
from pallas_kernels._src.ops.adam_matmul.config import Config

IMPLEMENTATIONS = ("pallas", "xla")
_F32 = jnp.float32


def _fail(message: str) -> None:
  raise ValueError(f"adam_matmul: {message}")


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def _check(x, dy, param, mu, nu, count, learning_rate, hyper: adam.Hyper,
           transpose_x, implementation, config) -> None:
  for name, a in (("x", x), ("dy", dy)):
    if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating):
      _fail(f"{name} must be a real floating array, got {jnp.dtype(a.dtype).name}{_shape(a)}")
  if x.ndim != 2 or dy.ndim != 2:
    _fail(f"x and dy must be 2-D (batch dims flattened into M), got x{_shape(x)} "
          f"dy{_shape(dy)}")
  m, k = (x.shape if transpose_x else x.shape[::-1])
  if dy.shape[0] != m:
    layout = "[M, K]" if transpose_x else "[K, M] (transpose_x=False)"
    _fail(f"x{_shape(x)} read as {layout} has M={m} but dy{_shape(dy)} has M={dy.shape[0]}")
  adam.check(_fail, param=param, mu=mu, nu=nu, shape=[int(k), int(dy.shape[1])],
             layout="[K, N]", count=count, learning_rate=learning_rate, constants=hyper)
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be an adam_matmul Config, got {type(config).__name__}")


@functools.partial(jax.jit, static_argnames=("hyper", "transpose_x"))
def _reference(x, dy, param, mu, nu, count, learning_rate, *, hyper, transpose_x):
  # Jitted so that eager calls run one XLA program, not op-by-op.
  return reference.adam_matmul(x, dy, param, mu, nu, count, learning_rate=learning_rate,
                               transpose_x=transpose_x, **hyper.options())


@functools.partial(jax.custom_jvp, nondiff_argnums=(8,))
def _step(x, dy, param, mu, nu, lr, c1, c2, static):
  hyper, transpose_x, cfg, interpret, in_place = static
  return kernel.adam_step(x, dy, param, mu, nu, lr, c1, c2, hyper=hyper,
                          transpose_x=transpose_x, cfg=cfg, interpret=interpret,
                          in_place=in_place)


@_step.defjvp
def _no_derivative(static, primals, tangents):
  del static, primals, tangents
  raise TypeError("adam_matmul is an optimizer step and has no derivative; "
                  "differentiate the reference (implementation='xla') instead")


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnames=("hyper", "transpose_x", "cfg", "interpret",
                                             "in_place", "target"))
def _run(x, dy, param, mu, nu, count, learning_rate, *, hyper, transpose_x, cfg, interpret,
         in_place, target):
  c1, c2 = adam.corrections(count, hyper.b1, hyper.b2)
  lr = jnp.asarray(learning_rate, _F32).reshape(1)
  with backend_lib.targeting(target):
    return _step(x, dy, param, mu, nu, lr, c1, c2,
                 (hyper, transpose_x, cfg, interpret, in_place))


def adam_matmul(x: jax.Array, dy: jax.Array, param: jax.Array, mu: jax.Array,
                nu: jax.Array, count: jax.Array, *, learning_rate: float | jax.Array,
                b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                eps_root: float = 0.0, weight_decay: float = 0.0,
                transpose_x: bool = True, in_place: bool = True,
                implementation: str | None = None, interpret: bool | None = None,
                config: Config | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A dense layer's weight gradient and its Adam step in one kernel.

  g = x^T @ dy is accumulated in float32 tile by tile, and each tile of the
  weight is updated where its gradient lies in registers: the gradient is
  never written to memory, nor read back by a separate update. XLA writes
  dW and reads it again (with the parameter and both moments) in the
  optimizer's fusion. The step is optax's `adamw` (`adam` when weight_decay
  is 0), term by term in optax's order (`reference.adam_matmul`)::

    g = jnp.dot(x.T, dy, preferred_element_type=f32)
    t = count + 1
    mu = (1 - b1) * g + b1 * mu
    nu = (1 - b2) * g**2 + b2 * nu
    u = (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    param = param - learning_rate * (u + weight_decay * param)

  It is an optimizer step, not a differentiable function: it has no VJP
  (differentiating the kernel raises TypeError; the reference,
  implementation="xla", is plain jnp).

  Args:
    x: [M, K] activations of the layer's input (batch dims flattened into
      M), float32/bfloat16/float16; [K, M] with transpose_x=False.
    dy: [M, N] the loss's gradient with respect to the layer's output, x's dtype.
    param: [K, N] the weight; mu, nu: [K, N] Adam's first and second
      moments (optax's `ScaleByAdamState.mu` / `.nu`), float32 or one dtype
      for all three.
    count: int32 scalar, the step count before this step (optax's
      `ScaleByAdamState.count`).
    learning_rate: a float or a float32 scalar array (a schedule's value).
    b1, b2, eps, eps_root, weight_decay: optax's `adamw` constants (Python floats).
    transpose_x: True (default) for g = x^T @ dy, x [M, K]; False for
      g = x @ dy, x [K, M].
    in_place: the kernel writes param', mu' and nu' over param, mu and nu
      (their buffers aliased): no new state where the step donates it, but
      a copy of each first where it does not. False writes new arrays.
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`. float32 operands
      multiply in IEEE float32 (Precision.HIGHEST).

  Returns:
    (param', mu', nu') in param's, mu's and nu's dtypes. The count is not
    returned: optax's state holds count + 1 after the step.

  Raises:
    ValueError: for invalid calls (shapes that do not fit, a count that is
      not an integer scalar, an unknown implementation). A call the kernel
      cannot run (dtypes, backend, size limits) is not an error: it runs the
      XLA reference and is recorded in `pallas_kernels.fallbacks()`.
  """
  x, dy, param, mu, nu = (jnp.asarray(a) for a in (x, dy, param, mu, nu))
  count = jnp.asarray(count)
  hyper = adam.hyper(b1, b2, eps, eps_root, weight_decay)
  transpose_x = bool(transpose_x)
  _check(x, dy, param, mu, nu, count, learning_rate, hyper, transpose_x, implementation,
         config)
  operands = (x, dy, param, mu, nu, count)

  def run_reference():
    return _reference(*operands, learning_rate, hyper=hyper, transpose_x=transpose_x)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    m, k = x.shape if transpose_x else x.shape[::-1]
    cfg = config or config_lib.choose_config(m, k, dy.shape[1], x.dtype, interp)
    reason = guard.unsupported_reason(x, dy, param, mu, nu, transpose_x=transpose_x,
                                      interpret=interp, config=cfg)
    if reason:
      guard_lib.record_fallback("adam_matmul", reason, guard_lib.signature(
          x=x, dy=dy, param=param, mu=mu, nu=nu))
      return run_reference()
    return _run(*operands, learning_rate, hyper=hyper, transpose_x=transpose_x, cfg=cfg,
                interpret=interp, in_place=bool(in_place), target=backend_lib.target())

  return backend_lib.dispatch(interpret, (x, dy, param, mu, nu), launch)
