"""The Pallas conv2d kernel: prologue on load, implicit-GEMM convolution,
epilogue and batch-norm statistics on the accumulator.

Layout. x [N, H, W, C] is read as [N, H*W, C] and the result written as
[N, HO*WO, F] (free reshapes): a pixel is one row index, its channels are
contiguous. w [KH, KW, C/G, F] is read as [KH*KW, C/G, F].

Grid (N, T, J): image n; T = cdiv(HO*WO, block_p) runs of output pixels
(flattened, so a tile is one or more output rows and any WO fits a
power-of-two tile); J = G * cdiv(F/G, block_f) output-channel tiles, each
inside one group, so a tile's columns contract over the same C/G input
channels (depthwise: J = cdiv(F, block_f), see below). A program loops over
the KH*KW taps times cdiv(C/G, block_c) channel steps (one `fori_loop`: the
body is traced once, whatever the window). Per step it computes, for each of
its output pixels (oh, ow), the input pixel the tap reads,
ih = oh*sh - pad_top + kh*dh and iw = ow*sw - pad_left + kw*dw, and gathers
those rows' channels with an index array (`x[ih*W + iw, c]`), masked where
(ih, iw) falls in the padding or the tile runs past the image. The prologue
(x * scale + shift, the activation) runs on the gathered f32 values, and
the mask then zeroes the padded positions: padding comes after the prologue
(act(shift) must not leak into the border), and no padded copy of x is ever
written. The tile is rounded to x's dtype (the array XLA would write) and
fed to an f32-accumulating dot with the [block_c, block_f] weight tile.

Depthwise (C/G == 1, F = C * M): no contraction, so no dot. Output channel
f reads input channel f // M; a tile of block_f output channels gathers its
columns' input channels by index and multiplies element-wise with the tap's
weight row, accumulating in f32.

Epilogue, in f32 on the accumulator: + bias, activation, + residual; then
the tile is stored (cast to out_dtype) and, for `statistics`, its column
sum and sum of squares over its valid pixels are stored as one partial row
of [N, T, F] f32 arrays, which XLA sums over N and T (a small combine).

Why gathers rather than strided block loads: a strided window and a window
starting in the padding both need per-pixel offsets, and an index array
expresses both for Triton (pointer arithmetic with a mask) and for interpret
mode (a clamped gather: masked lanes read a safe pixel and are then
zeroed). All accesses go through masked loads and stores (see `gpu.py`).
Output blocks span all F columns and each program stores its own block_f
columns of them, so one program's store never touches another's.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.conv2d.config import Config
from pallas_kernels._src.ops.matmul.kernel import activation_fn as matmul_activation_fn
from pallas_kernels._src.ops.matmul.kernel import activation_grad as matmul_activation_grad

_F32 = jnp.float32


def activation_fn(name: str, v: jax.Array) -> jax.Array:
  """Activation `name` on float32 v, with Triton-lowerable ops."""
  if name == "relu6":
    return jnp.minimum(jnp.maximum(v, 0.0), 6.0)
  if name == "hard_sigmoid":
    return jnp.minimum(jnp.maximum(v + 3.0, 0.0), 6.0) * (1.0 / 6.0)
  if name == "hard_swish":
    return v * (jnp.minimum(jnp.maximum(v + 3.0, 0.0), 6.0) * (1.0 / 6.0))
  return matmul_activation_fn(name, v)


def activation_grad(name: str, v: jax.Array) -> jax.Array:
  """d act(v) / dv on float32 v, as jax.nn differentiates it: relu6's is 0
  at 0 and at 6, the hard gates' 0 at -3 and at 3."""
  if name in ("relu6", "hard_sigmoid", "hard_swish"):
    lo, hi, slope = (0.0, 6.0, 1.0) if name == "relu6" else (-3.0, 3.0, 1.0 / 6.0)
    inside = jnp.where((v > lo) & (v < hi), slope, 0.0)
    if name == "hard_swish":
      return activation_fn("hard_sigmoid", v) + v * inside
    return inside
  return matmul_activation_grad(name, v)


@dataclasses.dataclass(frozen=True, slots=True)
class Geometry:
  """The convolution's static shape: input, window, output."""

  n: int
  h: int
  w: int
  c: int
  f: int
  kh: int
  kw: int
  groups: int
  stride: tuple[int, int]
  dilation: tuple[int, int]
  #: (top, left): how far the window's first tap starts before the image.
  pad_lo: tuple[int, int]
  ho: int
  wo: int

  @property
  def c_group(self) -> int:
    return self.c // self.groups

  @property
  def f_group(self) -> int:
    return self.f // self.groups

  @property
  def depthwise(self) -> bool:
    """One input channel per group: an element-wise product per tap."""
    return self.c_group == 1

  @property
  def pixels(self) -> int:
    return self.ho * self.wo


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """Static description of one launch."""

  geom: Geometry
  cfg: Config
  has_scale: bool
  has_shift: bool
  prologue_activation: str
  has_bias: bool
  activation: str
  has_residual: bool
  statistics: bool
  x_dtype: str
  interpret: bool

  @property
  def has_prologue(self) -> bool:
    return self.has_scale or self.has_shift or self.prologue_activation != "identity"


def _div(a, b: int):
  # Truncating division of non-negative ints: jnp's floor `//` lowers through
  # sign fix-ups Pallas' Triton lowering rejects.
  return jax.lax.div(a, jnp.asarray(b, a.dtype))


def _rem(a, b: int):
  return jax.lax.rem(a, jnp.asarray(b, a.dtype))


def _load(ref, mask):
  return gpu.load(ref, mask, 0.0)


def _gather_pixels(p: _Launch, pix_ok, oh, ow, tap):
  """(offsets into x's H*W rows, validity) of the input pixels tap `tap` reads."""
  g = p.geom
  ki, kj = _div(tap, g.kw), _rem(tap, g.kw)
  ih = oh * g.stride[0] - g.pad_lo[0] + ki * g.dilation[0]
  iw = ow * g.stride[1] - g.pad_lo[1] + kj * g.dilation[1]
  ok = pix_ok & (ih >= 0) & (ih < g.h) & (iw >= 0) & (iw < g.w)
  # Masked lanes read pixel 0: in range for interpret mode's gather, never
  # dereferenced by Triton's masked load.
  return jnp.where(ok, ih * g.w + iw, 0), ok


def _prologue(p: _Launch, v, scale, shift, mask):
  """x * scale + shift, the activation, then zeros where `mask` fails (the
  padding), rounded to x's dtype as the array XLA would write."""
  if not p.has_prologue:
    return v  # the masked load already read zeros in the padding
  v = v.astype(_F32)
  if scale is not None:
    v = v * scale
  if shift is not None:
    v = v + shift
  v = activation_fn(p.prologue_activation, v)
  return jnp.where(mask, v, 0.0).astype(p.x_dtype)


def _kernel(*refs, p: _Launch):
  g, cfg = p.geom, p.cfg
  bp, bf, bc = cfg.block_p, cfg.block_f, cfg.block_c
  refs = list(refs)
  x_ref, w_ref = refs.pop(0), refs.pop(0)
  scale_ref = refs.pop(0) if p.has_scale else None
  shift_ref = refs.pop(0) if p.has_shift else None
  bias_ref = refs.pop(0) if p.has_bias else None
  res_ref = refs.pop(0) if p.has_residual else None
  y_ref = refs.pop(0)
  sum_ref, sq_ref = (refs.pop(0), refs.pop(0)) if p.statistics else (None, None)

  t, j = pl.program_id(1), pl.program_id(2)
  pix = t * bp + jnp.arange(bp, dtype=jnp.int32)
  pix_ok = pix < g.pixels
  oh, ow = _div(pix, g.wo), _rem(pix, g.wo)
  ar_f = jnp.arange(bf, dtype=jnp.int32)
  taps = g.kh * g.kw

  if g.depthwise:
    f0 = j * bf
    f_ok = f0 + ar_f < g.f
    # Output channel f reads input channel f // M (M = F / C, the multiplier).
    cin = jnp.where(f_ok, _div(f0 + ar_f, g.f // g.c), 0)
    scale = _load(scale_ref.at[cin], f_ok).astype(_F32)[None, :] if p.has_scale else None
    shift = _load(shift_ref.at[cin], f_ok).astype(_F32)[None, :] if p.has_shift else None

    def tap_step(tap, acc):
      offs, ok = _gather_pixels(p, pix_ok, oh, ow, tap)
      mask = ok[:, None] & f_ok[None, :]
      v = _load(x_ref.at[offs[:, None], cin[None, :]], mask)
      v = _prologue(p, v, scale, shift, mask).astype(_F32)
      wt = _load(w_ref.at[tap, pl.ds(f0, bf)], f_ok).astype(_F32)
      return acc + v * wt[None, :]

    acc = jax.lax.fori_loop(0, taps, tap_step, jnp.zeros((bp, bf), _F32))
  else:
    f_tiles = pl.cdiv(g.f_group, bf)
    group, fj = _div(j, f_tiles), _rem(j, f_tiles)
    f0 = group * g.f_group + fj * bf
    # Columns past the group's F/G belong to the next group (or past F): storing
    # them would race with that group's program on a GPU. Interpret mode runs
    # programs in order, the next group's last, so no test here can see it.
    f_ok = fj * bf + ar_f < g.f_group
    c_steps = pl.cdiv(g.c_group, bc)
    ar_c = jnp.arange(bc, dtype=jnp.int32)
    cdt = jnp.dtype(_F32 if p.interpret else p.x_dtype)  # XLA:CPU lacks 16-bit dots
    precision = (jax.lax.Precision.HIGHEST if jnp.dtype(p.x_dtype) == _F32
                 else jax.lax.Precision.DEFAULT)

    def step(s, acc):
      tap, cc = _div(s, c_steps), _rem(s, c_steps)
      offs, ok = _gather_pixels(p, pix_ok, oh, ow, tap)
      c_ok = cc * bc + ar_c < g.c_group
      cin = jnp.where(c_ok, group * g.c_group + cc * bc + ar_c, 0)
      mask = ok[:, None] & c_ok[None, :]
      v = _load(x_ref.at[offs[:, None], cin[None, :]], mask)
      scale = _load(scale_ref.at[cin], c_ok).astype(_F32)[None, :] if p.has_scale else None
      shift = _load(shift_ref.at[cin], c_ok).astype(_F32)[None, :] if p.has_shift else None
      v = _prologue(p, v, scale, shift, mask)
      wt = _load(w_ref.at[tap, pl.ds(cc * bc, bc), pl.ds(f0, bf)],
                 c_ok[:, None] & f_ok[None, :])
      return acc + jax.lax.dot(v.astype(cdt), wt.astype(cdt), precision=precision,
                               preferred_element_type=_F32)

    acc = jax.lax.fori_loop(0, taps * c_steps, step, jnp.zeros((bp, bf), _F32))

  cols = pl.ds(f0, bf)
  z = acc
  if bias_ref is not None:
    z = z + _load(bias_ref.at[cols], f_ok).astype(_F32)[None, :]
  z = activation_fn(p.activation, z)
  tile = pix_ok[:, None] & f_ok[None, :]
  if res_ref is not None:
    z = z + _load(res_ref.at[:, cols], tile).astype(_F32)
  gpu.store(y_ref.at[:, cols], z, tile)
  if p.statistics:
    # Pixels past the image (and columns past the group) add nothing.
    zm = jnp.where(tile, z, 0.0)
    gpu.store(sum_ref.at[cols], jnp.sum(zm, axis=0), f_ok)
    gpu.store(sq_ref.at[cols], jnp.sum(zm * zm, axis=0), f_ok)


def forward(x, w, scale, shift, bias, residual, *, geom: Geometry, prologue_activation: str,
            activation: str, statistics: bool, out_dtype, cfg: Config, interpret: bool):
  """The fused convolution through the kernel.

  Args:
    x: [N, H, W, C]; w: [KH, KW, C/G, F] of x's dtype; scale, shift: [C] or
      None; bias: [F] or None; residual: [N, HO, WO, F] or None.
    geom: the convolution's shape (`api.py` resolves padding and output size).
    prologue_activation, activation: canonical names (`reference.ACTIVATIONS`).
    statistics: also return f32 (sum, sum of squares) [F] over N, HO, WO.
    out_dtype: dtype of y.
    cfg: tiling (`config.choose_config` or the caller's, accepted by the guard).
    interpret: run through Pallas' interpreter instead of Triton.

  Returns:
    y [N, HO, WO, F], or (y, (sum, sum_of_squares)) with `statistics`.
  """
  g = geom
  bp, bf = cfg.block_p, cfg.block_f
  tiles_p = pl.cdiv(g.pixels, bp)
  tiles_f = pl.cdiv(g.f, bf) if g.depthwise else g.groups * pl.cdiv(g.f_group, bf)
  p = _Launch(geom=g, cfg=cfg, has_scale=scale is not None, has_shift=shift is not None,
              prologue_activation=prologue_activation, has_bias=bias is not None,
              activation=activation, has_residual=residual is not None,
              statistics=statistics, x_dtype=jnp.dtype(x.dtype).name,
              interpret=bool(interpret))

  whole_image = pl.BlockSpec((None, g.h * g.w, g.c), lambda n, t, j: (n, 0, 0))
  pixel_tile = pl.BlockSpec((None, bp, g.f), lambda n, t, j: (n, t, 0))
  # Depthwise weights drop their one-channel axis: [KH*KW, F].
  w_shape = (g.kh * g.kw, g.f) if g.depthwise else (g.kh * g.kw, g.c_group, g.f)
  args = [x.reshape(g.n, g.h * g.w, g.c), w.reshape(w_shape)]
  specs = [whole_image, pl.BlockSpec(w_shape, lambda n, t, j: (0,) * len(w_shape))]
  for vec, size in ((scale, g.c), (shift, g.c), (bias, g.f)):
    if vec is not None:
      args.append(vec)
      specs.append(pl.BlockSpec((size,), lambda n, t, j: (0,)))
  if residual is not None:
    args.append(residual.reshape(g.n, g.pixels, g.f))
    specs.append(pixel_tile)
  out_shapes = [jax.ShapeDtypeStruct((g.n, g.pixels, g.f), jnp.dtype(out_dtype))]
  out_specs = [pixel_tile]
  if statistics:
    out_shapes += [jax.ShapeDtypeStruct((g.n, tiles_p, g.f), _F32)] * 2
    out_specs += [pl.BlockSpec((None, None, g.f), lambda n, t, j: (n, t, 0))] * 2

  params = None if interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                       num_stages=cfg.num_stages)
  itemsize = jnp.dtype(x.dtype).itemsize
  call = pl.pallas_call(
      functools.partial(_kernel, p=p),
      out_shape=out_shapes,
      grid=(g.n, tiles_p, tiles_f),
      in_specs=specs,
      out_specs=out_specs,
      compiler_params=params,
      interpret=interpret,
      cost_estimate=pl.CostEstimate(
          flops=2 * g.n * g.pixels * g.f * g.kh * g.kw * g.c_group,
          transcendentals=0,
          bytes_accessed=(x.size + w.size) * itemsize
          + sum(jnp.dtype(s.dtype).itemsize * s.size for s in out_shapes)),
      name="pallas_kernels_conv2d",
  )
  with backend_lib.kernel_scope("conv2d"):
    outs = call(*args)
  y = outs[0].reshape(g.n, g.ho, g.wo, g.f)
  if not statistics:
    return y
  return y, (outs[1].sum(axis=(0, 1)), outs[2].sum(axis=(0, 1)))
