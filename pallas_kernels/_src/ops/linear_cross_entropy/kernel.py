"""Pallas linear cross-entropy kernels: the [tokens, V] logits never leave
registers.

x arrives flattened to [T, D], labels to [T] (int32). Every kernel forms
[block_t, block_v] logits tiles as a loop over D in `block_d` steps of
x[block_t, block_d] @ w[block_d, block_v] (f32 accumulation, + bias), with
padding columns (>= V) set to -inf so that they never enter a logsumexp, and
padding rows (>= T) never stored. No tile spans all of D, so what a program
holds in registers and shared memory does not grow with D.

* `forward`: grid over token blocks; a loop over vocab chunks keeps an online
  logsumexp (running max and sum) and picks each token's label logit when its
  chunk passes. Writes the per-token loss and lse [T] (float32).
* `backward`: grid over (token block, vocab block); recomputes the tile's
  logits, forms dlogits = g * (exp(logits - lse) - onehot(labels)) and, over
  D in steps, adds dlogits @ w_chunk^T into dx and x_chunk^T @ dlogits into
  dw, and the column sums of dlogits into dbias, with float32 atomic adds
  (other programs share each dx row block and dw column block). The float32
  sums are cast to the operands' dtypes outside.

g is the per-token cotangent, already 0 for ignored tokens and tokens whose
label lies outside [0, V) (their loss is constant). Everything is read and
written through masks (`rows.load_tile` and friends), as the Triton lowering
has no bounds checks.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import rows as rows_lib
from pallas_kernels._src.ops.linear_cross_entropy import config as config_lib
from pallas_kernels._src.ops.linear_cross_entropy.config import Config

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class Dims:
  """Static sizes and options of one call."""

  tokens: int
  d: int
  vocab: int
  has_bias: bool
  ignore_index: int | None
  #: dtype x and w are rounded to on load and the tiles are multiplied
  #: in (the promotion of x's and w's unless the caller names one).
  compute_dtype: str
  cfg: Config
  interpret: bool

  @property
  def bd(self) -> int:
    return config_lib.block_d(self.cfg, self.d)

  @property
  def dp(self) -> int:
    return config_lib.padded_d(self.cfg, self.d)

  @property
  def vp(self) -> int:
    return rows_lib.padded_cols(self.vocab, self.cfg.block_v)


def _dot_dtype(p: Dims):
  # XLA:CPU cannot run every bf16 x bf16 -> f32 dot layout; 16-bit products
  # are exact in f32, so interpret mode widens the tiles (as the matmul does).
  return jnp.dtype(_F32) if p.interpret else jnp.dtype(p.compute_dtype)


def _dot(a, b, dims, p: Dims):
  cdt = _dot_dtype(p)
  precision = (jax.lax.Precision.HIGHEST if cdt == jnp.dtype(_F32)
               else jax.lax.Precision.DEFAULT)
  # Rounded to the compute dtype first: interpret mode widens after, so f32
  # operands of a bf16 computation round as on the GPU.
  a, b = a.astype(p.compute_dtype), b.astype(p.compute_dtype)
  return jax.lax.dot_general(a.astype(cdt), b.astype(cdt), (dims, ((), ())),
                             precision=precision, preferred_element_type=_F32)


def _d_ok(k0, p: Dims):
  return rows_lib.col_ids(k0, p.bd) < p.d


def _x_chunk(x_ref, k0, row_ok, p: Dims):
  """x[rows, k0:k0+bd] of the program's [block_t, Dp] block."""
  return rows_lib.load_tile(x_ref, 0, k0, p.cfg.block_t, p.bd,
                            row_ok[:, None] & _d_ok(k0, p)[None, :])


def _w_chunk(w_ref, k0, col0, col_ok, p: Dims):
  """w[k0:k0+bd, cols] of a [Dp, *] block, from local column `col0`."""
  return rows_lib.load_tile(w_ref, k0, col0, p.bd, p.cfg.block_v,
                            _d_ok(k0, p)[:, None] & col_ok[None, :])


def _logits(x_ref, row_ok, w_ref, col0, col_ok, bias, p: Dims):
  """[bt, bv] f32 logits of the program's rows and the columns at `col0`;
  -inf past V."""

  def step(k0, acc):
    x = _x_chunk(x_ref, k0, row_ok, p)
    return acc + _dot(x, _w_chunk(w_ref, k0, col0, col_ok, p), ((1,), (0,)), p)

  s = rows_lib.over_chunks(rows_lib.num_chunks(p.d, p.bd), p.bd, step,
                           jnp.zeros((p.cfg.block_t, p.cfg.block_v), _F32))
  if bias is not None:
    s = s + bias.astype(_F32)[None, :]
  return jnp.where(col_ok[None, :], s, -jnp.inf)


def _dlogits(s, lse, g, labels, cols, keep):
  """g * (softmax - onehot) of one logits tile; 0 on rows not kept."""
  onehot = (cols[None, :] == labels[:, None]).astype(_F32)
  dl = g[:, None] * (jnp.exp(s - lse[:, None]) - onehot)
  # where, not a product: a padding row's exp may overflow (0 * inf is NaN).
  return jnp.where(keep[:, None], dl, 0.0)


def _safe(mx):
  # A row of -inf logits (max -inf) shifts by 0, so exp gives 0 rather than NaN.
  return jnp.where(mx == -jnp.inf, 0.0, mx)


def _forward_kernel(*refs, p: Dims):
  if p.has_bias:
    x_ref, w_ref, b_ref, labels_ref, loss_ref, lse_ref = refs
  else:
    (x_ref, w_ref, labels_ref, loss_ref, lse_ref), b_ref = refs, None
  bt, bv = p.cfg.block_t, p.cfg.block_v
  rows = rows_lib.row_ids(pl.program_id(0), bt)
  row_ok = rows < p.tokens
  labels = rows_lib.load_vec(labels_ref, 0, bt, row_ok, 0)

  def step(c0, carry):
    mx, total, picked = carry
    cols = rows_lib.col_ids(c0, bv)
    col_ok = cols < p.vocab
    bias = None if b_ref is None else rows_lib.load_vec(b_ref, c0, bv, col_ok, 0.0)
    s = _logits(x_ref, row_ok, w_ref, c0, col_ok, bias, p)
    new_mx = jnp.maximum(mx, jnp.max(s, axis=1))
    shift = _safe(new_mx)
    total = (total * jnp.exp(mx - shift)
             + jnp.sum(jnp.exp(s - shift[:, None]), axis=1))
    hit = cols[None, :] == labels[:, None]
    picked = picked + jnp.sum(jnp.where(hit, s, 0.0), axis=1)
    return new_mx, total, picked

  init = (jnp.full((bt,), -jnp.inf, _F32), jnp.zeros((bt,), _F32),
          jnp.zeros((bt,), _F32))
  mx, total, picked = rows_lib.over_chunks(rows_lib.num_chunks(p.vocab, bv), bv,
                                           step, init)
  lse = _safe(mx) + jnp.log(total)
  in_range = (labels >= 0) & (labels < p.vocab)
  loss = jnp.where(in_range, lse - picked, jnp.nan)
  if p.ignore_index is not None:
    loss = jnp.where(labels == p.ignore_index, 0.0, loss)
  rows_lib.store_vec(loss_ref, 0, bt, loss, row_ok)
  rows_lib.store_vec(lse_ref, 0, bt, lse, row_ok)


def _compiler_params(cfg: Config, interpret: bool):
  if interpret:
    return None
  return gpu.compiler_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _itemsize(a) -> int:
  return 0 if a is None else jnp.dtype(a.dtype).itemsize


def forward(x, w, bias, labels, *, p: Dims) -> tuple[jax.Array, jax.Array]:
  """(loss, lse), both float32 [T], of x [T, D], w [D, V], labels [T] int32."""
  bt = p.cfg.block_t
  inputs = [x, w] + ([bias] if bias is not None else []) + [labels]
  in_specs = [pl.BlockSpec((bt, p.dp), lambda i: (i, 0)),
              pl.BlockSpec((p.dp, p.vp), lambda i: (0, 0))]
  if bias is not None:
    in_specs.append(pl.BlockSpec((p.vp,), lambda i: (0,)))
  in_specs.append(pl.BlockSpec((bt,), lambda i: (i,)))
  vec = pl.BlockSpec((bt,), lambda i: (i,))
  t, d, v = p.tokens, p.d, p.vocab
  with backend.kernel_scope("linear_cross_entropy"):
    return pl.pallas_call(
        functools.partial(_forward_kernel, p=p),
        grid=(pl.cdiv(t, bt),),
        in_specs=in_specs,
        out_specs=(vec, vec),
        out_shape=(jax.ShapeDtypeStruct((t,), _F32), jax.ShapeDtypeStruct((t,), _F32)),
        interpret=p.interpret,
        compiler_params=_compiler_params(p.cfg, p.interpret),
        cost_estimate=pl.CostEstimate(
            flops=2 * t * d * v + 4 * t * v, transcendentals=t * v,
            bytes_accessed=t * d * _itemsize(x) * pl.cdiv(v, p.cfg.block_v)
            + d * v * _itemsize(w) * pl.cdiv(t, bt)
            + v * _itemsize(bias) + t * (4 + 8)),
        name="linear_cross_entropy_fwd",
    )(*inputs)


def _keep(labels, g_rows_ok, p: Dims):
  """Rows whose loss depends on the inputs (the cotangent g counts)."""
  keep = g_rows_ok & (labels >= 0) & (labels < p.vocab)
  if p.ignore_index is not None:
    keep = keep & (labels != p.ignore_index)
  return keep


def _backward_kernel(*refs, p: Dims):
  if p.has_bias:
    (x_ref, w_ref, b_ref, labels_ref, lse_ref, g_ref, _, _, _,
     dx_ref, dw_ref, db_ref) = refs
  else:
    (x_ref, w_ref, labels_ref, lse_ref, g_ref, _, _, dx_ref, dw_ref) = refs
    b_ref = db_ref = None
  bt, bv, bd = p.cfg.block_t, p.cfg.block_v, p.bd
  rows = rows_lib.row_ids(pl.program_id(0), bt)
  cols = rows_lib.row_ids(pl.program_id(1), bv)
  row_ok, col_ok = rows < p.tokens, cols < p.vocab
  labels = rows_lib.load_vec(labels_ref, 0, bt, row_ok, 0)
  lse = rows_lib.load_vec(lse_ref, 0, bt, row_ok, 0.0)
  g = rows_lib.load_vec(g_ref, 0, bt, row_ok, 0.0)
  keep = _keep(labels, row_ok, p)
  bias = None if b_ref is None else rows_lib.load_vec(b_ref, 0, bv, col_ok, 0.0)
  dl = _dlogits(_logits(x_ref, row_ok, w_ref, 0, col_ok, bias, p), lse, g, labels,
                cols, keep)
  if db_ref is not None:
    gpu.atomic_add(db_ref, (pl.ds(0, bv),), jnp.sum(dl, axis=0), col_ok,
                   interpret=p.interpret)
  # Rounded once to the dot dtype, as the forward's operands are.
  dl = dl.astype(_dot_dtype(p))

  def step(k0, carry):
    d_ok = _d_ok(k0, p)
    w = _w_chunk(w_ref, k0, 0, col_ok, p)
    gpu.atomic_add(dx_ref, (pl.ds(0, bt), pl.ds(k0, bd)),
                   _dot(dl, w, ((1,), (1,)), p),  # dl @ w^T: [bt, bd]
                   keep[:, None] & d_ok[None, :], interpret=p.interpret)
    x = _x_chunk(x_ref, k0, row_ok, p)
    gpu.atomic_add(dw_ref, (pl.ds(k0, bd), pl.ds(0, bv)),
                   _dot(x, dl, ((0,), (0,)), p),  # x^T @ dl: [bd, bv]
                   d_ok[:, None] & col_ok[None, :], interpret=p.interpret)
    return carry

  rows_lib.over_chunks(rows_lib.num_chunks(p.d, bd), bd, step, 0)


def backward(x, w, bias, labels, lse, g, *, p: Dims
             ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(dx [T, D], dw [D, V], dbias [V] or None), float32, from the saved lse
  and the per-token cotangent g."""
  bt, bv = p.cfg.block_t, p.cfg.block_v
  x_tile = pl.BlockSpec((bt, p.dp), lambda i, j: (i, 0))
  w_tile = pl.BlockSpec((p.dp, bv), lambda i, j: (0, j))
  col = pl.BlockSpec((bv,), lambda i, j: (j,))
  vec = pl.BlockSpec((bt,), lambda i, j: (i,))
  t, d, v = p.tokens, p.d, p.vocab
  # The atomic adds accumulate into zeros passed in and aliased to the outputs.
  acc_shapes = [jax.ShapeDtypeStruct((t, d), _F32), jax.ShapeDtypeStruct((d, v), _F32)]
  acc_specs = [x_tile, w_tile]
  if bias is not None:
    acc_shapes.append(jax.ShapeDtypeStruct((v,), _F32))
    acc_specs.append(col)
  accs = [jnp.zeros(s.shape, s.dtype) for s in acc_shapes]
  inputs = [x, w] + ([bias] if bias is not None else []) + [labels, lse, g] + accs
  in_specs = [x_tile, w_tile] + ([col] if bias is not None else []) + [vec, vec, vec]
  first_acc = len(in_specs)
  in_specs += acc_specs
  grid = (pl.cdiv(t, bt), pl.cdiv(v, bv))
  with backend.kernel_scope("linear_cross_entropy"):
    out = pl.pallas_call(
        functools.partial(_backward_kernel, p=p),
        grid=grid,
        in_specs=in_specs,
        out_specs=tuple(acc_specs),
        out_shape=tuple(acc_shapes),
        input_output_aliases={first_acc + k: k for k in range(len(accs))},
        interpret=p.interpret,
        compiler_params=_compiler_params(p.cfg, p.interpret),
        cost_estimate=pl.CostEstimate(
            flops=6 * t * d * v + 6 * t * v, transcendentals=t * v,
            bytes_accessed=(t * d * _itemsize(x) + 4 * t * d) * grid[1]
            + (d * v * _itemsize(w) + 4 * d * v) * grid[0]
            + v * (_itemsize(bias) + 4) + t * 12),
        name="linear_cross_entropy_bwd",
    )(*inputs)
  return out[0], out[1], (out[2] if bias is not None else None)
