"""Pallas kernels of the batch norm over channels-last x, viewed as [M, C].

Four launches, two per direction, each a sweep over x in [block_m, block_c]
tiles (`config.py`):

* statistics: programs (split s, channel tile j) walk their split's rows
  with a `fori_loop`, summing `x - k` and `(x - k)**2` per channel in f32,
  where `k` is x's first row (a shift: E[(x-k)^2] - E[x-k]^2 cancels only
  as much as the mean lies from a sample, about one standard deviation,
  where E[x^2] - E[x]^2 would cancel the whole mean). Each split writes its
  f32 partial row; XLA sums the [splits, C] partials and forms mean and the
  biased variance (a [C] computation).
* normalize: one tile per program, y = act((x - mean) * rstd * gamma + beta).
* backward sums: as the statistics, reading x and the cotangent g: the
  activation's derivative is recomputed from x and the saved mean and rstd
  (dy = g * act'(pre)), and dbeta = sum(dy), dgamma = sum(dy * x_hat) are
  summed in the same pass, so dy is never written.
* backward dx: one tile per program, dy recomputed the same way, and
  dx = a * dy + b * x_hat + c with per-channel a, b, c formed by XLA from
  the sums (`vjp.py`).

Like the other Triton-lowered kernels (see `gpu.py`), every load and store at
a ragged edge (rows, channels) is masked; rows past M read zero, whose
terms vanish (the statistics mask their shifted values, the backward's
cotangent is zero there).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.batch_norm.config import Config
from pallas_kernels._src.ops.conv2d.kernel import activation_fn, activation_grad

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """One launch's static shape and options."""

  m: int
  c: int
  cfg: Config
  #: Canonical activation name ("identity" for none).
  activation: str
  interpret: bool

  @property
  def c_tiles(self) -> int:
    return pl.cdiv(self.c, self.cfg.block_c)

  @property
  def steps(self) -> int:
    return self.cfg.steps(self.m)


def _channels(p: _Launch):
  """This program's channel-tile mask (None where C fills whole tiles)."""
  bc = p.cfg.block_c
  cols = pl.program_id(1) * bc + jnp.arange(bc, dtype=jnp.int32)
  return (cols < p.c) if p.c % bc else None


def _vectors(refs, c_ok):
  """The per-channel f32 vectors of this channel tile (zero past C)."""
  return [gpu.read_tile(r, c_ok).astype(_F32) for r in refs]


def _pre(p: _Launch, x, mean, rstd, gamma, beta):
  """(x_hat, the activation's input) of an f32 tile."""
  xhat = (x - mean[None, :]) * rstd[None, :]
  return xhat, xhat * gamma[None, :] + beta[None, :]


def _dy(p: _Launch, g, pre):
  """The cotangent through the activation, recomputed (never stored)."""
  if p.activation == "identity":
    return g
  return g * activation_grad(p.activation, pre)


def _walk(p: _Launch, refs, c_ok, body):
  """Folds `body(tiles, row_mask) -> (a, b)` over this split's row tiles of
  the [M, C] refs, summing each over rows into f32 [block_c]; returns the sums."""
  bm, bc = p.cfg.block_m, p.cfg.block_c
  base = pl.program_id(0) * (p.steps * bm)

  def step(i, carry):
    r0 = pl.multiple_of(i * bm, bm)
    q = base + r0 + jnp.arange(bm, dtype=jnp.int32)
    mask = gpu.mask2(q < p.m, c_ok)
    tiles = [gpu.read_tile(r.at[pl.ds(r0, bm), :], mask).astype(_F32) for r in refs]
    a, b = body(tiles, mask)
    return carry[0] + jnp.sum(a, axis=0), carry[1] + jnp.sum(b, axis=0)

  zeros = jnp.zeros((bc,), _F32)
  return jax.lax.fori_loop(0, p.steps, step, (zeros, zeros))


def _stats_kernel(x_ref, shift_ref, s1_ref, s2_ref, *, p: _Launch):
  c_ok = _channels(p)
  (shift,) = _vectors((shift_ref,), c_ok)

  def body(tiles, mask):
    d = jnp.where(mask, tiles[0] - shift[None, :], 0.0)
    return d, d * d

  s1, s2 = _walk(p, (x_ref,), c_ok, body)
  gpu.write_tile(s1_ref, s1, c_ok)
  gpu.write_tile(s2_ref, s2, c_ok)


def _sums_kernel(x_ref, g_ref, mean_ref, rstd_ref, gamma_ref, beta_ref, db_ref, dg_ref, *,
                 p: _Launch):
  c_ok = _channels(p)
  mean, rstd, gamma, beta = _vectors((mean_ref, rstd_ref, gamma_ref, beta_ref), c_ok)

  def body(tiles, mask):
    del mask  # g reads zero outside it: so does dy.
    x, g = tiles
    xhat, pre = _pre(p, x, mean, rstd, gamma, beta)
    dy = _dy(p, g, pre)
    return dy, dy * xhat

  db, dg = _walk(p, (x_ref, g_ref), c_ok, body)
  gpu.write_tile(db_ref, db, c_ok)
  gpu.write_tile(dg_ref, dg, c_ok)


def _tile_mask(p: _Launch, c_ok):
  bm = p.cfg.block_m
  rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)
  return gpu.mask2((rows < p.m) if p.m % bm else None, c_ok)


def _normalize_kernel(x_ref, mean_ref, rstd_ref, gamma_ref, beta_ref, y_ref, *,
                      p: _Launch):
  c_ok = _channels(p)
  mask = _tile_mask(p, c_ok)
  mean, rstd, gamma, beta = _vectors((mean_ref, rstd_ref, gamma_ref, beta_ref), c_ok)
  x = gpu.read_tile(x_ref, mask).astype(_F32)
  _, pre = _pre(p, x, mean, rstd, gamma, beta)
  gpu.write_tile(y_ref, activation_fn(p.activation, pre), mask)


def _dx_kernel(x_ref, g_ref, mean_ref, rstd_ref, gamma_ref, beta_ref, a_ref, b_ref, c_ref,
               dx_ref, *, p: _Launch):
  c_ok = _channels(p)
  mask = _tile_mask(p, c_ok)
  mean, rstd, gamma, beta, a, b, c = _vectors(
      (mean_ref, rstd_ref, gamma_ref, beta_ref, a_ref, b_ref, c_ref), c_ok)
  x = gpu.read_tile(x_ref, mask).astype(_F32)
  g = gpu.read_tile(g_ref, mask).astype(_F32)
  xhat, pre = _pre(p, x, mean, rstd, gamma, beta)
  dx = a[None, :] * _dy(p, g, pre) + b[None, :] * xhat + c[None, :]
  gpu.write_tile(dx_ref, dx, mask)


def _call(body, p: _Launch, name: str, *, column_sums: bool, arrays, vectors, out_dtype,
          flops: int):
  """Runs `body` over [M, C] `arrays` and [C] `vectors`: a column-sum pass
  (grid splits x channel tiles, two f32 [splits, C] partials out) or an
  elementwise one (grid row tiles x channel tiles, one [M, C] array out)."""
  cfg = p.cfg
  bm, bc = cfg.block_m, cfg.block_c
  vec = pl.BlockSpec((bc,), lambda i, j: (j,))
  if column_sums:
    grid = (cfg.splits, p.c_tiles)
    # One split's row range is one block, walked in block_m steps.
    tile = pl.BlockSpec((p.steps * bm, bc), lambda i, j: (i, j))
    partial = pl.BlockSpec((None, bc), lambda i, j: (i, j))
    out_shape = [jax.ShapeDtypeStruct((cfg.splits, p.c), _F32)] * 2
    out_specs = [partial, partial]
  else:
    grid = (pl.cdiv(p.m, bm), p.c_tiles)
    tile = pl.BlockSpec((bm, bc), lambda i, j: (i, j))
    out_shape = [jax.ShapeDtypeStruct((p.m, p.c), out_dtype)]
    out_specs = [tile]
  read = sum(a.size * a.dtype.itemsize for a in arrays)
  written = sum(s.size * jnp.dtype(s.dtype).itemsize for s in out_shape)
  params = None if p.interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                         num_stages=cfg.num_stages)
  call = pl.pallas_call(
      functools.partial(body, p=p),
      out_shape=out_shape,
      grid=grid,
      in_specs=[tile] * len(arrays) + [vec] * len(vectors),
      out_specs=out_specs,
      compiler_params=params,
      interpret=p.interpret,
      cost_estimate=pl.CostEstimate(flops=flops * p.m * p.c, transcendentals=0,
                                    bytes_accessed=read + written),
      name=f"pallas_kernels_batch_norm_{name}",
  )
  with backend_lib.kernel_scope("batch_norm"):
    return call(*arrays, *(v.astype(_F32) for v in vectors))


def _launch(x2, cfg: Config, activation: str, interpret: bool) -> _Launch:
  m, c = x2.shape
  return _Launch(m=int(m), c=int(c), cfg=cfg, activation=activation,
                 interpret=bool(interpret))


def statistics(x2, *, cfg: Config, interpret: bool):
  """(mean, biased variance), f32 [C], of [M, C] x2 over its rows."""
  p = _launch(x2, cfg, "identity", interpret)
  shift = x2[0].astype(_F32)
  s1, s2 = _call(_stats_kernel, p, "stats", column_sums=True, arrays=(x2,),
                 vectors=(shift,), out_dtype=None, flops=4)
  d = jnp.sum(s1, axis=0) / p.m
  var = jnp.maximum(jnp.sum(s2, axis=0) / p.m - d * d, 0.0)
  return shift + d, var


def normalize(x2, mean, rstd, gamma, beta, *, activation: str, cfg: Config,
              interpret: bool):
  """act((x2 - mean) * rstd * gamma + beta) in x2's dtype."""
  p = _launch(x2, cfg, activation, interpret)
  (y,) = _call(_normalize_kernel, p, "normalize", column_sums=False, arrays=(x2,),
               vectors=(mean, rstd, gamma, beta), out_dtype=x2.dtype, flops=5)
  return y


def backward_sums(x2, g2, mean, rstd, gamma, beta, *, activation: str, cfg: Config,
                  interpret: bool):
  """(dbeta, dgamma), f32 [C]: sum(dy) and sum(dy * x_hat) over the rows,
  dy = g2 * act'(pre) recomputed from x2."""
  p = _launch(x2, cfg, activation, interpret)
  db, dg = _call(_sums_kernel, p, "bwd_sums", column_sums=True, arrays=(x2, g2),
                 vectors=(mean, rstd, gamma, beta), out_dtype=None, flops=10)
  return jnp.sum(db, axis=0), jnp.sum(dg, axis=0)


def backward_dx(x2, g2, mean, rstd, gamma, beta, a, b, c, *, activation: str,
                cfg: Config, interpret: bool, dx_dtype):
  """dx = a * dy + b * x_hat + c per channel, dy recomputed from x2 and g2."""
  p = _launch(x2, cfg, activation, interpret)
  (dx,) = _call(_dx_kernel, p, "bwd_dx", column_sums=False, arrays=(x2, g2),
                vectors=(mean, rstd, gamma, beta, a, b, c), out_dtype=dx_dtype, flops=12)
  return dx
