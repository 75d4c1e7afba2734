"""Adam's step as a weight-gradient kernel applies it in its epilogue
(`adam_matmul`, and `conv2d_weight_grad` given the optimizer state): the
constants, the checks of the state a call passes, the guard's rule on the
state's dtypes, and the update of one tile.

The float32 truth the references compute is `adam_reference.py`, written
apart from `tile_update` so that each holds the other.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from pallas_kernels._src import gpu

_F32 = jnp.float32

#: dtypes of param, mu and nu the kernels are written and validated for.
STATE_DTYPES = frozenset({"float32", "bfloat16", "float16"})
#: The epilogue holds the accumulator and the param, mu and nu tiles (four
#: f32 tiles): at most 64 x 128 elements per program on GPU.
GPU_MAX_TILE = 64 * 128


@dataclasses.dataclass(frozen=True, slots=True)
class Hyper:
  """Adam's constants (hashable: they are compiled into the kernel)."""

  b1: float
  b2: float
  eps: float
  eps_root: float
  weight_decay: float

  def options(self) -> dict[str, float]:
    """The constants as the references' keyword arguments."""
    return dataclasses.asdict(self)


def hyper(b1, b2, eps, eps_root, weight_decay) -> Hyper:
  """`Hyper` of a call's constants: real numbers as Python floats; anything
  else is kept as given for `check` to reject by name."""
  def real(v):
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v
  return Hyper(b1=real(b1), b2=real(b2), eps=real(eps), eps_root=real(eps_root),
               weight_decay=real(weight_decay))


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def check(fail: Callable[[str], None], *, param, mu, nu, shape: list[int], layout: str,
          count, learning_rate, constants: Hyper) -> None:
  """Raises (through `fail`, the op's ValueError) for optimizer state that
  no implementation could take.

  Args:
    fail: raises the op's ValueError with a message.
    param, mu, nu: the weight and Adam's moments.
    shape: the gradient's shape, which all three must have.
    layout: how the op names that shape, e.g. "[K, N]".
    count: optax's `ScaleByAdamState.count`.
    learning_rate: a float or a float scalar array.
    constants: the call's `hyper`.
  """
  for name, a in (("param", param), ("mu", mu), ("nu", nu)):
    if not jnp.issubdtype(jnp.dtype(a.dtype), jnp.floating):
      fail(f"{name} must be a real floating array, got {jnp.dtype(a.dtype).name}{_shape(a)}")
  for name, a in (("param", param), ("mu", mu), ("nu", nu)):
    if _shape(a) != list(shape):
      fail(f"{name} must have the gradient's shape {layout}={list(shape)}, got {_shape(a)}")
  if count.ndim != 0 or not jnp.issubdtype(jnp.dtype(count.dtype), jnp.integer):
    fail(f"count must be an integer scalar (optax's ScaleByAdamState.count), got "
         f"{jnp.dtype(count.dtype).name}{_shape(count)}")
  if not isinstance(learning_rate, numbers.Real):
    lr = jnp.asarray(learning_rate)
    if lr.ndim != 0 or not jnp.issubdtype(lr.dtype, jnp.floating):
      fail(f"learning_rate must be a float or a float scalar array, got "
           f"{lr.dtype.name}{_shape(lr)}")
  for name in ("b1", "b2", "eps", "eps_root", "weight_decay"):
    if not isinstance(getattr(constants, name), float):
      fail(f"{name} must be a Python float, got {getattr(constants, name)!r}")


def state_reason(param: Any, mu: Any, nu: Any) -> str | None:
  """Why a kernel cannot update this state (dtypes), or None: each of
  `STATE_DTYPES`, one dtype for all three."""
  for label, a in (("param", param), ("mu", mu), ("nu", nu)):
    if gpu.dtype_name(a.dtype) not in STATE_DTYPES:
      return (f"{gpu.describe(label, a)}: dtype {gpu.dtype_name(a.dtype)} "
              f"{gpu.not_one_of(STATE_DTYPES)}")
  if len({gpu.dtype_name(a.dtype) for a in (param, mu, nu)}) > 1:
    return (f"mixed state dtypes: {gpu.describe('param', param)}, {gpu.describe('mu', mu)}, "
            f"{gpu.describe('nu', nu)}; the kernel takes one dtype for all three")
  return None


def tile_update(g, param, mu, nu, lr, c1, c2, h: Hyper):
  """Adam's step on f32 tiles inside a kernel: (param', mu', nu').

  `lr`, `c1` and `c2` broadcast against the tile (the learning rate and the
  bias corrections 1 - b**t, see `corrections`).
  """
  mu = (1 - h.b1) * g + h.b1 * mu
  nu = (1 - h.b2) * (g * g) + h.b2 * nu
  step = (mu / c1) / (jnp.sqrt(nu / c2 + h.eps_root) + h.eps)
  if h.weight_decay:
    step = step + h.weight_decay * param
  return param + (-lr) * step, mu, nu


def corrections(count, b1: float, b2: float):
  """The bias corrections (1 - b1**t, 1 - b2**t) as f32[1] arrays for
  t = count + 1 (held at the largest int32), computed by XLA outside the
  kernel, the way optax computes them: a traced count does not retrace a
  jitted step."""
  count = jnp.asarray(count, jnp.int32)
  top = jnp.iinfo(jnp.int32).max
  t = jnp.where(count < top, count + 1, top)
  return tuple((1 - b ** t).astype(_F32).reshape(1) for b in (b1, b2))
