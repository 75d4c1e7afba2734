"""Pallas kernel: the weight gradient x^T @ dy with Adam's update as its epilogue.

The grid is (K tiles, N tiles) over the [K, N] weight. A program's BlockSpecs
hand it x's [Mp, block_k] column panel and dy's [Mp, block_n] column panel
(Mp = M rounded up to block_m), which it walks in `block_m` steps with a
`fori_loop` and an f32 accumulator in registers: the matmul kernel's loop for
a transposed x, contracting the tokens. Then it reads its param, mu and nu
tiles, applies the update (`adam.tile_update`, optax's terms in optax's
order, written apart from the reference's so that each holds the other) and
stores the three updated tiles. The gradient exists only in registers:
it is never written, and no other kernel reads it back.

The bias corrections 1 - b1**t and 1 - b2**t and the learning rate enter as
f32[1] arrays (computed by XLA from `count`, so a jitted training step does
not retrace per step); b1, b2, eps, eps_root and weight_decay are constants
of the kernel.

Like the matmul kernel (see its module docstring), the body is written for
Pallas' Triton lowering and runs unchanged in interpret mode: every access at
a ragged edge (M, K or N not a multiple of its block) goes through a masked
load/store; divisible dimensions load unmasked.
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
from pallas_kernels._src.ops.adam_matmul.config import Config

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """Static description of one launch: x [M, K] (or [K, M]), dy [M, N]."""

  m: int
  k: int
  n: int
  transpose_x: bool
  hyper: adam.Hyper
  compute_dtype: str
  interpret: bool
  cfg: Config

  @property
  def mp(self) -> int:
    return pl.cdiv(self.m, self.cfg.block_m) * self.cfg.block_m


def _kernel(x_ref, dy_ref, p_ref, mu_ref, nu_ref, lr_ref, c1_ref, c2_ref,
            p_out, mu_out, nu_out, *, s: _Launch):
  cfg = s.cfg
  bk, bn, bm = cfg.block_k, cfg.block_n, cfg.block_m
  i, j = pl.program_id(0), pl.program_id(1)
  row_ok = (i * bk + jnp.arange(bk, dtype=jnp.int32) < s.k) if s.k % bk else None
  col_ok = (j * bn + jnp.arange(bn, dtype=jnp.int32) < s.n) if s.n % bn else None
  ragged_m = s.m % bm != 0
  cdt = jnp.dtype(s.compute_dtype)
  if s.interpret:
    # XLA:CPU cannot run some bf16 x bf16 -> f32 dots; 16-bit products are
    # exact in f32, so widening changes nothing but the summation order.
    cdt = jnp.dtype(_F32)
  # IEEE float32 for f32 tiles (the f32 tolerance); 16-bit tiles are exact anyway.
  precision = (jax.lax.Precision.HIGHEST if jnp.dtype(s.compute_dtype) == _F32
               else jax.lax.Precision.DEFAULT)

  def m_step(mm, acc):
    m0 = pl.multiple_of(mm * bm, bm)
    # Past M, x and dy read zeros: the padded block holds garbage (NaN when
    # interpreted) that must not enter the sums.
    m_ok = (m0 + jnp.arange(bm, dtype=jnp.int32) < s.m) if ragged_m else None
    if s.transpose_x:  # x stored [Mp, bk]: contract axis 0.
      xt = gpu.read_tile(x_ref.at[pl.ds(m0, bm), :], gpu.mask2(m_ok, row_ok))
      x_dims = (0,)
    else:  # x stored [bk, Mp]: contract axis 1.
      xt = gpu.read_tile(x_ref.at[:, pl.ds(m0, bm)], gpu.mask2(row_ok, m_ok))
      x_dims = (1,)
    dyt = gpu.read_tile(dy_ref.at[pl.ds(m0, bm), :], gpu.mask2(m_ok, col_ok))
    return acc + jax.lax.dot_general(
        xt.astype(cdt), dyt.astype(cdt), ((x_dims, (0,)), ((), ())),
        precision=precision, preferred_element_type=_F32)

  g = jax.lax.fori_loop(0, s.mp // bm, m_step, jnp.zeros((bk, bn), _F32))
  tile = gpu.mask2(row_ok, col_ok)
  # Outside the tile's valid part everything reads zero: the update is then
  # 0 / (sqrt(0) + eps) = 0 there (no NaN), and nothing of it is stored.
  param, mu, nu = (gpu.read_tile(ref, tile).astype(_F32) for ref in (p_ref, mu_ref, nu_ref))
  lr, c1, c2 = (ref[...].astype(_F32)[None, :] for ref in (lr_ref, c1_ref, c2_ref))
  new_p, new_mu, new_nu = adam.tile_update(g, param, mu, nu, lr, c1, c2, s.hyper)
  gpu.write_tile(p_out, new_p, tile)
  gpu.write_tile(mu_out, new_mu, tile)
  gpu.write_tile(nu_out, new_nu, tile)


def adam_step(x, dy, param, mu, nu, learning_rate, c1, c2, *, hyper: adam.Hyper,
              transpose_x: bool, cfg: Config, interpret: bool, in_place: bool = True):
  """(param', mu', nu') in their input dtypes for the gradient x^T @ dy.

  Args:
    x: [M, K] (transpose_x) or [K, M]; dy: [M, N], x's dtype.
    param, mu, nu: [K, N].
    learning_rate, c1, c2: f32[1] (c1, c2: the bias corrections 1 - b**t).
    hyper: Adam's constants.
    transpose_x: x's storage orientation.
    cfg: tiling (`config.choose_config` or the caller's, accepted by the guard).
    interpret: run through Pallas' interpreter instead of Triton.
    in_place: write the three outputs over param, mu and nu (aliased).
  """
  m, k = x.shape if transpose_x else x.shape[::-1]
  n = dy.shape[1]
  s = _Launch(m=m, k=k, n=n, transpose_x=transpose_x, hyper=hyper,
              compute_dtype=jnp.dtype(x.dtype).name, interpret=bool(interpret), cfg=cfg)
  bk, bn, mp = cfg.block_k, cfg.block_n, s.mp
  tile = pl.BlockSpec((bk, bn), lambda i, j: (i, j))
  scalar = pl.BlockSpec((1,), lambda i, j: (0,))
  x_spec = (pl.BlockSpec((mp, bk), lambda i, j: (0, i)) if transpose_x
            else pl.BlockSpec((bk, mp), lambda i, j: (i, 0)))
  specs = [x_spec, pl.BlockSpec((mp, bn), lambda i, j: (0, j)), tile, tile, tile,
           scalar, scalar, scalar]
  out_shapes = [jax.ShapeDtypeStruct((k, n), a.dtype) for a in (param, mu, nu)]
  params = None if interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                       num_stages=cfg.num_stages)
  itemsize = jnp.dtype(x.dtype).itemsize
  state = sum(jnp.dtype(a.dtype).itemsize for a in (param, mu, nu)) * k * n
  call = pl.pallas_call(
      functools.partial(_kernel, s=s),
      out_shape=out_shapes,
      grid=(pl.cdiv(k, bk), pl.cdiv(n, bn)),
      in_specs=specs,
      out_specs=[tile, tile, tile],
      # param', mu' and nu' overwrite their inputs' tiles after reading them:
      # a training step that donates its state updates it in place (one
      # that does not has XLA copy it first: in_place=False then).
      input_output_aliases={2: 0, 3: 1, 4: 2} if in_place else {},
      compiler_params=params,
      interpret=interpret,
      cost_estimate=pl.CostEstimate(
          flops=2 * m * k * n + 16 * k * n, transcendentals=k * n,
          bytes_accessed=(m * k + m * n) * itemsize + 2 * state),
      name="pallas_kernels_adam_matmul",
  )
  with backend_lib.kernel_scope("adam_matmul"):
    return tuple(call(x, dy, param, mu, nu, learning_rate, c1, c2))
