"""Pallas kernels of the group norm over channels-last x, viewed as [N, R, C].

Two launches, one per direction, each over a grid of (sample, channel
window): a window is the whole groups that fit a `block_c`-wide tile
(`config.py`), so a program owns every statistic it needs and nothing is
combined across programs. Each program walks its sample's R rows twice in
[block_m, width] tiles:

* forward: the first walk sums x and x**2 per channel in f32; the group sums
  give mean = E[x] and flax's fast variance max(0, E[x^2] - mean^2); the
  second walk writes y = act((x - mean) * (rstd * scale) + bias). The
  program stores its groups' mean and rstd ([N, G], f32) for the backward.
* backward: the first walk recomputes x_hat and dy = g * act'(pre) from x,
  the cotangent g and the saved mean and rstd, and sums dy and dy * x_hat
  per channel (this sample's share of dbias and dscale, written as [N, C]
  partials that XLA sums over N); their group sums, weighted by scale, are
  the mean of dx_hat and of dx_hat * x_hat, and the second walk writes

      dx = rstd * (scale * dy - mean(dx_hat) - x_hat * mean(dx_hat * x_hat)).

  dy, the cotangent before the activation, is never written.

A group sum of per-channel sums is a masked [groups, width] reduction (the
window's group membership), and spreading a group's value back over its
channels the same mask summed the other way: no reshape, which Triton would
need in powers of two. Like the other Triton-lowered kernels (see `gpu.py`),
every load and store is masked: rows past R and channels past the window
read zero, and the cotangent's zeros there make every backward term vanish.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import gpu
from pallas_kernels._src.ops import rows
from pallas_kernels._src.ops.conv2d.kernel import activation_fn, activation_grad
from pallas_kernels._src.ops.group_norm.config import Config
from pallas_kernels._src.ops.tiling import next_pow2

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
  """One launch's static shape and options."""

  n: int
  r: int
  c: int
  groups: int
  epsilon: float
  cfg: Config
  #: Canonical activation name ("identity" for none).
  activation: str
  interpret: bool
  #: The backward's cotangent is one [C] row per sample, the same for
  #: every row (a global average pool's gradient): read as such, not as an
  #: image XLA would have to write.
  row_cotangent: bool = False
  #: The forward sums y over the rows ([N, C], a global average pool's sum)
  #: instead of writing it: nothing else reads y.
  pooled: bool = False

  @property
  def group_size(self) -> int:
    return self.c // self.groups

  @property
  def groups_per_program(self) -> int:
    return self.cfg.groups_per_program(self.c, self.groups)

  @property
  def width(self) -> int:
    """Channels of one program's window."""
    return self.groups_per_program * self.group_size

  @property
  def block_c(self) -> int:
    """Width of a tile: the window's, to a power of two."""
    return next_pow2(self.width)

  @property
  def block_g(self) -> int:
    """Groups of a window, to a power of two."""
    return next_pow2(self.groups_per_program)

  @property
  def programs(self) -> int:
    """Windows per sample."""
    return pl.cdiv(self.groups, self.groups_per_program)

  @property
  def steps(self) -> int:
    return pl.cdiv(self.r, self.cfg.block_m)

  @property
  def padded(self) -> tuple[int, int, int]:
    """(rows, channels, groups) of a sample's blocks: every row tile and
    every window's tile lies inside them (`rows.py`)."""
    rows_, cols = self.cfg.padded(self.r, self.c, self.groups)
    return rows_, cols, (self.programs - 1) * self.groups_per_program + self.block_g


@dataclasses.dataclass(frozen=True, slots=True)
class _Window:
  """This program's channels and groups."""

  #: First channel and first group (traced).
  c0: jax.Array
  g0: jax.Array
  #: [block_c] channels of the window inside C.
  c_ok: jax.Array
  #: [block_g] groups of the window inside G.
  g_ok: jax.Array
  #: [block_g, block_c]: channel k belongs to the window's group q.
  member: jax.Array


def _window(p: _Launch) -> _Window:
  j = pl.program_id(1)
  gs, bc, bg = p.group_size, p.block_c, p.block_g
  k = jnp.arange(bc, dtype=jnp.int32)
  q = jnp.arange(bg, dtype=jnp.int32)
  c0, g0 = j * p.width, j * p.groups_per_program
  c_ok = (k < p.width) & (c0 + k < p.c)
  g_ok = (q < p.groups_per_program) & (g0 + q < p.groups)
  first = q[:, None] * gs
  member = (k[None, :] >= first) & (k[None, :] < first + gs) & c_ok[None, :]
  return _Window(c0=c0, g0=g0, c_ok=c_ok, g_ok=g_ok, member=member)


def _group_sums(w: _Window, v):
  """[block_c] per-channel values -> [block_g] sums over each group's channels."""
  return jnp.sum(jnp.where(w.member, v[None, :], 0.0), axis=1)


def _spread(w: _Window, v):
  """[block_g] per-group values -> [block_c], each channel its group's."""
  return jnp.sum(jnp.where(w.member, v[:, None], 0.0), axis=0)


def _tile_mask(p: _Launch, w: _Window, r0):
  q = r0 + jnp.arange(p.cfg.block_m, dtype=jnp.int32)
  return gpu.mask2(q < p.r, w.c_ok)


def _read(p: _Launch, w: _Window, ref, r0, mask):
  """The f32 [block_m, block_c] tile at row r0 of the window (zero outside)."""
  return rows.load_tile(ref, r0, w.c0, p.cfg.block_m, p.block_c, mask).astype(_F32)


def _walk(p: _Launch, body, init):
  """Folds `body(r0, carry)` over the sample's row tiles."""
  return rows.over_chunks(p.steps, p.cfg.block_m, body, init)


def _channel_vectors(p: _Launch, w: _Window, refs):
  return [rows.load_vec(r, w.c0, p.block_c, w.c_ok).astype(_F32) for r in refs]


def _forward_kernel(x_ref, scale_ref, bias_ref, y_ref, mean_ref, rstd_ref, *, p: _Launch):
  w = _window(p)
  scale, bias = _channel_vectors(p, w, (scale_ref, bias_ref))

  def stats(r0, carry):
    x = _read(p, w, x_ref, r0, _tile_mask(p, w, r0))
    return carry[0] + jnp.sum(x, axis=0), carry[1] + jnp.sum(x * x, axis=0)

  zeros = jnp.zeros((p.block_c,), _F32)
  s1, s2 = _walk(p, stats, (zeros, zeros))
  count = float(p.r * p.group_size)
  mean = _group_sums(w, s1) / count
  var = jnp.maximum(_group_sums(w, s2) / count - mean * mean, 0.0)
  rstd = jax.lax.rsqrt(var + p.epsilon)
  mean_c, mul = _spread(w, mean), _spread(w, rstd) * scale

  def apply(r0, carry):
    mask = _tile_mask(p, w, r0)
    x = _read(p, w, x_ref, r0, mask)
    pre = (x - mean_c[None, :]) * mul[None, :] + bias[None, :]
    y = activation_fn(p.activation, pre)
    if p.pooled:
      return carry + jnp.sum(jnp.where(mask, y, 0.0), axis=0)
    rows.store_tile(y_ref, r0, w.c0, p.cfg.block_m, p.block_c, y, mask)
    return carry

  pooled = _walk(p, apply, zeros)
  if p.pooled:
    rows.store_vec(y_ref, w.c0, p.block_c, pooled, w.c_ok)
  rows.store_vec(mean_ref, w.g0, p.block_g, mean, w.g_ok)
  rows.store_vec(rstd_ref, w.g0, p.block_g, rstd, w.g_ok)


def _backward_kernel(x_ref, g_ref, scale_ref, bias_ref, mean_ref, rstd_ref, dx_ref,
                     dscale_ref, dbias_ref, dx_sum_ref=None, *, p: _Launch):
  w = _window(p)
  scale, bias = _channel_vectors(p, w, (scale_ref, bias_ref))
  mean, rstd = (_spread(w, rows.load_vec(r, w.g0, p.block_g, w.g_ok))
                for r in (mean_ref, rstd_ref))

  def terms(r0):
    """(dy, x_hat) of a tile, recomputed; dy is zero outside the mask."""
    mask = _tile_mask(p, w, r0)
    x = _read(p, w, x_ref, r0, mask)
    if p.row_cotangent:
      row = rows.load_vec(g_ref, w.c0, p.block_c, w.c_ok).astype(_F32)
      g = jnp.where(mask, row[None, :], 0.0)
    else:
      g = _read(p, w, g_ref, r0, mask)
    xhat = (x - mean[None, :]) * rstd[None, :]
    if p.activation == "identity":
      return g, xhat, mask
    return g * activation_grad(p.activation, xhat * scale[None, :] + bias[None, :]), xhat, mask

  def sums(r0, carry):
    dy, xhat, _ = terms(r0)
    return carry[0] + jnp.sum(dy, axis=0), carry[1] + jnp.sum(dy * xhat, axis=0)

  zeros = jnp.zeros((p.block_c,), _F32)
  dbias, dscale = _walk(p, sums, (zeros, zeros))
  count = float(p.r * p.group_size)
  # The group means of dx_hat = scale * dy and of dx_hat * x_hat.
  a = _spread(w, _group_sums(w, scale * dbias) / count)
  b = _spread(w, _group_sums(w, scale * dscale) / count)

  def apply(r0, carry):
    dy, xhat, mask = terms(r0)
    dx = rstd[None, :] * (scale[None, :] * dy - a[None, :] - xhat * b[None, :])
    rows.store_tile(dx_ref, r0, w.c0, p.cfg.block_m, p.block_c, dx, mask)
    # Rows past R hold dy = 0 but not dx = 0 (a and b): masked out of the sum.
    return carry + jnp.sum(jnp.where(mask, dx, 0.0), axis=0)

  dx_sum = _walk(p, apply, zeros)
  rows.store_vec(dscale_ref, w.c0, p.block_c, dscale, w.c_ok)
  rows.store_vec(dbias_ref, w.c0, p.block_c, dbias, w.c_ok)
  if dx_sum_ref is not None:
    rows.store_vec(dx_sum_ref, w.c0, p.block_c, dx_sum, w.c_ok)


def _call(body, p: _Launch, name: str, *, images, vectors, stats, out_shape, out_kinds,
          flops: int, channels=()):
  """Runs `body` over [N, R, C] `images`, [N, C] `channels`, [C] `vectors`
  and [N, G] `stats` on the (sample, window) grid; `out_kinds` says of each
  output whether it is an "image", a per-sample "channels" row or a
  per-sample "groups" row."""
  cfg = p.cfg
  rp, cp, gp = p.padded
  specs = {
      "image": pl.BlockSpec((None, rp, cp), lambda i, j: (i, 0, 0)),
      "channels": pl.BlockSpec((None, cp), lambda i, j: (i, 0)),
      "groups": pl.BlockSpec((None, gp), lambda i, j: (i, 0)),
  }
  vec = pl.BlockSpec((cp,), lambda i, j: (0,))
  read = sum(a.size * a.dtype.itemsize for a in (*images, *channels, *vectors, *stats))
  written = sum(s.size * jnp.dtype(s.dtype).itemsize for s in out_shape)
  params = None if p.interpret else gpu.compiler_params(num_warps=cfg.num_warps,
                                                         num_stages=cfg.num_stages)
  elements = p.n * p.r * p.c
  call = pl.pallas_call(
      functools.partial(body, p=p),
      out_shape=out_shape,
      grid=(p.n, p.programs),
      in_specs=([specs["image"]] * len(images) + [specs["channels"]] * len(channels)
                + [vec] * len(vectors) + [specs["groups"]] * len(stats)),
      out_specs=[specs[k] for k in out_kinds],
      compiler_params=params,
      interpret=p.interpret,
      cost_estimate=pl.CostEstimate(flops=flops * elements,
                                    transcendentals=0 if p.activation == "identity"
                                    else elements,
                                    bytes_accessed=read + written),
      name=f"pallas_kernels_group_norm_{name}",
  )
  with backend_lib.kernel_scope("group_norm"):
    return call(*images, *channels, *(v.astype(_F32) for v in vectors), *stats)


def _launch(x3, groups: int, epsilon: float, cfg: Config, activation: str,
            interpret: bool) -> _Launch:
  n, r, c = x3.shape
  return _Launch(n=int(n), r=int(r), c=int(c), groups=int(groups), epsilon=float(epsilon),
                 cfg=cfg, activation=activation, interpret=bool(interpret))


def forward(x3, scale, bias, *, groups: int, epsilon: float, activation: str, cfg: Config,
            interpret: bool, pooled: bool = False):
  """(y in x3's dtype, mean f32 [N, G], rstd f32 [N, G]) of [N, R, C] x3;
  with `pooled`, y's f32 sum over the rows [N, C] in y's place (y is not
  written)."""
  p = dataclasses.replace(_launch(x3, groups, epsilon, cfg, activation, interpret),
                          pooled=pooled)
  stat = jax.ShapeDtypeStruct((p.n, p.groups), _F32)
  out = (jax.ShapeDtypeStruct((p.n, p.c), _F32) if pooled
         else jax.ShapeDtypeStruct(x3.shape, x3.dtype))
  y, mean, rstd = _call(
      _forward_kernel, p, "fwd", images=(x3,), vectors=(scale, bias), stats=(),
      out_shape=[out, stat, stat],
      out_kinds=("channels" if pooled else "image", "groups", "groups"), flops=9)
  return y, mean, rstd


def backward(x3, g3, scale, bias, mean, rstd, *, groups: int, activation: str, cfg: Config,
             interpret: bool, dx_sum: bool = False):
  """(dx in x3's dtype, dscale f32 [C], dbias f32 [C]) from the cotangent g3
  of y ([N, R, C], or [N, C]: the same row for every row) and the forward's
  mean and rstd; with `dx_sum`, also dx's f32 sum over the samples and rows
  [C] (the gradient of a bias added before the norm, a convolution's), so
  that nothing reads dx again for it."""
  p = dataclasses.replace(_launch(x3, groups, 0.0, cfg, activation, interpret),
                          row_cotangent=g3.ndim == 2)
  partial = jax.ShapeDtypeStruct((p.n, p.c), _F32)
  outs = _call(
      _backward_kernel, p, "bwd", images=(x3,) + ((g3,) * (g3.ndim == 3)),
      channels=(g3,) * (g3.ndim == 2), vectors=(scale, bias), stats=(mean, rstd),
      out_shape=[jax.ShapeDtypeStruct(x3.shape, x3.dtype)] + [partial] * (2 + dx_sum),
      out_kinds=("image",) + ("channels",) * (2 + dx_sum), flops=18 + dx_sum)
  return (outs[0], *(jnp.sum(o, axis=0) for o in outs[1:]))
