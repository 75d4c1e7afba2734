"""`pallas_kernels.conv2d`: validation, implementation choice, guard, launch."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import guard as guard_lib
from pallas_kernels._src.ops.conv2d import config as config_lib
from pallas_kernels._src.ops.conv2d import guard
from pallas_kernels._src.ops.conv2d import reference
from pallas_kernels._src.ops.conv2d import vjp
from pallas_kernels._src.ops.conv2d.config import Config

IMPLEMENTATIONS = ("pallas", "xla")

Padding = str | Sequence[Sequence[int]]


def _fail(message: str) -> None:
  raise ValueError(f"conv2d: {message}")


def _shape(a) -> list[int]:
  return [int(d) for d in a.shape]


def _check(x, w, groups, scale, shift, bias, residual, out_hw, activations, implementation,
           config) -> None:
  for name, a in (("x", x), ("w", w), ("scale", scale), ("shift", shift), ("bias", bias),
                  ("residual", residual)):
    if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
      _fail(f"{name} must be a real floating array, got {jnp.dtype(a.dtype).name}"
            f"{_shape(a)}")
  if x.ndim != 4:
    _fail(f"x must be NHWC [N, H, W, C], got shape {_shape(x)}")
  if w.ndim != 4:
    _fail(f"w must be HWIO [KH, KW, C/groups, F], got shape {_shape(w)}")
  n, _, _, c = _shape(x)
  f = int(w.shape[3])
  if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
    _fail(f"groups must be a positive int, got {groups!r}")
  if c % groups or f % groups:
    _fail(f"groups={groups} must divide C={c} (x{_shape(x)}) and F={f} (w{_shape(w)})")
  if int(w.shape[2]) != c // groups:
    _fail(f"w{_shape(w)} must have C/groups = {c // groups} input channels (x{_shape(x)}, "
          f"groups={groups})")
  if min(w.shape[0], w.shape[1]) < 1:
    _fail(f"w{_shape(w)} has an empty window")
  for name, v, size in (("scale", scale, c), ("shift", shift, c), ("bias", bias, f)):
    if v is not None and _shape(v) != [size]:
      _fail(f"{name} must have shape [{size}], got {_shape(v)}")
  ho, wo = out_hw
  if ho < 1 or wo < 1:
    _fail(f"the window does not fit the padded input: output [{ho}, {wo}] from "
          f"x{_shape(x)}, w{_shape(w)}")
  if residual is not None and _shape(residual) != [n, ho, wo, f]:
    _fail(f"residual must have the output's shape {[n, ho, wo, f]}, got {_shape(residual)}")
  for a in activations:
    reference.canonical_activation(a)
  if implementation not in (None,) + IMPLEMENTATIONS:
    _fail(f"implementation must be one of {IMPLEMENTATIONS} or None, got {implementation!r}")
  if config is not None and not isinstance(config, Config):
    _fail(f"config must be a conv2d Config, got {type(config).__name__}")


_STATIC = ("stride", "padding", "dilation", "groups", "prologue_activation", "activation",
           "out_dtype", "statistics")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _reference(x, w, scale, shift, bias, residual, **static):
  # Jitted so that eager calls run one fused XLA program, not op-by-op.
  return reference.conv2d(x, w, scale=scale, shift=shift, bias=bias, residual=residual,
                          **static)


@guard_lib.register_traced
@functools.partial(jax.jit, static_argnums=(6,))
def _run(x, w, scale, shift, bias, residual, static: vjp.Static):
  return vjp.conv2d(x, w, scale, shift, bias, residual, static)


def conv2d(x: jax.Array, w: jax.Array, *, stride: int | Sequence[int] = 1,
           padding: Padding = "SAME", dilation: int | Sequence[int] = 1, groups: int = 1,
           scale: jax.Array | None = None, shift: jax.Array | None = None,
           prologue_activation: str | None = None, bias: jax.Array | None = None,
           activation: str | None = None, residual: jax.Array | None = None,
           out_dtype: Any = None, statistics: bool = False,
           implementation: str | None = None, interpret: bool | None = None,
           config: Config | None = None):
  """A 2-D convolution with its input's batch norm, activation and padding
  applied on load, and its bias, activation, residual and batch-norm
  statistics applied to the accumulator: one kernel where XLA runs three.

  XLA writes the batch-normed, activated, zero-padded input to memory for the
  convolution to read back, and reads the convolution's output again for
  the epilogue and for the next batch norm's statistics. The jnp equivalent
  (`reference.conv2d`)::

    v = act_in(x.astype(f32) * scale + shift).astype(x.dtype)
    v = jnp.pad(v, ((0, 0), (top, bottom), (left, right), (0, 0)))
    acc = lax.conv_general_dilated(v, w, stride, "VALID", rhs_dilation=dilation,
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                   feature_group_count=groups,
                                   preferred_element_type=f32)
    z = act(acc + bias) + residual
    y = z.astype(out_dtype)
    stats = (z.sum((0, 1, 2)), (z * z).sum((0, 1, 2)))   # statistics=True

  Padded positions are zeros after the prologue, as above (not act(shift)).

  What runs where, with implementation="pallas":
    * forward: one Pallas kernel (the prologue on the gathered input tiles,
      masked for the padding; f32 accumulation; the epilogue; per-tile
      partial statistics, summed by a small XLA reduction);
    * backward: XLA, by design (not a fallback, nothing recorded): the
      reference's VJP, recomputing the prologue from x (see `vjp.py`).
  With implementation="xla" (or a guard fallback) the reference runs and is
  differentiated by JAX.

  Args:
    x: [N, H, W, C], float32/bfloat16/float16.
    w: [KH, KW, C/groups, F] (HWIO), x's dtype.
    stride: an int or (vertical, horizontal).
    padding: "SAME", "VALID" or ((top, bottom), (left, right)).
    dilation: the window's (rhs) dilation, an int or a pair.
    groups: feature groups; groups == C is a depthwise convolution (F a
      multiple of C).
    scale, shift: [C] or None: x * scale + shift (a batch norm's apply) on load.
    prologue_activation: one of `reference.ACTIVATIONS` (None: identity),
      after scale and shift.
    bias: [F] or None, added to the accumulator.
    activation: one of `reference.ACTIVATIONS` (None: identity), after bias.
    residual: [N, HO, WO, F] or None, added after the activation.
    out_dtype: dtype of y (default x.dtype).
    statistics: also return per-channel f32 (sum, sum of squares) of the
      output before the cast, over N, HO and WO.
    implementation: "pallas" (the kernel; interpreted where nothing compiles
      it), "xla" (the reference), or None: the kernel where it compiles (GPU)
      or when `interpret=True` is passed, else XLA.
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    config: tiling; None picks `config.heuristic_config`. float32 operands
      multiply in IEEE float32 (Precision.HIGHEST).

  Returns:
    y [N, HO, WO, F] in out_dtype, or (y, (sum, sum_of_squares)) with
    `statistics=True`. Differentiable with respect to x, w, scale, shift,
    bias and residual.

  Raises:
    ValueError: for invalid calls (shapes that do not fit, an unknown
      activation, padding or implementation). A call the kernel cannot run
      (dtypes, backend, size limits) is not an error: it runs the XLA
      reference and is recorded in `pallas_kernels.fallbacks()`.
  """
  x, w = jnp.asarray(x), jnp.asarray(w)
  scale, shift, bias, residual = (None if a is None else jnp.asarray(a)
                                  for a in (scale, shift, bias, residual))
  if x.ndim != 4 or w.ndim != 4:
    _fail(f"x must be NHWC and w HWIO (4-D), got x{_shape(x)} w{_shape(w)}")
  strides = reference.pair(stride, "stride")
  dilations = reference.pair(dilation, "dilation")
  pads = reference.resolve_padding(padding, tuple(_shape(x)[1:3]), tuple(_shape(w)[:2]),
                                   strides, dilations)
  out_hw = reference.output_hw(_shape(x)[1:3], _shape(w)[:2], strides, dilations, pads)
  _check(x, w, groups, scale, shift, bias, residual, out_hw,
         (prologue_activation, activation), implementation, config)
  odt = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
  act_in = reference.canonical_activation(prologue_activation)
  act = reference.canonical_activation(activation)
  statistics = bool(statistics)
  operands = (x, w, scale, shift, bias, residual)

  def run_reference():
    return _reference(*operands, stride=strides, padding=pads, dilation=dilations,
                      groups=groups, prologue_activation=act_in, activation=act,
                      out_dtype=odt.name, statistics=statistics)

  if implementation == "xla":
    return run_reference()

  def launch(interp: bool):
    if (implementation or backend_lib.default_implementation(interpret)) == "xla":
      return run_reference()
    c, f = int(x.shape[3]), int(w.shape[3])
    cfg = config or config_lib.choose_config(
        out_hw[0] * out_hw[1], f if c // groups == 1 else f // groups, c // groups,
        x.dtype, interp, depthwise=c // groups == 1)
    reason = guard.unsupported_reason(x, w, scale=scale, shift=shift, bias=bias,
                                      residual=residual, out_dtype=odt, groups=groups,
                                      out_hw=out_hw, interpret=interp, config=cfg)
    if reason:
      guard_lib.record_fallback("conv2d", reason, guard_lib.signature(
          x=x, w=w, scale=scale, shift=shift, bias=bias, residual=residual))
      return run_reference()
    static = vjp.Static(stride=strides, padding=pads, dilation=dilations, groups=groups,
                        prologue_activation=act_in, activation=act, statistics=statistics,
                        out_dtype=odt.name, config=cfg, interpret=interp,
                        target=backend_lib.target())
    return _run(*operands, static)

  return backend_lib.dispatch(interpret, operands, launch)
