"""The Mosaic GPU matmul for Hopper: TMA pipeline, warpgroup wgmma, fused epilogue.

Built the way JAX's own `hopper_matmul_mgpu` is built, with our prologue and
epilogue. A persistent kernel: one CTA per SM (the target's SM count), each
walking output tiles in a planar snake (`grid_minor`, `grid_tile_width`:
neighbouring CTAs share operand panels in L2). A CTA holds three warpgroups:
one issues TMA copies of the x and w tiles into a `stages`-deep ring of
shared memory buffers (`emit_pipeline_warp_specialized`), two compute
warpgroups each own a [tile_m, tile_n] part of the CTA tile (split along N or
M, `wg_dimension`) and accumulate it with `wgmma` in float32 registers
(`plgpu.ACC`). Tile sizes come from `config.MosaicConfig` only.

Prologue (in the compute warpgroups, per K step):
  * 16-bit float and TF32 operands go to `wgmma` straight from shared memory,
    a transposed operand as a transposed view of its tile;
  * a quantized x tile (int8, fp8) is read into registers, converted to the
    compute dtype and fed to `wgmma` as its register operand (x's per-row
    scale multiplies the accumulator in the epilogue, exactly);
  * a quantized w tile (int8, int4, fp8) is read into registers, converted
    (times its K group's scale row, which the pipeline brings with the tile)
    and written to a compute-dtype buffer that `wgmma` reads: its second
    operand comes from shared memory only.

Epilogue (per compute warpgroup, on the accumulator in registers, in
[epi_tile_m, epi_tile_n] pieces): x's row scales and w's column scales, the
pre-epilogue accumulator stored when the backward wants it (`aux`), then
scale, bias, activation, residual, clamp, and the cast, or the per-row
quantization (its row max first, over the warpgroup's tile, which then spans
the whole row). Column vectors (w's scales, `scale`, bias) arrive as one
float32 [V, N] array and row scales as [B, M], copied by TMA into shared
memory per tile; each residual piece is copied by TMA into the output's
staging buffer (or its own, when its dtype differs); results leave through
shared memory by TMA, two pieces in flight per warpgroup.

Ragged shapes need no masks: TMA fills reads past an array's end with zeros
(zero rows and columns add nothing to the product) and drops writes past it.
Interpret mode (`plgpu.InterpretGPUParams`, jax >= 0.11) runs the same body
on a CPU with the same semantics. What TMA and `wgmma` cannot do is the
guard's to say (`guard.mosaic_unsupported_reason`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import compat
from pallas_kernels._src.ops import quantize as quant
from pallas_kernels._src.ops.matmul import kernel as triton_kernel
from pallas_kernels._src.ops.matmul.config import MosaicConfig, OperandPaths
from pallas_kernels._src.ops.matmul.config import mosaic_operand_paths

_F32 = jnp.float32
plgpu = compat.pallas_mosaic_gpu
#: Rows of the column-vector array, in this order when present.
COL_VECTORS = ("col_scale", "scale", "bias")
#: The SM count interpret mode runs the persistent grid with: Mosaic GPU's
#: interpreter simulates one block (more deadlock it at times); the one CTA
#: walks every tile, which the persistent loop does anyway.
INTERPRET_SMS = 1


def _bits(dtype) -> int:
  dt = jnp.dtype(dtype)
  return 4 if dt.name in ("int4", "uint4") else 8 * dt.itemsize


def _transforms(minor_elems: int, dtype, like=None) -> tuple:
  """Tiling and swizzle of a shared memory tile whose last axis holds
  `minor_elems` elements (what `wgmma` and conflict-free copies want); with
  `like`, the tiling of that dtype's tile instead (a tile converted into a
  buffer of `like` is then read in the layout the buffer is written in)."""
  bits = _bits(dtype)
  if like is not None:
    elems = plgpu.find_swizzle(minor_elems * _bits(like)) * 8 // _bits(like)
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(elems * bits // 8))
  swizzle = plgpu.find_swizzle(minor_elems * bits)
  return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class Plan:
  """Static description of one launch (3-D operands, batch first)."""

  m: int
  n: int
  k: int
  batch: int
  x_batched: bool
  w_batched: bool
  rows_batched: bool
  transpose_x: bool
  transpose_w: bool
  x_dtype: str
  w_dtype: str
  compute_dtype: str
  out_dtype: str
  has_row_scale: bool
  #: Which of `COL_VECTORS` the [V, N] column-vector array holds, in order.
  col_vectors: tuple[str, ...]
  group_size: int | None
  residual_dtype: str | None
  activation: str
  clamp: tuple[float | None, float | None] | None
  quantize: str | None
  aux_dtype: str | None
  cfg: MosaicConfig
  num_sms: int
  interpret: bool

  @property
  def cta_m(self) -> int:
    return self.cfg.tile_m * (self.cfg.compute_wgs if self.cfg.wg_dimension == "m" else 1)

  @property
  def cta_n(self) -> int:
    return self.cfg.tile_n * (self.cfg.compute_wgs if self.cfg.wg_dimension == "n" else 1)

  @property
  def m_iters(self) -> int:
    return pl.cdiv(self.m, self.cta_m)

  @property
  def n_iters(self) -> int:
    return pl.cdiv(self.n, self.cta_n)

  @property
  def k_iters(self) -> int:
    return pl.cdiv(self.k, self.cfg.tile_k)

  @property
  def x_quantized(self) -> bool:
    return jnp.dtype(self.x_dtype) != jnp.dtype(self.compute_dtype)

  @property
  def w_quantized(self) -> bool:
    return jnp.dtype(self.w_dtype) != jnp.dtype(self.compute_dtype)

  @property
  def tf32(self) -> bool:
    return jnp.dtype(self.compute_dtype) == jnp.float32

  @property
  def paths(self) -> OperandPaths:
    return mosaic_operand_paths(self.x_dtype, self.w_dtype, self.compute_dtype,
                                self.transpose_x, self.transpose_w)

  @property
  def native_8bit(self) -> bool:
    return self.paths.native_8bit

  @property
  def acc_dtype(self) -> jnp.dtype:
    native_int = self.native_8bit and jnp.dtype(self.x_dtype) == jnp.int8
    return jnp.dtype(jnp.int32 if native_int else _F32)

  @property
  def x_staged(self) -> bool:
    return self.paths.x_staged

  @property
  def w_staged(self) -> bool:
    return self.paths.w_staged

  @property
  def store_dtype(self) -> jnp.dtype:
    return jnp.dtype(quant.dtype_of(self.quantize) if self.quantize else self.out_dtype)

  @property
  def slots(self) -> int:
    """Output pieces in flight per warpgroup (one when there is one piece)."""
    c = self.cfg
    return min(2, (c.tile_m // c.epi_tile_m) * (c.tile_n // c.epi_tile_n))


def operand_tiles(p: "Plan") -> tuple[tuple[tuple[int, int], tuple], ...]:
  """(block shape, transforms) of the x and w pipeline tiles.

  A warpgroup's slice along a tile's minor axis must cover whole swizzle
  tiles: the swizzle follows the slice's width there. A quantized w tile is
  tiled like the compute-dtype buffer it is converted into (the conversion
  then reads and writes one register layout without spilling).
  """
  cfg = p.cfg
  split_n = cfg.compute_wgs > 1 and cfg.wg_dimension == "n"
  split_m = cfg.compute_wgs > 1 and cfg.wg_dimension == "m"
  x_block = (cfg.tile_k, p.cta_m) if p.transpose_x else (p.cta_m, cfg.tile_k)
  w_block = (p.cta_n, cfg.tile_k) if p.transpose_w else (cfg.tile_k, p.cta_n)
  x_minor = cfg.tile_m if p.transpose_x and split_m else x_block[1]
  w_minor = cfg.tile_n if not p.transpose_w and split_n else w_block[1]
  cdt = jnp.dtype(p.compute_dtype)
  return ((x_block, _transforms(x_minor, p.x_dtype, like=cdt if p.x_staged else None)),
          (w_block, _transforms(w_minor, p.w_dtype, like=cdt if p.w_staged else None)))


def epilogue_transforms(p: "Plan", dtype) -> tuple:
  """Transforms of an epilogue piece [epi_tile_m, epi_tile_n] of `dtype`."""
  return _transforms(p.cfg.epi_tile_n, dtype)


def _tiling(transforms) -> tuple[int, int]:
  return next(t.tiling for t in transforms if isinstance(t, plgpu.TilingTransform))


def tma_shape_reason(p: "Plan", residual_shape=None) -> str | None:
  """Why TMA cannot copy this call's tiles, or None.

  Mosaic GPU copies a swizzled tile by viewing the whole array as tiles of
  (8 rows, one swizzle of columns): each tiled axis longer than its tile must
  be a multiple of it. Ragged shapes are fine within that (TMA zero-fills
  and clips whole tiles past the end), unaligned ones are not.
  """
  (_, x_tf), (_, w_tf) = operand_tiles(p)
  x_shape = (p.k, p.m) if p.transpose_x else (p.m, p.k)
  w_shape = (p.n, p.k) if p.transpose_w else (p.k, p.n)
  arrays = [("x", x_shape, p.x_dtype, x_tf), ("w", w_shape, p.w_dtype, w_tf),
            ("the result", (p.m, p.n), p.store_dtype,
             epilogue_transforms(p, p.store_dtype))]
  if p.residual_dtype is not None:
    arrays.append(("residual", (p.m, p.n), p.residual_dtype,
                   epilogue_transforms(p, p.residual_dtype)))
  if p.aux_dtype is not None:
    arrays.append(("aux", (p.m, p.n), p.aux_dtype, epilogue_transforms(p, p.aux_dtype)))
  for label, shape, dtype, transforms in arrays:
    for size, tile, axis in zip(shape, _tiling(transforms), ("rows", "columns")):
      if size > tile and size % tile:
        return (f"{label} {jnp.dtype(dtype).name}{list(shape)}: Mosaic GPU's TMA copies whole "
                f"tiles of {tile} {axis}, and {size} is not a multiple of {tile}")
  return None


def kernel_name(cfg: MosaicConfig) -> str:
  """"pallas_kernels_matmul_128x128x64_s4_wg2n": the tiling in the name."""
  return (f"pallas_kernels_matmul_{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}_s{cfg.stages}_"
          f"wg{cfg.compute_wgs}{cfg.wg_dimension}")


def folded(x_shape, w_shape, transpose_x: bool) -> bool:
  """Whether x's batch folds into M (w has none): one bigger product."""
  return not transpose_x and math.prod(w_shape[:-2]) == 1 and len(x_shape) > 2


def shape_plan(x_shape, w_shape, *, x_dtype, w_dtype, compute_dtype, out_dtype,
               residual_dtype=None, aux_dtype=None, transpose_x: bool = False,
               transpose_w: bool = False, quantize: str | None = None,
               cfg: MosaicConfig) -> "Plan":
  """A `Plan` with the shapes, dtypes and tiling of a call (what the guard
  asks `tma_shape_reason` about; the epilogue's details do not matter)."""
  m, k = (x_shape[-1], x_shape[-2]) if transpose_x else (x_shape[-2], x_shape[-1])
  n = w_shape[-2] if transpose_w else w_shape[-1]
  if folded(x_shape, w_shape, transpose_x):
    m = math.prod(x_shape[:-1])
  return Plan(m=m, n=n, k=k, batch=1, x_batched=False, w_batched=False, rows_batched=False,
              transpose_x=transpose_x, transpose_w=transpose_w,
              x_dtype=jnp.dtype(x_dtype).name, w_dtype=jnp.dtype(w_dtype).name,
              compute_dtype=jnp.dtype(compute_dtype).name,
              out_dtype=jnp.dtype(out_dtype).name, has_row_scale=False, col_vectors=(),
              group_size=None,
              residual_dtype=None if residual_dtype is None else jnp.dtype(residual_dtype).name,
              activation="identity", clamp=None, quantize=quantize,
              aux_dtype=None if aux_dtype is None else jnp.dtype(aux_dtype).name, cfg=cfg,
              num_sms=1, interpret=True)


def _needs_f32_hop(src, dst) -> bool:
  """Hopper converts float8 to float16 only: other targets go through f32."""
  return jnp.dtype(src).name.startswith("float8") and jnp.dtype(dst) != jnp.float16


def _vector(ref, broadcast_dim: int):
  """A float32 vector, laid out to broadcast along `broadcast_dim` of a
  `wgmma` accumulator (0: per-column values). From global memory the load
  is element-wise (`optimized=False`: jax 0.11 has no vectorized global
  loads); the vectors are a few hundred bytes per tile, in L2."""
  layout = plgpu.Layout.WGMMA.reduce(broadcast_dim)
  return plgpu.load(ref, layout=layout, optimized=False).astype(_F32)


def _kernel(*refs, p: Plan):
  cfg = p.cfg
  tm, tn, tk = cfg.tile_m, cfg.tile_n, cfg.tile_k
  refs = list(refs)
  x_g = refs.pop(0)
  w_g = refs.pop(0)
  gs_g = refs.pop(0) if p.group_size else None
  rows_g = refs.pop(0) if p.has_row_scale else None
  cols_g = refs.pop(0) if p.col_vectors else None
  res_g = refs.pop(0) if p.residual_dtype else None
  out_g = refs.pop(0)
  qs_g = refs.pop(0) if p.quantize else None
  aux_g = refs.pop(0) if p.aux_dtype else None

  cdt = jnp.dtype(p.compute_dtype)
  odt = p.store_dtype
  wgs = cfg.compute_wgs
  split_n = wgs > 1 and cfg.wg_dimension == "n"
  split_m = wgs > 1 and cfg.wg_dimension == "m"
  slots = p.slots
  em, en = cfg.epi_tile_m, cfg.epi_tile_n

  x_block, x_tf = operand_tiles(p)[0]
  w_block, w_tf = operand_tiles(p)[1]
  in_specs = [
      plgpu.BlockSpec(x_block, (lambda kk: (kk, 0)) if p.transpose_x else (lambda kk: (0, kk)),
                      transforms=x_tf, memory_space=plgpu.SMEM),
      plgpu.BlockSpec(w_block, (lambda kk: (0, kk)) if p.transpose_w else (lambda kk: (kk, 0)),
                      transforms=w_tf, memory_space=plgpu.SMEM),
  ]
  if p.group_size:
    steps_per_group = p.group_size // tk
    in_specs.append(plgpu.BlockSpec((1, p.cta_n), lambda kk: (kk // steps_per_group, 0),
                                    memory_space=plgpu.SMEM))

  def pipeline(body, context):
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(p.k_iters,), memory_registers=cfg.memory_registers,
        in_specs=in_specs, wg_axis="wg", num_compute_wgs=wgs,
        max_concurrent_steps=cfg.stages, compute_context=context)

  def panels(b, m_slice, n_slice):
    """The pipeline's operands: the CTA's panels of x, w (and group scales)."""
    xb = x_g.at[b if p.x_batched else 0]
    wb = w_g.at[b if p.w_batched else 0]
    out = [xb.at[:, m_slice] if p.transpose_x else xb.at[m_slice, :],
           wb.at[n_slice, :] if p.transpose_w else wb.at[:, n_slice]]
    if p.group_size:
      out.append(gs_g.at[:, n_slice])
    return out

  def ignore(*_, **__):
    return None

  res_in_out = p.residual_dtype is not None and jnp.dtype(p.residual_dtype) == odt
  scratch = dict(
      # The allocations depend on the block shapes and dtypes only.
      pipeline_allocs=pipeline(ignore, ignore).get_allocations(
          x_g.at[0], w_g.at[0], *([gs_g] if p.group_size else [])),
      out_smem=plgpu.SMEM((wgs, slots, em, en), odt, transforms=epilogue_transforms(p, odt)),
      barriers=plgpu.Barrier(num_barriers=wgs * slots),
  )
  if p.residual_dtype is not None and not res_in_out:
    rdt = jnp.dtype(p.residual_dtype)
    scratch["res_smem"] = plgpu.SMEM((wgs, slots, em, en), rdt,
                                     transforms=epilogue_transforms(p, rdt))
  if p.aux_dtype is not None:
    adt = jnp.dtype(p.aux_dtype)
    scratch["aux_smem"] = plgpu.SMEM((wgs, em, en), adt, transforms=epilogue_transforms(p, adt))
  if p.quantize:
    scratch["qs_smem"] = plgpu.SMEM((wgs, tm), _F32)
  # Staged operands keep their stored orientation, except that TF32 wgmma
  # reads K-major operands only: [rows, tile_k], [tile_n, tile_k].
  x_rows = tm if split_m else p.cta_m
  x_buf_k_major = p.tf32 or not p.transpose_x
  w_buf_k_major = p.tf32 or p.transpose_w
  if p.x_staged:
    shape = (x_rows, tk) if x_buf_k_major else (tk, x_rows)
    scratch["x_buf"] = plgpu.SMEM((wgs,) + shape, cdt, transforms=_transforms(shape[1], cdt))
  if p.w_staged:
    shape = (tn, tk) if w_buf_k_major else (tk, tn)
    scratch["w_buf"] = plgpu.SMEM((wgs,) + shape, cdt, transforms=_transforms(shape[1], cdt))

  @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
  def _scope(pipeline_allocs, out_smem, barriers, res_smem=None, aux_smem=None,
             qs_smem=None, x_buf=None, w_buf=None):
    wg = lax.axis_index("wg")
    smem = _Smem(out=out_smem, res=out_smem if res_in_out else res_smem, aux=aux_smem,
                 qs=qs_smem, barriers=barriers)
    gmem = _Gmem(out=out_g, qs=qs_g, aux=aux_g, res=res_g, rows=rows_g, cols=cols_g)

    @plgpu.nd_loop((p.batch * p.m_iters * p.n_iters,), collective_axes="sm")
    def _tiles(info):
      (lin,) = info.index
      tiles = p.m_iters * p.n_iters
      b = lax.div(lin, tiles) if p.batch > 1 else 0
      t = lax.rem(lin, tiles) if p.batch > 1 else lin
      mi, ni = plgpu.planar_snake(t, (p.m_iters, p.n_iters),
                                  1 if cfg.grid_minor == "n" else 0, cfg.grid_tile_width)
      m_slice = pl.ds(mi * p.cta_m, p.cta_m)
      n_slice = pl.ds(ni * p.cta_n, p.cta_n)
      wg_m = pl.ds(wg * tm if split_m else 0, tm)
      wg_n = pl.ds(wg * tn if split_n else 0, tn)

      def staged(tile, buf, same_orientation: bool, scale=None):
        """Converts a tile to the compute dtype (times per-column `scale`
        values) and writes it to `buf`, transposed unless `same_orientation`."""
        values = tile[...]
        if scale is not None or _needs_f32_hop(tile.dtype, cdt):
          values = values.astype(_F32)
        if scale is not None:
          values = values * scale(values.shape)
        values = values.astype(cdt)
        if same_orientation:
          buf[...] = values
        else:
          buf.transpose((1, 0))[...] = values
        plgpu.commit_smem()  # Visible to wgmma (the async proxy) from here.
        return buf

      def x_operand(x_smem):
        """x's `wgmma` operand [rows, tile_k] from shared memory."""
        view = x_smem
        if split_m:
          view = view.at[:, wg_m] if p.transpose_x else view.at[wg_m]
        if p.x_staged:
          buf = staged(view, x_buf.at[wg], same_orientation=x_buf_k_major != p.transpose_x)
          return buf if x_buf_k_major else buf.transpose((1, 0))
        return view.transpose((1, 0)) if p.transpose_x else view

      def w_operand(w_smem, gs_smem):
        """w's `wgmma` operand [tile_k, tile_n] from shared memory."""
        view = w_smem
        if split_n:
          view = view.at[wg_n, :] if p.transpose_w else view.at[:, wg_n]
        if not p.w_staged:
          return view.transpose((1, 0)) if p.transpose_w else view
        scale = None
        if p.group_size:
          row = gs_smem.at[0, wg_n] if split_n else gs_smem.at[0]

          def scale(shape):
            return lax.broadcast_in_dim(row[...], shape, [0] if p.transpose_w else [1])
        buf = staged(view, w_buf.at[wg], same_orientation=w_buf_k_major == p.transpose_w,
                     scale=scale)
        return buf.transpose((1, 0)) if w_buf_k_major else buf

      def mma_body(_, x_smem, w_smem, *rest):
        *gs, acc_ref = rest
        plgpu.wgmma(acc_ref, x_operand(x_smem), w_operand(w_smem, gs[0] if gs else None))
        # One wgmma in flight: the next step reuses the dequantized buffer.
        plgpu.wgmma_wait(0)
        return acc_ref

      def context(run_pipeline):
        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tm, tn), p.acc_dtype))
        def _acc(acc_ref):
          run_pipeline(acc_ref)
          _epilogue(p, acc_ref[...].astype(_F32), _Tile(wg=wg, b=b, m_slice=m_slice, n_slice=n_slice,
                                           wg_m=wg_m, wg_n=wg_n), smem, gmem)

      pipeline(mma_body, context)(*panels(b, m_slice, n_slice), allocations=pipeline_allocs)

  # Every store must land before the kernel exits.
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


@dataclasses.dataclass(frozen=True)
class _Tile:
  """Where one warpgroup's tile is: batch, CTA slices, its part of them."""

  wg: jax.Array
  b: jax.Array | int
  m_slice: pl.Slice
  n_slice: pl.Slice
  wg_m: pl.Slice
  wg_n: pl.Slice


@dataclasses.dataclass(frozen=True)
class _Smem:
  out: object
  res: object
  aux: object
  qs: object
  barriers: object


@dataclasses.dataclass(frozen=True)
class _Gmem:
  out: object
  qs: object
  aux: object
  res: object
  rows: object
  cols: object


def _epilogue(p: Plan, acc, t: _Tile, smem: _Smem, gmem: _Gmem):
  """The fused epilogue of one warpgroup's tile (see the module docstring)."""
  cfg = p.cfg
  tm, tn = cfg.tile_m, cfg.tile_n
  em, en = cfg.epi_tile_m, cfg.epi_tile_n
  slots = p.slots
  odt = p.store_dtype
  wg = t.wg
  bo = t.b if p.batch > 1 else 0
  bars = smem.barriers

  wgs = cfg.compute_wgs

  def res_barrier(slot):
    return bars.at[wg * slots + slot]

  # The tile's vectors are read from global memory (L2), padded to whole
  # CTA tiles by the launch: no reads past their ends.
  col = {name: i for i, name in enumerate(p.col_vectors)}
  cols = gmem.cols.at[:, t.n_slice].at[:, t.wg_n] if gmem.cols is not None else None
  rows = None
  if gmem.rows is not None:
    rows = gmem.rows.at[t.b if p.rows_batched else 0, t.m_slice].at[t.wg_m]

  def col_vector(name, esn):
    v = _vector(cols.at[col[name], esn], 0)
    return lax.broadcast_in_dim(v, (em, en), [1])

  def dequantized(esm, esn):
    a = acc[esm, esn]
    if rows is not None:
      a = a * lax.broadcast_in_dim(_vector(rows.at[esm], 1), (em, en), [0])
    if "col_scale" in col:
      a = a * col_vector("col_scale", esn)
    return a

  def activated(a, esn):
    y = a
    if "scale" in col:
      y = y * col_vector("scale", esn)
    if "bias" in col:
      y = y + col_vector("bias", esn)
    return triton_kernel.activation_fn(p.activation, y)

  out_tile = gmem.out.at[bo, t.m_slice, t.n_slice].at[t.wg_m, t.wg_n]
  res_tile = None
  if gmem.res is not None:
    res_tile = gmem.res.at[bo, t.m_slice, t.n_slice].at[t.wg_m, t.wg_n]
  pieces = [(slice(i * em, (i + 1) * em), slice(j * en, (j + 1) * en))
            for i in range(tm // em) for j in range(tn // en)]

  # Earlier tiles' stores may still read the staging buffers.
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)
  if p.quantize:
    # The rows' max |y| first (the tile spans each row: see the guard),
    # without the columns past N; the residual pieces are read twice.
    for i in range(tm // em):
      row_max = None
      for j in range(tn // en):
        esm, esn = pieces[i * (tn // en) + j]
        y = activated(dequantized(esm, esn), esn)
        if res_tile is not None:
          plgpu.copy_gmem_to_smem(res_tile.at[esm, esn], smem.res.at[wg, 0], res_barrier(0))
          plgpu.barrier_wait(res_barrier(0))
          y = y + smem.res[wg, 0].astype(_F32)
        if p.clamp is not None:
          y = triton_kernel.clamp_values(y, p.clamp)
        column = plgpu.broadcasted_iota(jnp.int32, (em, en), 1, layout=plgpu.Layout.WGMMA)
        inside = column + (t.n_slice.start + t.wg_n.start + j * en) < p.n
        part = jnp.max(jnp.where(inside, jnp.abs(y), 0.0), axis=1)
        row_max = part if row_max is None else jnp.maximum(row_max, part)
      smem.qs[wg, pl.ds(i * em, em)] = quant.scale_from_amax(row_max, p.quantize)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem.qs.at[wg], gmem.qs.at[bo, t.m_slice].at[t.wg_m])

  for index, (esm, esn) in enumerate(pieces):
    slot = index % slots
    # The store that last used this slot (two pieces ago) has read it.
    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
    if res_tile is not None:
      plgpu.copy_gmem_to_smem(res_tile.at[esm, esn], smem.res.at[wg, slot],
                              res_barrier(slot))
    a = dequantized(esm, esn)
    if smem.aux is not None:
      # What the backward differentiates the epilogue at.
      smem.aux[wg] = a.astype(smem.aux.dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem.aux.at[wg], gmem.aux.at[bo, t.m_slice, t.n_slice]
                              .at[t.wg_m, t.wg_n].at[esm, esn])
    y = activated(a, esn)
    if res_tile is not None:
      plgpu.barrier_wait(res_barrier(slot))
      y = y + smem.res[wg, slot].astype(_F32)
    if p.clamp is not None:
      y = triton_kernel.clamp_values(y, p.clamp)
    if p.quantize:
      s = lax.broadcast_in_dim(_vector(smem.qs.at[wg, esm], 1), (em, en), [0])
      y = quant.quantize(y, s, p.quantize, native_round=True)
    smem.out[wg, slot] = y.astype(odt)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem.out.at[wg, slot], out_tile.at[esm, esn])


# --------------------------------------------------------------------------
# Launch.
# --------------------------------------------------------------------------


def _pad_last(a: jax.Array, multiple: int) -> jax.Array:
  """Pads the last axis to a multiple: whole CTA tiles of the epilogue's
  vectors (read without bounds), 16-byte rows of group scales (TMA)."""
  extra = -a.shape[-1] % multiple
  if not extra:
    return a
  return jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, extra)])


def matmul_forward(
    x: jax.Array, w: jax.Array, *, cfg: MosaicConfig, interpret: bool,
    compute_dtype, out_dtype, activation: str = "identity",
    x_row_scale: jax.Array | None = None, w_col_scale: jax.Array | None = None,
    w_group_scale: jax.Array | None = None, group_size: int | None = None,
    scale: jax.Array | None = None, bias: jax.Array | None = None,
    residual: jax.Array | None = None,
    clamp: tuple[float | None, float | None] | None = None,
    transpose_x: bool = False, transpose_w: bool = False, transpose_out: bool = False,
    quantize: str | None = None, save_aux: bool = False, aux_dtype=_F32,
    num_sms: int | None = None, **_: object) -> triton_kernel.ForwardOutputs:
  """Launches the Mosaic GPU forward kernel on canonical operands.

  The same contract as `kernel.matmul_forward` (the Triton launch): the
  caller has validated shapes and folded scalar scales into `w_col_scale`;
  `guard.mosaic_unsupported_reason` has accepted the call and `cfg`.

  Args:
    x, w, ...: as `kernel.matmul_forward`.
    cfg: the Mosaic GPU tiling.
    interpret: run in Mosaic GPU's interpret mode (CPU) instead of compiling.
    num_sms: CTAs of the persistent grid (default: the target's SM count).

  Raises:
    ValueError: for `transpose_out` (the guard keeps it on Triton).
  """
  if transpose_out:
    raise ValueError("the Mosaic GPU matmul stores row-major tiles (transpose_out)")
  m, k = (x.shape[-1], x.shape[-2]) if transpose_x else (x.shape[-2], x.shape[-1])
  n = w.shape[-2] if transpose_w else w.shape[-1]
  batch_shape = tuple(jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2]))
  # Fold x's batch into M when w has no batch: one bigger matmul, better tiles.
  fold = folded(x.shape, w.shape, transpose_x)
  if fold:
    m_eff, batch = math.prod(x.shape[:-1]), 1
    x3 = x.reshape(1, m_eff, k)
    w3 = w.reshape((1,) + w.shape[-2:])
    x_batched = w_batched = False
  else:
    m_eff, batch = m, math.prod(batch_shape)
    x3, x_batched = triton_kernel._to3(x, batch_shape)  # noqa: SLF001
    w3, w_batched = triton_kernel._to3(w, batch_shape)  # noqa: SLF001

  args = [x3, w3]
  cta_m = cfg.tile_m * (cfg.compute_wgs if cfg.wg_dimension == "m" else 1)
  cta_n = cfg.tile_n * (cfg.compute_wgs if cfg.wg_dimension == "n" else 1)
  if w_group_scale is not None:
    args.append(_pad_last(w_group_scale.astype(_F32), 4))
  rows_batched = False
  if x_row_scale is not None:
    rs = jnp.broadcast_to(x_row_scale, x.shape[:-2] + (m,)).astype(_F32)
    if fold or not x_batched:
      rs = rs.reshape(1, m_eff)
    else:
      rs = jnp.broadcast_to(rs, batch_shape + (m,)).reshape(batch, m)
      rows_batched = True
    args.append(_pad_last(rs, cta_m))
  vectors = {"col_scale": w_col_scale, "scale": scale, "bias": bias}
  col_vectors = tuple(name for name in COL_VECTORS if vectors[name] is not None)
  if col_vectors:
    args.append(_pad_last(jnp.stack([jnp.broadcast_to(vectors[name], (n,)).astype(_F32)
                                     for name in col_vectors]), cta_n))
  if residual is not None:
    args.append(residual.reshape(batch, m_eff, n))

  odt = jnp.dtype(quant.dtype_of(quantize) if quantize else out_dtype)
  out_types = [jax.ShapeDtypeStruct((batch, m_eff, n), odt)]
  if quantize:
    out_types.append(jax.ShapeDtypeStruct((batch, m_eff), _F32))
  if save_aux:
    out_types.append(jax.ShapeDtypeStruct((batch, m_eff, n), aux_dtype))

  if num_sms is None:
    num_sms = INTERPRET_SMS if interpret else (backend_lib.target().core_count or 132)
  p = Plan(m=m_eff, n=n, k=k, batch=batch, x_batched=x_batched, w_batched=w_batched,
           rows_batched=rows_batched, transpose_x=transpose_x, transpose_w=transpose_w,
           x_dtype=jnp.dtype(x.dtype).name, w_dtype=jnp.dtype(w.dtype).name,
           compute_dtype=jnp.dtype(compute_dtype).name, out_dtype=jnp.dtype(out_dtype).name,
           has_row_scale=x_row_scale is not None, col_vectors=col_vectors,
           group_size=group_size if w_group_scale is not None else None,
           residual_dtype=None if residual is None else jnp.dtype(residual.dtype).name,
           activation=activation, clamp=clamp, quantize=quantize,
           aux_dtype=jnp.dtype(aux_dtype).name if save_aux else None, cfg=cfg,
           num_sms=num_sms, interpret=bool(interpret))
  tiles = batch * p.m_iters * p.n_iters
  def body(*refs):
    return _kernel(*refs, p=p)

  # The kernel's name (dumps, profiles) carries its tiling.
  body.__name__ = body.__qualname__ = kernel_name(cfg)
  call = plgpu.kernel(
      body,
      out_type=tuple(out_types),
      grid=(max(1, min(num_sms, tiles)),),
      grid_names=("sm",),
      num_threads=cfg.compute_wgs + 1,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      **({"interpret": compat.mosaic_interpret_params()} if interpret else {}),
  )
  with backend_lib.kernel_scope("matmul"):
    results = list(call(*args))
  lead = tuple(batch_shape)
  out = results.pop(0).reshape(lead + (m, n))
  scales = results.pop(0).reshape(lead + (m, 1)) if quantize else None
  aux = results.pop(0).reshape(lead + (m, n)) if save_aux else None
  return triton_kernel.ForwardOutputs(out, scales, aux)
