"""Pallas kernel of the convolution's weight gradient, with dy's column sum.

Each tap (kh, kw) of the kernel window is its own GEMM over the output
pixels: dw[kh, kw] = x_tap^T @ dy, where x_tap[p, c] is the input pixel that
output pixel p reads through that tap (zero where it falls in the padding).
x_tap is gathered from x tile by tile in registers (im2col without writing
it): output pixel q = (n, oh, ow) reads x[n, oh*sh - pad_top + kh*dh,
ow*sw - pad_left + kw*dw, c].

Grid (splits, taps * groups * C tiles, F tiles). A program owns one
[block_c, block_f] tile of one tap's weight gradient, within one group (a
group's input channels meet only its own output channels), and walks its
split's range of output pixels in `block_p` steps with a `fori_loop` and an
f32 accumulator, as the matmul kernel walks K (Triton runs programs in
parallel, so no grid axis carries an accumulator). The pixel range is split
because the contraction (N*HO*WO) dwarfs the output (see `config.py`); each
split writes an f32 partial, summed after the kernel.

Depthwise convolutions (one input channel per group) have no contraction
over channels: output channel f reads input channel f // multiplier alone.
Their programs own a [block_f] column of one tap and multiply-accumulate the
gathered x column into dy elementwise; a dot of [block_p, 1] tiles would
waste the tensor cores and Triton's tt.dot takes no edge under 16.

Column sums (`column_sum`, the bias gradient): the dy tile a program loads is
the same for every tap and every C tile (only the x gather depends on them),
so the programs of one (split, F tile) all walk the same dy elements. Only
the one of tap 0 and C tile 0 adds its tiles into an f32 column row and
stores it: the split's partial row counts each of its dy elements once, and
the others skip adds whose sums would only repeat it (a branch on program
ids, uniform per program). The splits' rows are summed with the weight
partials after the kernel.

Like the matmul (see its module docstring), the body is written for Pallas'
Triton lowering and runs unchanged in interpret mode: every load and store
at a ragged edge (pixels, channels) is masked, and the x gather clamps its
masked lanes' offsets to 0 so that no lane addresses memory past x.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.conv2d_weight_grad.config import Config
from pallas_kernels._src.ops.conv2d_weight_grad.reference import Window

_F32 = jnp.float32



@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """Static description of one launch."""

  n: int
  h: int
  w: int
  c: int
  ho: int
  wo: int
  f: int
  win: Window
  column_sum: bool
  compute_dtype: str
  interpret: bool
  cfg: Config

  @property
  def pixels(self) -> int:
    return self.n * self.ho * self.wo

  @property
  def cg(self) -> int:
    return self.c // self.win.groups

  @property
  def fg(self) -> int:
    return self.f // self.win.groups

  @property
  def depthwise(self) -> bool:
    return self.cg == 1

  @property
  def steps(self) -> int:
    """Pixel tiles each split walks."""
    return pl.cdiv(pl.cdiv(self.pixels, self.cfg.block_p), self.cfg.splits)

  @property
  def c_tiles(self) -> int:
    return 1 if self.depthwise else pl.cdiv(self.cg, self.cfg.block_c)

  @property
  def f_tiles(self) -> int:
    return pl.cdiv(self.f if self.depthwise else self.fg, self.cfg.block_f)


def _x_rows(p: _Launch, q, kh, kw):
  """Flat row (n*H + ih)*W + iw of x that output pixels `q` read through tap
  (kh, kw), and whether it exists (a real pixel, not padding)."""
  win = p.win
  n = jax.lax.div(q, p.ho * p.wo)
  r = jax.lax.rem(q, p.ho * p.wo)
  oh, ow = jax.lax.div(r, p.wo), jax.lax.rem(r, p.wo)
  ih = oh * win.stride[0] - win.padding[0][0] + kh * win.dilation[0]
  iw = ow * win.stride[1] - win.padding[1][0] + kw * win.dilation[1]
  ok = (q < p.pixels) & (ih >= 0) & (ih < p.h) & (iw >= 0) & (iw < p.w)
  return (n * p.h + ih) * p.w + iw, ok


def _kernel(*refs, p: _Launch):
  cfg = p.cfg
  bp, bc, bf = cfg.block_p, cfg.block_c, cfg.block_f
  x_ref, dy_ref, dw_ref = refs[:3]
  db_ref = refs[3] if p.column_sum else None

  s, a, fb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  per_tap = p.win.groups * p.c_tiles
  tap = a if p.depthwise else jax.lax.div(a, per_tap)
  rest = jax.lax.rem(a, per_tap)
  g, cb = jax.lax.div(rest, p.c_tiles), jax.lax.rem(rest, p.c_tiles)
  kh, kw = jax.lax.div(tap, p.win.kernel[1]), jax.lax.rem(tap, p.win.kernel[1])
  # Each dy element counted once per split: tap 0's (and C tile 0's) programs.
  first = (tap == 0) if p.depthwise else (tap == 0) & (cb == 0)

  f_local = fb * bf + jnp.arange(bf, dtype=jnp.int32)
  if p.depthwise:
    f_ok = (f_local < p.f) if p.f % bf else None
    # Output channel f of a depthwise conv reads input channel f // multiplier.
    chan = jax.lax.div(f_local, p.fg)
    c_ok = f_ok
  else:
    f_ok = (f_local < p.fg) if p.fg % bf else None
    c_local = cb * bc + jnp.arange(bc, dtype=jnp.int32)
    c_ok = (c_local < p.cg) if p.cg % bc else None
    chan = g * p.cg + c_local
  cdt = jnp.dtype(_F32 if p.interpret else p.compute_dtype)
  # IEEE float32 for f32 tiles (the f32 tolerance); 16-bit products are exact.
  precision = (jax.lax.Precision.HIGHEST if jnp.dtype(p.compute_dtype) == _F32
               else jax.lax.Precision.DEFAULT)
  base = s * (p.steps * bp)

  def step(i, carry):
    acc, colsum = carry
    p0 = pl.multiple_of(i * bp, bp)
    q = base + p0 + jnp.arange(bp, dtype=jnp.int32)
    rows, ok = _x_rows(p, q, kh, kw)
    x_mask = gpu.mask2(ok, c_ok)
    # Masked lanes gather offset 0: in bounds even where Triton would not mask.
    offsets = jnp.where(x_mask, rows[:, None] * p.c + chan[None, :], 0)
    xt = gpu.load(x_ref.at[offsets], x_mask, 0.0)
    # Rows past the pixels read zeros: the padded block holds garbage (NaN
    # when interpreted) that must enter neither sum.
    dyt = gpu.read_tile(dy_ref.at[pl.ds(p0, bp), :], gpu.mask2(q < p.pixels, f_ok))
    if p.depthwise:
      acc = acc + jnp.sum(xt.astype(_F32) * dyt.astype(_F32), axis=0)
    else:
      acc = acc + jax.lax.dot_general(
          xt.astype(cdt), dyt.astype(cdt), (((0,), (0,)), ((), ())),
          precision=precision, preferred_element_type=_F32)
    if p.column_sum:
      colsum = jax.lax.cond(first, lambda c: c + jnp.sum(dyt.astype(_F32), axis=0),
                            lambda c: c, colsum)
    return acc, colsum

  acc0 = jnp.zeros((bf,) if p.depthwise else (bc, bf), _F32)
  acc, colsum = jax.lax.fori_loop(0, p.steps, step, (acc0, jnp.zeros((bf,), _F32)))
  gpu.write_tile(dw_ref, acc, f_ok if p.depthwise else gpu.mask2(c_ok, f_ok))
  if db_ref is not None:

    @pl.when(first)
    def _():
      gpu.write_tile(db_ref, colsum, f_ok)


def weight_grad(x, dy, win: Window, *, column_sum: bool, cfg: Config, interpret: bool):
  """f32 dw [KH, KW, C/groups, F] (and f32 db [F]) of NHWC x and dy.

  Args:
    x: [N, H, W, C]; dy: [N, HO, WO, F] of x's dtype.
    win: the convolution's geometry (`reference.window`).
    column_sum: also return sum(dy, axis=(0, 1, 2)).
    cfg: tiling (`config.choose_config` or the caller's, accepted by the guard).
    interpret: run through Pallas' interpreter instead of Triton.
  """
  n, h, w, c = x.shape
  _, ho, wo, f = dy.shape
  p = _Launch(n=n, h=h, w=w, c=c, ho=ho, wo=wo, f=f, win=win, column_sum=column_sum,
              compute_dtype=jnp.dtype(x.dtype).name, interpret=bool(interpret), cfg=cfg)
  bp, bc, bf = cfg.block_p, cfg.block_c, cfg.block_f
  splits, taps, groups = cfg.splits, win.taps, win.groups
  rows = p.steps * bp  # one split's pixel range: its dy block
  # x is gathered by computed offsets: one flat block, never tiled.
  x_spec = pl.BlockSpec((n * h * w * c,), lambda s, a, fb: (0,))
  if p.depthwise:
    grid = (splits, taps, p.f_tiles)
    dy_arg = dy.reshape(p.pixels, f)
    dy_spec = pl.BlockSpec((rows, bf), lambda s, a, fb: (s, fb))
    dw_shape = (splits, taps, f)
    dw_spec = pl.BlockSpec((None, None, bf), lambda s, a, fb: (s, a, fb))
    db_shape = (splits, f)
    db_spec = pl.BlockSpec((None, bf), lambda s, a, fb: (s, fb))
  else:
    per_tap = groups * p.c_tiles
    grid = (splits, taps * per_tap, p.f_tiles)
    # F split into (group, channel of the group): a program's F tile never
    # straddles two groups, and its blocks stay aligned when F/groups is ragged.
    dy_arg = dy.reshape(p.pixels, groups, p.fg)
    dy_spec = pl.BlockSpec(
        (rows, None, bf), lambda s, a, fb: (s, jax.lax.div(jax.lax.rem(a, per_tap),
                                                           p.c_tiles), fb))
    dw_shape = (splits, taps, p.cg, groups, p.fg)
    dw_spec = pl.BlockSpec(
        (None, None, bc, None, bf),
        lambda s, a, fb: (s, jax.lax.div(a, per_tap),
                          jax.lax.rem(jax.lax.rem(a, per_tap), p.c_tiles),
                          jax.lax.div(jax.lax.rem(a, per_tap), p.c_tiles), fb))
    db_shape = (splits, groups, p.fg)
    db_spec = pl.BlockSpec(
        (None, None, bf),
        lambda s, a, fb: (s, jax.lax.div(jax.lax.rem(a, per_tap), p.c_tiles), fb))
  out_shapes = [jax.ShapeDtypeStruct(dw_shape, _F32)]
  out_specs = [dw_spec]
  if column_sum:
    out_shapes.append(jax.ShapeDtypeStruct(db_shape, _F32))
    out_specs.append(db_spec)
  params = None if interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                       num_stages=cfg.num_stages)
  itemsize = jnp.dtype(x.dtype).itemsize
  call = pl.pallas_call(
      functools.partial(_kernel, p=p),
      out_shape=out_shapes,
      grid=grid,
      in_specs=[x_spec, dy_spec],
      out_specs=out_specs,
      compiler_params=params,
      interpret=interpret,
      cost_estimate=pl.CostEstimate(
          flops=2 * p.pixels * taps * p.cg * f, transcendentals=0,
          bytes_accessed=(taps * p.pixels * c + p.pixels * f) * itemsize
          + sum(4 * s.size for s in out_shapes)),
      name="pallas_kernels_conv2d_weight_grad",
  )
  with backend_lib.kernel_scope("conv2d_weight_grad"):
    outs = call(x.reshape(-1), dy_arg)
  # The small final combine: the splits' partials, weights-sized.
  dw = outs[0].sum(axis=0).reshape(win.kernel + (p.cg, f))
  if not column_sum:
    return dw
  return dw, outs[1].sum(axis=0).reshape(f)
