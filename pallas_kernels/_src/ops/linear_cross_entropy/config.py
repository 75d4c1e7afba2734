"""Block sizes for linear_cross_entropy: the only place for those rules.

Every kernel forms [block_t, block_v] logits tiles, each as a sum over D in
chunks of `block_d`: x[block_t, block_d] @ w[block_d, block_v] accumulated in
float32. No tile spans all of D, so registers and shared memory depend on the
blocks alone, not on D. The forward owns `block_t` tokens and walks the
vocabulary in `block_v` chunks; the backward owns one (token block, vocab
block) tile and adds its share of dx, dw and dbias atomically.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src.ops import rows as rows_lib
from pallas_kernels._src.ops.tiling import is_pow2, next_pow2

#: Triton's smallest dot operand extent.
MIN_BLOCK = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
  """Tiling of the linear_cross_entropy kernels.

  Attributes:
    block_t: tokens per program; a power of two >= 16.
    block_v: vocabulary columns per chunk (forward) or per program
      (backward); a power of two >= 16.
    block_d: D columns per step of the dots; a power of two >= 16 (a D
      narrower than that takes one step of D's power of two).
    num_warps: Triton warps per program (GPU only).
    num_stages: Triton software-pipelining stages of the D loop (GPU only).
  """

  block_t: int
  block_v: int
  block_d: int = 64
  num_warps: int = 4
  num_stages: int = 1

  def __post_init__(self):
    for name in ("block_t", "block_v", "block_d"):
      value = getattr(self, name)
      if not is_pow2(value) or value < MIN_BLOCK:
        raise ValueError(f"Config.{name} must be a power of two >= {MIN_BLOCK}, "
                         f"got {value}")
    if not is_pow2(self.num_warps):
      raise ValueError(f"Config.num_warps must be a power of two, got {self.num_warps}")
    if self.num_stages < 1:
      raise ValueError(f"Config.num_stages must be >= 1: {self}")


def block_d(cfg: Config, d: int) -> int:
  """The D step the kernels take: `cfg.block_d`, or less for a narrow D."""
  return min(cfg.block_d, max(MIN_BLOCK, next_pow2(d)))


def padded_d(cfg: Config, d: int) -> int:
  """The width of the x and w blocks: D rounded up to whole D steps."""
  return rows_lib.padded_cols(d, block_d(cfg, d))


def shared_memory(cfg: Config, d: int, itemsize: int) -> int:
  """Upper bound, in bytes, on the shared memory of the largest kernel (the
  backward).

  Its two D loops (logits; dx and dw) each stage one x and one w chunk per
  pipelining stage, and its dots read dlogits [block_t, block_v] from shared
  memory, all in the tiles' dtype (`itemsize` bytes). Measured against
  Triton's allocation by `gpu_report`.
  """
  bt, bv, bd = cfg.block_t, cfg.block_v, block_d(cfg, d)
  return (2 * cfg.num_stages * (bt * bd + bd * bv) + bt * bv) * itemsize


_MAX_BLOCK_T = {backend_lib.Backend.GPU: 64, backend_lib.Backend.TPU: 64,
                backend_lib.Backend.CPU: 256}
_MAX_BLOCK_V = {backend_lib.Backend.GPU: 128, backend_lib.Backend.TPU: 128,
                backend_lib.Backend.CPU: 2048}
#: Interpret mode pays per loop step, so it takes all of a moderate D at once.
#: On a GPU, float32 tiles (IEEE dots on the FMA units, operands held in
#: registers) take a quarter of the 16-bit D step, or ptxas spills.
_MAX_BLOCK_D = {backend_lib.Backend.GPU: 64, backend_lib.Backend.TPU: 64,
                backend_lib.Backend.CPU: 1024}
_MAX_BLOCK_D_F32 = 16


def _fit(limit: int, extent: int) -> int:
  # Both bounds are powers of two (or clamped to MIN_BLOCK), so the result is one.
  return max(MIN_BLOCK, min(limit, next_pow2(extent)))


def heuristic_config(tokens: int, d: int, vocab: int, backend: backend_lib.Backend,
                     itemsize: int = 2) -> Config:
  """Tiling for `tokens` x `d` activations against a [d, vocab] projection,
  multiplied as `itemsize`-byte tiles."""
  block_t = _fit(_MAX_BLOCK_T[backend], tokens)
  block_v = _fit(_MAX_BLOCK_V[backend], vocab)
  max_d = _MAX_BLOCK_D[backend]
  if backend is backend_lib.Backend.GPU and itemsize > 2:
    max_d = _MAX_BLOCK_D_F32
  num_warps = 4 if block_t * block_v <= 64 * 64 else 8
  return Config(block_t=block_t, block_v=block_v, block_d=_fit(max_d, d),
                num_warps=num_warps, num_stages=1)
