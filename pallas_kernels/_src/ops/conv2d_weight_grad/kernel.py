"""Pallas kernel of the convolution's weight gradient, with dy's column sum
and, given the optimizer state, Adam's update as its epilogue.

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

Adam's update (`update`): with one split, a program's accumulator is its
tile's whole gradient once the pixel loop ends. It then reads the tile's
param, mu and nu (masked at the ragged channel edges exactly as the gradient
would be stored), applies `adam.tile_update` in f32 and stores the three
updated tiles in the state's dtypes: the gradient is never written. The
state enters as [taps, C/groups, groups, F/groups] views of the HWIO arrays
(depthwise: [taps, F]), tiled as the gradient is; the learning rate and the
bias corrections enter as f32[1] arrays, computed by XLA from the count.

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
from pallas_kernels._src.ops import adam
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
  #: Adam's constants when its update is the epilogue, else None.
  update: adam.Hyper | None = None

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
  x_ref, dy_ref = refs[:2]
  if p.update is None:
    state_refs = scalar_refs = ()
    out_refs, rest = refs[2:3], refs[3:]
  else:
    state_refs, scalar_refs = refs[2:5], refs[5:8]
    out_refs, rest = refs[8:11], refs[11:]
  db_ref = rest[0] if p.column_sum else None

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
  tile = f_ok if p.depthwise else gpu.mask2(c_ok, f_ok)
  if p.update is None:
    gpu.write_tile(out_refs[0], acc, tile)
  else:
    # Past the channels everything reads zero: the update is then
    # 0 / (sqrt(0) + eps) = 0 there (no NaN), and none of it is stored.
    param, mu, nu = (gpu.read_tile(r, tile).astype(_F32) for r in state_refs)
    lr, c1, c2 = (r[...].astype(_F32) if p.depthwise else r[...].astype(_F32)[None, :]
                  for r in scalar_refs)
    for ref, value in zip(out_refs, adam.tile_update(acc, param, mu, nu, lr, c1, c2,
                                                     p.update)):
      gpu.write_tile(ref, value, tile)
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
  p, outs = _launch(x, dy, win, column_sum=column_sum, cfg=cfg, interpret=interpret)
  # The small final combine: the splits' partials, weights-sized.
  dw = outs[0].sum(axis=0).reshape(win.kernel + (p.cg, p.f))
  if not column_sum:
    return dw
  return dw, outs[1].sum(axis=0).reshape(p.f)


def adam_step(x, dy, win: Window, param, mu, nu, learning_rate, c1, c2, *,
              hyper: adam.Hyper, column_sum: bool, cfg: Config, interpret: bool,
              in_place: bool = True):
  """(param', mu', nu') in their dtypes (and f32 db [F]): Adam's step on the
  filter gradient of NHWC x and dy, which is never written.

  Args:
    x: [N, H, W, C]; dy: [N, HO, WO, F] of x's dtype.
    win: the convolution's geometry (`reference.window`).
    param, mu, nu: [KH, KW, C/groups, F], one dtype.
    learning_rate, c1, c2: f32[1] (c1, c2: the bias corrections 1 - b**t).
    hyper: Adam's constants.
    column_sum: also return sum(dy, axis=(0, 1, 2)).
    cfg: tiling with one split (`config.choose_config(..., update=True)`).
    interpret: run through Pallas' interpreter instead of Triton.
    in_place: write the three outputs over param, mu and nu (aliased).
  """
  p, outs = _launch(x, dy, win, column_sum=column_sum, cfg=cfg, interpret=interpret,
                    hyper=hyper, state=(param, mu, nu), scalars=(learning_rate, c1, c2),
                    in_place=in_place)
  new = tuple(o.reshape(param.shape) for o in outs[:3])
  if not column_sum:
    return new
  return new + (outs[3].reshape(p.f),)


def _launch(x, dy, win: Window, *, column_sum: bool, cfg: Config, interpret: bool,
            hyper: adam.Hyper | None = None, state=(), scalars=(), in_place: bool = True):
  """(the launch's `_Launch`, the pallas_call's outputs): dw's split
  partials, or the updated state in its [taps, ...] views; then db's."""
  n, h, w, c = x.shape
  _, ho, wo, f = dy.shape
  p = _Launch(n=n, h=h, w=w, c=c, ho=ho, wo=wo, f=f, win=win, column_sum=column_sum,
              compute_dtype=jnp.dtype(x.dtype).name, interpret=bool(interpret), cfg=cfg,
              update=hyper)
  bp, bc, bf = cfg.block_p, cfg.block_c, cfg.block_f
  splits, taps, groups = cfg.splits, win.taps, win.groups
  if hyper is not None and splits != 1:
    raise ValueError(f"the Adam update takes one split, got {cfg}")
  rows = p.steps * bp  # one split's pixel range: its dy block
  # x is gathered by computed offsets: one flat block, never tiled.
  x_spec = pl.BlockSpec((n * h * w * c,), lambda s, a, fb: (0,))
  if p.depthwise:
    grid = (splits, taps, p.f_tiles)
    dy_arg = dy.reshape(p.pixels, f)
    dy_spec = pl.BlockSpec((rows, bf), lambda s, a, fb: (s, fb))
    dw_shape = (splits, taps, f)
    dw_spec = pl.BlockSpec((None, None, bf), lambda s, a, fb: (s, a, fb))
    state_shape = (taps, f)
    state_spec = pl.BlockSpec((None, bf), lambda s, a, fb: (a, fb))
    db_shape = (splits, f)
    db_spec = pl.BlockSpec((None, bf), lambda s, a, fb: (s, fb))
  else:
    per_tap = groups * p.c_tiles
    grid = (splits, taps * per_tap, p.f_tiles)

    def group(a):
      return jax.lax.div(jax.lax.rem(a, per_tap), p.c_tiles)

    def weight_tile(a, fb):  # (tap, C tile, group, F tile)
      return (jax.lax.div(a, per_tap), jax.lax.rem(jax.lax.rem(a, per_tap), p.c_tiles),
              group(a), fb)

    # F split into (group, channel of the group): a program's F tile never
    # straddles two groups, and its blocks stay aligned when F/groups is ragged.
    dy_arg = dy.reshape(p.pixels, groups, p.fg)
    dy_spec = pl.BlockSpec((rows, None, bf), lambda s, a, fb: (s, group(a), fb))
    dw_shape = (splits, taps, p.cg, groups, p.fg)
    dw_spec = pl.BlockSpec((None, None, bc, None, bf),
                           lambda s, a, fb: (s, *weight_tile(a, fb)))
    state_shape = (taps, p.cg, groups, p.fg)
    state_spec = pl.BlockSpec((None, bc, None, bf), lambda s, a, fb: weight_tile(a, fb))
    db_shape = (splits, groups, p.fg)
    db_spec = pl.BlockSpec((None, None, bf), lambda s, a, fb: (s, group(a), fb))
  in_specs = [x_spec, dy_spec]
  args = [x.reshape(-1), dy_arg]
  if hyper is None:
    out_shapes = [jax.ShapeDtypeStruct(dw_shape, _F32)]
    out_specs = [dw_spec]
  else:
    # The HWIO state viewed as the gradient's tiles see it (a free reshape).
    scalar_spec = pl.BlockSpec((1,), lambda s, a, fb: (0,))
    in_specs += [state_spec] * 3 + [scalar_spec] * 3
    args += [a.reshape(state_shape) for a in state] + list(scalars)
    out_shapes = [jax.ShapeDtypeStruct(state_shape, a.dtype) for a in state]
    out_specs = [state_spec] * 3
  if column_sum:
    out_shapes.append(jax.ShapeDtypeStruct(db_shape, _F32))
    out_specs.append(db_spec)
  params = None if interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                       num_stages=cfg.num_stages)
  itemsize = jnp.dtype(x.dtype).itemsize
  weights = taps * p.cg * f
  update = hyper is not None
  written = sum(jnp.dtype(o.dtype).itemsize * o.size for o in out_shapes)
  read_state = sum(jnp.dtype(a.dtype).itemsize * a.size for a in state)
  call = pl.pallas_call(
      functools.partial(_kernel, p=p),
      out_shape=out_shapes,
      grid=grid,
      in_specs=in_specs,
      out_specs=out_specs,
      # param', mu' and nu' overwrite their inputs' tiles after reading them:
      # a training step that donates its state updates it in place (one
      # that does not has XLA copy it first: in_place=False then).
      input_output_aliases={2: 0, 3: 1, 4: 2} if update and in_place else {},
      compiler_params=params,
      interpret=interpret,
      cost_estimate=pl.CostEstimate(
          flops=2 * p.pixels * weights + (16 * weights if update else 0),
          transcendentals=weights if update else 0,
          bytes_accessed=(taps * p.pixels * c + p.pixels * f) * itemsize + written
          + read_state),
      name="pallas_kernels_conv2d_weight_grad",
  )
  with backend_lib.kernel_scope("conv2d_weight_grad"):
    return p, call(*args)
