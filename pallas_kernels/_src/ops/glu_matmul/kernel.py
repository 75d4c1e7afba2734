"""Pallas GLU matmul kernels: act(x @ w_gate + b_gate) * (x @ w_up + b_up).

Forward (`forward`). The grid is (Mb, Fb) = (cdiv(M, block_m), cdiv(F, block_n)).
A program owns one [block_m, block_n] tile of the result; its BlockSpecs hand
it x's [block_m, Kp] row panel and the [Kp, block_n] column panels of both
weights (Kp = K rounded up to block_k), which it walks in `block_k` steps with
a `fori_loop`, each x tile loaded once and fed to both dots, into two f32
accumulators. The epilogue adds the biases, applies the activation to the
gate, multiplies by the up projection and stores only that product (XLA
writes both [M, F] products, or one [M, 2F], and reads them back).

Backward (`backward`): the same loop recomputes both accumulators (nothing of
size [M, F] is saved by the forward), reads the dy tile and stores
dg = dy * u * act'(g) and du = dy * act(g), plus f32 column sums of dg and du
per row block (the bias gradients, summed over row blocks by XLA).

Like the matmul kernel (see its module docstring), the body is written for
Pallas' Triton lowering and runs unchanged in interpret mode: every access at
a ragged edge (M, F or K not a multiple of its block) goes through a masked
load/store; divisible dimensions load unmasked.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops.glu_matmul.config import Config
from pallas_kernels._src.ops.matmul.kernel import activation_fn, activation_grad

_F32 = jnp.float32



@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """Static description of one launch on [M, K] x and [K, F] weights."""

  m: int
  k: int
  f: int
  activation: str
  has_bias_gate: bool
  has_bias_up: bool
  compute_dtype: str
  backward: bool
  interpret: bool
  cfg: Config

  @property
  def kp(self) -> int:
    return pl.cdiv(self.k, self.cfg.block_k) * self.cfg.block_k


def _kernel(*refs, p: _Launch):
  cfg = p.cfg
  bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
  refs = list(refs)
  x_ref, wg_ref, wu_ref = refs.pop(0), refs.pop(0), refs.pop(0)
  bg_ref = refs.pop(0) if p.has_bias_gate else None
  bu_ref = refs.pop(0) if p.has_bias_up else None
  dy_ref = refs.pop(0) if p.backward else None

  i, j = pl.program_id(0), pl.program_id(1)
  row_ok = (i * bm + jnp.arange(bm, dtype=jnp.int32) < p.m) if p.m % bm else None
  col_ok = (j * bn + jnp.arange(bn, dtype=jnp.int32) < p.f) if p.f % bn else None
  ragged_k = p.k % bk != 0
  cdt = jnp.dtype(p.compute_dtype)
  if p.interpret:
    # XLA:CPU cannot run some bf16 x bf16 -> f32 dots; 16-bit products are
    # exact in f32, so widening changes nothing but the summation order.
    cdt = jnp.dtype(_F32)
  # IEEE float32 for f32 tiles (the f32 tolerance); 16-bit tiles are exact anyway.
  precision = (jax.lax.Precision.HIGHEST if jnp.dtype(p.compute_dtype) == _F32
               else jax.lax.Precision.DEFAULT)

  def k_step(kk, accs):
    acc_g, acc_u = accs
    k0 = pl.multiple_of(kk * bk, bk)
    # Past K, x and w read zeros: the padded block holds garbage (NaN when
    # interpreted) that must not enter the sums.
    k_ok = (k0 + jnp.arange(bk, dtype=jnp.int32) < p.k) if ragged_k else None
    xt = gpu.read_tile(x_ref.at[:, pl.ds(k0, bk)], gpu.mask2(row_ok, k_ok)).astype(cdt)
    w_mask = gpu.mask2(k_ok, col_ok)
    gt = gpu.read_tile(wg_ref.at[pl.ds(k0, bk), :], w_mask).astype(cdt)
    ut = gpu.read_tile(wu_ref.at[pl.ds(k0, bk), :], w_mask).astype(cdt)
    acc_g = acc_g + jax.lax.dot(xt, gt, precision=precision, preferred_element_type=_F32)
    acc_u = acc_u + jax.lax.dot(xt, ut, precision=precision, preferred_element_type=_F32)
    return acc_g, acc_u

  zeros = jnp.zeros((bm, bn), _F32)
  g, u = jax.lax.fori_loop(0, p.kp // bk, k_step, (zeros, zeros))
  if bg_ref is not None:
    g = g + gpu.read_tile(bg_ref, col_ok).astype(_F32)[None, :]
  if bu_ref is not None:
    u = u + gpu.read_tile(bu_ref, col_ok).astype(_F32)[None, :]
  tile_mask = gpu.mask2(row_ok, col_ok)

  if not p.backward:
    (o_ref,) = refs
    gpu.write_tile(o_ref, activation_fn(p.activation, g) * u, tile_mask)
    return

  dg_ref, du_ref, dbg_ref, dbu_ref = refs
  # dy reads zeros outside the tile's valid part, so dg and du are zero there
  # and the column sums below need no further mask.
  dy = gpu.read_tile(dy_ref, tile_mask).astype(_F32)
  dg = dy * u * activation_grad(p.activation, g)
  du = dy * activation_fn(p.activation, g)
  gpu.write_tile(dg_ref, dg, tile_mask)
  gpu.write_tile(du_ref, du, tile_mask)
  gpu.write_tile(dbg_ref, jnp.sum(dg, axis=0), col_ok)
  gpu.write_tile(dbu_ref, jnp.sum(du, axis=0), col_ok)


class Gradients(NamedTuple):
  """Outputs of `backward`."""

  #: dL/dg and dL/du, [M, F] in the dtype the dx/dw products read.
  dg: jax.Array
  du: jax.Array
  #: Column sums of dg and du, [F] float32 (the bias gradients).
  dbias_gate: jax.Array
  dbias_up: jax.Array


def _call(x, w_gate, w_up, bias_gate, bias_up, dy, *, activation: str, cfg: Config,
          interpret: bool, out_shapes, out_specs, name: str):
  m, k = x.shape
  f = w_gate.shape[1]
  p = _Launch(m=m, k=k, f=f, activation=activation, has_bias_gate=bias_gate is not None,
              has_bias_up=bias_up is not None, compute_dtype=jnp.dtype(x.dtype).name,
              backward=dy is not None, interpret=bool(interpret), cfg=cfg)
  bm, bn, kp = cfg.block_m, cfg.block_n, p.kp
  args = [x, w_gate, w_up]
  specs = [pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
           pl.BlockSpec((kp, bn), lambda i, j: (0, j)),
           pl.BlockSpec((kp, bn), lambda i, j: (0, j))]
  for vec in (bias_gate, bias_up):
    if vec is not None:
      args.append(vec)
      specs.append(pl.BlockSpec((bn,), lambda i, j: (j,)))
  if dy is not None:
    args.append(dy)
    specs.append(pl.BlockSpec((bm, bn), lambda i, j: (i, j)))
  params = None if interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                       num_stages=cfg.num_stages)
  itemsize = jnp.dtype(x.dtype).itemsize
  call = pl.pallas_call(
      functools.partial(_kernel, p=p),
      out_shape=out_shapes,
      grid=(pl.cdiv(m, bm), pl.cdiv(f, bn)),
      in_specs=specs,
      out_specs=out_specs,
      compiler_params=params,
      interpret=interpret,
      cost_estimate=pl.CostEstimate(
          flops=4 * m * k * f, transcendentals=m * f,
          bytes_accessed=(m * k + 2 * k * f) * itemsize
          + sum(jnp.dtype(s.dtype).itemsize * s.size for s in out_shapes)),
      name=name,
  )
  with backend_lib.kernel_scope("glu_matmul"):
    return call(*args)


def forward(x, w_gate, w_up, bias_gate=None, bias_up=None, *, activation: str, out_dtype,
            cfg: Config, interpret: bool) -> jax.Array:
  """act(x @ w_gate + bias_gate) * (x @ w_up + bias_up) as [M, F] in out_dtype.

  Args:
    x: [M, K]; w_gate, w_up: [K, F] of x's dtype; biases [F] or None.
    activation: one of `reference.ACTIVATIONS`.
    out_dtype: dtype of the result.
    cfg: tiling (`config.choose_config` or the caller's, accepted by the guard).
    interpret: run through Pallas' interpreter instead of Triton.
  """
  m, f = x.shape[0], w_gate.shape[1]
  (out,) = _call(x, w_gate, w_up, bias_gate, bias_up, None, activation=activation, cfg=cfg,
                 interpret=interpret,
                 out_shapes=[jax.ShapeDtypeStruct((m, f), jnp.dtype(out_dtype))],
                 out_specs=[pl.BlockSpec((cfg.block_m, cfg.block_n), lambda i, j: (i, j))],
                 name="pallas_kernels_glu_matmul")
  return out


def backward(x, w_gate, w_up, bias_gate, bias_up, dy, *, activation: str, grad_dtype,
             cfg: Config, interpret: bool) -> Gradients:
  """dg, du (in grad_dtype) and the bias gradients of the GLU for cotangent dy [M, F]."""
  m, f = x.shape[0], w_gate.shape[1]
  bm, bn = cfg.block_m, cfg.block_n
  mb = pl.cdiv(m, bm)
  tile = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  partial_sums = pl.BlockSpec((None, bn), lambda i, j: (i, j))
  dg, du, dbg, dbu = _call(
      x, w_gate, w_up, bias_gate, bias_up, dy, activation=activation, cfg=cfg,
      interpret=interpret,
      out_shapes=[jax.ShapeDtypeStruct((m, f), jnp.dtype(grad_dtype))] * 2
      + [jax.ShapeDtypeStruct((mb, f), _F32)] * 2,
      out_specs=[tile, tile, partial_sums, partial_sums],
      name="pallas_kernels_glu_matmul_bwd")
  return Gradients(dg, du, dbg.sum(axis=0), dbu.sum(axis=0))
