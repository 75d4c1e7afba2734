"""`pallas_kernels.conv2d_weight_grad`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops import adam
from pallas_kernels._src.ops.conv2d_weight_grad import config as config_lib
from pallas_kernels._src.ops.conv2d_weight_grad import guard
from pallas_kernels._src.ops.conv2d_weight_grad import kernel
from pallas_kernels._src.ops.conv2d_weight_grad import reference
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.ops.conv2d_weight_grad.reference import Window

IMPLEMENTATIONS = ("pallas", "xla")
_F32 = jnp.float32
#: The optimizer state that asks for Adam's update, all of it or none.
_STATE = ("param", "mu", "nu", "count", "learning_rate")


def _fail(message: str) -> None:
  raise ValueError(f"conv2d_weight_grad: {message}")


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def _state(param, mu, nu, count, learning_rate) -> tuple | None:
  """The optimizer state as arrays (the learning rate as given), or None
  when no update is asked."""
  given = dict(zip(_STATE, (param, mu, nu, count, learning_rate)))
  missing = [name for name, v in given.items() if v is None]
  if len(missing) == len(_STATE):
    return None
  if missing:
    _fail(f"Adam's update needs {', '.join(_STATE[:-1])} and {_STATE[-1]} together; "
          f"missing {', '.join(missing)}")
  return (*(jnp.asarray(a) for a in (param, mu, nu, count)), learning_rate)


def _check(x, dy, kernel_size, stride, padding, dilation, groups, column_sum, out_dtype,
           state, hyper: adam.Hyper, implementation, config) -> Window:
  for name, a in (("x", x), ("dy", dy)):
    if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating) and \
        not jnp.issubdtype(jnp.dtype(a.dtype), jnp.integer):
      _fail(f"{name} must be a real floating or integer array, got "
            f"{jnp.dtype(a.dtype).name}{_shape(a)}")
    if a.ndim != 4:
      _fail(f"{name} must be NHWC, 4 axes, got shape {_shape(a)}")
  try:
    win = reference.window(x.shape, kernel_size, stride=stride, padding=padding,
                           dilation=dilation, groups=groups)
  except ValueError as e:
    _fail(str(e))
  c, f = x.shape[-1], dy.shape[-1]
  if c % groups or f % groups:
    _fail(f"groups={groups} must divide x's channels C={c} and dy's F={f}")
  want = (x.shape[0], *win.out_size(x.shape[1], x.shape[2]))
  if tuple(dy.shape[:3]) != want:
    _fail(f"dy{_shape(dy)} does not match the convolution's output [N, HO, WO]="
          f"{list(want)} for x{_shape(x)}, kernel {win.kernel}, stride {win.stride}, "
          f"dilation {win.dilation}, padding {win.padding}")
  if not isinstance(column_sum, bool):
    _fail(f"column_sum must be a bool, got {column_sum!r}")
  if state is not None:
    if out_dtype is not None:
      _fail("out_dtype is dw's dtype, and with the optimizer state nothing returns dw: "
            "param', mu' and nu' keep param's, mu's and nu's dtypes")
    param, mu, nu, count, learning_rate = state
    adam.check(_fail, param=param, mu=mu, nu=nu,
               shape=[*win.kernel, int(c) // groups, int(f)], layout="[KH, KW, C/groups, F]",
               count=count, learning_rate=learning_rate, constants=hyper)
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a conv2d_weight_grad Config, got {type(config).__name__}")
  return win


@functools.partial(jax.jit, static_argnames=("win", "column_sum", "out_dtype"))
def _reference(x, dy, *, win: Window, column_sum: bool, out_dtype: str):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.conv2d_weight_grad(x, dy, win, column_sum_=column_sum,
                                      out_dtype=out_dtype)


@functools.partial(jax.jit, static_argnames=("win", "column_sum", "hyper"))
def _reference_adam(x, dy, param, mu, nu, count, learning_rate, *, win: Window,
                    column_sum: bool, hyper: adam.Hyper):
  return reference.adam_step(x, dy, win, param, mu, nu, count, learning_rate=learning_rate,
                             column_sum_=column_sum, **hyper.options())


@dataclasses.dataclass(frozen=True, slots=True)
class Static:
  """Everything about a call that is not an array (hashable)."""

  win: Window
  column_sum: bool
  out_dtype: str
  config: Config
  interpret: bool
  #: The device traced for (part of the trace cache's key).
  target: backend_lib.Target
  #: Adam's constants when its update is the epilogue, else None.
  hyper: adam.Hyper | None = None
  #: The update writes over the state (aliased), as `adam_matmul` does.
  in_place: bool = True


@functools.partial(jax.jit, static_argnums=(2,))
def _run(x, dy, static: Static):
  out = kernel.weight_grad(x, dy, static.win, column_sum=static.column_sum,
                           cfg=static.config, interpret=static.interpret)
  if static.column_sum:
    dw, db = out
    return dw.astype(static.out_dtype), db
  return out.astype(static.out_dtype)


@functools.partial(jax.jit, static_argnums=(7,))
def _run_adam(x, dy, param, mu, nu, count, learning_rate, static: Static):
  # The corrections and the learning rate are traced values: a step's new
  # count does not retrace.
  c1, c2 = adam.corrections(count, static.hyper.b1, static.hyper.b2)
  lr = jnp.asarray(learning_rate, _F32).reshape(1)
  return kernel.adam_step(x, dy, static.win, param, mu, nu, lr, c1, c2, hyper=static.hyper,
                          column_sum=static.column_sum, cfg=static.config,
                          interpret=static.interpret, in_place=static.in_place)


def conv2d_weight_grad(x: jax.Array, dy: jax.Array, kernel_size: int | tuple[int, int], *,
                       stride: int | tuple[int, int] = 1,
                       padding: str | tuple[tuple[int, int], tuple[int, int]] = "SAME",
                       dilation: int | tuple[int, int] = 1, groups: int = 1,
                       column_sum: bool = False, out_dtype: Any = None,
                       param: jax.Array | None = None, mu: jax.Array | None = None,
                       nu: jax.Array | None = None, count: jax.Array | None = None,
                       learning_rate: float | jax.Array | None = None, b1: float = 0.9,
                       b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                       weight_decay: float = 0.0, in_place: bool = True,
                       implementation: str | None = None, interpret: bool | None = None,
                       config: Config | None = None):
  """The weight gradient of a 2-D convolution, and optionally dy's column sum;
  given the optimizer state, Adam's step on that gradient instead.

  For y = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation,
  feature_group_count=groups, dimension_numbers=("NHWC", "HWIO", "NHWC")),
  returns dL/dw [KH, KW, C // groups, F] given x [N, H, W, C] and dy = dL/dy
  [N, HO, WO, F]: per tap (kh, kw), x_tap^T @ dy over the N*HO*WO output
  pixels, x_tap gathered tile by tile in the kernel (no im2col buffer).
  With `column_sum=True` the kernel also sums the dy tiles it loads, so the
  bias (or batch/group-norm beta) gradient sum(dy, axis=(0, 1, 2)) costs no
  second read of dy. The jnp equivalent (`reference.conv2d_weight_grad`)::

    _, pullback = jax.vjp(lambda w: conv(x, w), w0)
    dw = pullback(dy)[0].astype(out_dtype)
    db = jnp.sum(dy.astype(f32), axis=(0, 1, 2))

  Adam's update. Given `param`, `mu`, `nu`, `count` and `learning_rate`
  (all of them, or none), each program updates its tile of the weight where
  its float32 gradient lies in registers, as `adam_matmul` does for a dense
  layer: dw is never written, nor read back by a separate update. The step
  is optax's `adamw` (`adam` when weight_decay is 0), term by term in
  optax's order (`reference.adam_step`)::

    g = dw in float32;  t = count + 1
    mu = (1 - b1) * g + b1 * mu
    nu = (1 - b2) * g**2 + b2 * nu
    u = (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t) + eps_root) + eps)
    param = param - learning_rate * (u + weight_decay * param)

  The pixels are then not split across programs (each sums its tile's whole
  gradient before updating it).

  Depthwise (groups == C) and grouped convolutions are supported; the
  depthwise kernel multiply-accumulates per channel instead of a dot.

  Not differentiable: it is itself a gradient, and no second derivative is
  defined for it (differentiate the forward convolution twice instead).

  Args:
    x: [N, H, W, C], float32/bfloat16/float16.
    dy: [N, HO, WO, F], x's dtype; HO, WO must be the convolution's.
    kernel_size: (KH, KW), or one int for both.
    stride: an int or an (h, w) pair.
    padding: "SAME", "VALID" or ((top, bottom), (left, right)), as lax's.
    dilation: the kernel's (rhs) dilation, an int or an (h, w) pair.
    groups: feature groups (lax's feature_group_count); C and F divisible by it.
    column_sum: also return sum(dy, axis=(0, 1, 2)) in float32 [F].
    out_dtype: dtype of dw (default x.dtype); accumulation is float32. Not
      with the optimizer state (nothing returns dw).
    param: the HWIO weight [KH, KW, C // groups, F]; mu, nu: Adam's first
      and second moments of its shape (optax's `ScaleByAdamState.mu` /
      `.nu`), float32 or one dtype for all three.
    count: int32 scalar, the step count before this step (optax's
      `ScaleByAdamState.count`).
    learning_rate: a float or a float32 scalar array (a schedule's value).
    b1, b2, eps, eps_root, weight_decay: optax's `adamw` constants (Python
      floats); read only with the optimizer state.
    in_place: with the state, write param', mu' and nu' over param, mu and
      nu (aliased): no new state where the step donates it, a copy of each
      first where it does not; False writes new arrays.
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`. float32 operands
      multiply in IEEE float32 (Precision.HIGHEST). With the optimizer state
      its `splits` must be 1 (else the call runs XLA and says why).

  Returns:
    dw [KH, KW, C // groups, F] in out_dtype; with column_sum, (dw, db).
    Given the optimizer state: (param', mu', nu') in param's, mu's and nu's
    dtypes; with column_sum, (param', mu', nu', db). The count is not
    returned: optax's state holds count + 1 after the step.

  Raises:
    ValueError: for invalid calls (non-NHWC arrays, a dy that is not the
      convolution's output shape, groups not dividing C and F, a malformed
      window, an unknown implementation; part of the optimizer state, state
      not shaped like the weight, a count that is not an integer scalar,
      out_dtype with the state). A call the kernel cannot run (dtypes,
      backend, size limits) is not an error: it runs the XLA reference and
      is recorded in `pallas_kernels.fallbacks()`.
  """
  x, dy = jnp.asarray(x), jnp.asarray(dy)
  state = _state(param, mu, nu, count, learning_rate)
  hyper = adam.hyper(b1, b2, eps, eps_root, weight_decay)
  win = _check(x, dy, kernel_size, stride, padding, dilation, groups, column_sum, out_dtype,
               state, hyper, implementation, config)
  odt = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
  operands = (x, dy) + (state[:3] if state else ())

  def run_reference():
    if state:
      return _reference_adam(x, dy, *state, win=win, column_sum=column_sum, hyper=hyper)
    return _reference(x, dy, win=win, column_sum=column_sum, out_dtype=odt.name)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    n, ho, wo, f = dy.shape
    cg = x.shape[-1] // win.groups
    cfg = config or config_lib.choose_config(n * ho * wo, cg, f // win.groups, win.taps,
                                             win.groups, x.dtype, interp,
                                             update=state is not None)
    reason = guard.unsupported_reason(x, dy, win, out_dtype=odt, interpret=interp,
                                      config=cfg, state=state[:3] if state else None)
    if reason:
      arrays = dict(x=x, dy=dy) | (dict(zip(_STATE[:3], state[:3])) if state else {})
      guard_lib.record_fallback("conv2d_weight_grad", reason, guard_lib.signature(**arrays))
      return run_reference()
    static = Static(win=win, column_sum=column_sum, out_dtype=odt.name, config=cfg,
                    interpret=interp, target=backend_lib.target(),
                    hyper=hyper if state else None, in_place=bool(in_place))
    if state:
      return _run_adam(x, dy, *state, static)
    return _run(x, dy, static)

  return backend_lib.dispatch(interpret, operands, launch)
