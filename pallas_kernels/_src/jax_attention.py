"""JAX's fused attention calls, and which of them runs a chain on a device.

`jax.nn.dot_product_attention(..., implementation="cudnn")` runs cuDNN's
flash attention where cuDNN takes the chain; JAX's Pallas attention kernel
(`jax.experimental.pallas.ops.gpu.attention.mha`, Triton) where it does
not; on a TPU, JAX's Pallas TPU flash attention
(`jax.experimental.pallas.ops.tpu.flash_attention.flash_attention`, Mosaic
TPU); XLA's gemm -> softmax -> gemm otherwise. The rules are JAX's own
(jax/_src/cudnn/fused_attention_stablehlo.py: `check_is_flash_attention`
and the dtype check of `_dot_product_attention`;
jax/experimental/pallas/ops/gpu/attention.py: `mha`'s shape checks;
jax/experimental/pallas/ops/tpu/flash_attention.py: `_verify_block` on its
default block sizes). The
audit's suggestions (`audit/jax_calls.py`) and swap's routing
(`swap/attention.py`) both ask here.
"""

from __future__ import annotations

import dataclasses
import math

ATTENTION = "jax.nn.dot_product_attention"
PALLAS_ATTENTION = "jax.experimental.pallas.ops.gpu.attention.mha"
TPU_FLASH_ATTENTION = "jax.experimental.pallas.ops.tpu.flash_attention.flash_attention"
#: The TPU flash attention's default blocks (`BlockSizes.get_default`): 128
#: along both sequences, the keys' a divisor of their length.
TPU_FLASH_BLOCK = 128
#: Element types the TPU flash attention kernel computes in (f32 softmax).
TPU_FLASH_DTYPES = frozenset({"f32", "bf16"})

#: cuDNN's fused attention: element types it takes (fp8 needs its own
#: scaling arguments, not a drop-in call).
CUDNN_DTYPES = frozenset({"bf16", "f16"})
#: cuDNN's flash attention runs on Ampere and later (cuDNN's support matrix).
CUDNN_MIN_CAPABILITY = (8, 0)
#: Largest head dimension cuDNN's flash attention takes: 256 from Hopper
#: (compute capability 9.0) on, 128 before; a multiple of 8 either way.
CUDNN_HEAD_DIM = {True: 256, False: 128}
#: JAX's Pallas attention kernel: its default block along both sequences.
PALLAS_BLOCK = 128
#: Element types JAX's Pallas (Triton) attention kernel is written for.
PALLAS_DTYPES = frozenset({"f32", "bf16", "f16"})


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionShape:
  """An attention chain as its scores gemm holds it."""

  dtype: str
  #: The gemm's batch dimensions (batch and heads, or the two merged).
  batch: tuple[int, ...]
  queries: int
  keys: int
  head_dim: int

  def arrays(self) -> str:
    """"q: bf16[4,128,8,64], k: ..., v: ..." in [batch, seq, heads, head_dim]."""
    if len(self.batch) >= 2:
      b, n = math.prod(self.batch[:-1]), self.batch[-1]
      lead, note = (str(b), str(n)), ""
    else:
      lead = ("B", "N")
      note = f" with B*N = {self.batch[0] if self.batch else 1}"
    def one(name: str, seq: int) -> str:
      return f"{name}: {self.dtype}[{lead[0]},{seq},{lead[1]},{self.head_dim}]"
    return ", ".join((one("q", self.queries), one("k", self.keys),
                      one("v", self.keys))) + note


def capability(device) -> tuple[int, int] | None:
  cc = getattr(device, "compute_capability", "") if device is not None else ""
  if not cc:
    return None
  major, _, minor = cc.partition(".")
  return int(major), int(minor or 0)


def cudnn_reason(shape: AttentionShape, device) -> str:
  """Why cuDNN's flash attention cannot take the chain on `device`; "" when
  it can."""
  cc = capability(device)
  if cc is None:
    where = getattr(device, "name", "") or "unknown"
    return f"cuDNN's fused attention needs an NVIDIA GPU (the device is {where})"
  if cc < CUDNN_MIN_CAPABILITY:
    return (f"cuDNN's flash attention needs compute capability 8.0 or later "
            f"(sm_{cc[0]}{cc[1]})")
  if shape.dtype not in CUDNN_DTYPES:
    return f"cuDNN's fused attention takes bf16 or f16 only (q is {shape.dtype})"
  most = CUDNN_HEAD_DIM[cc >= (9, 0)]
  if shape.head_dim > most or shape.head_dim % 8:
    return (f"cuDNN's flash attention needs a head dimension <= {most} and a "
            f"multiple of 8 (it is {shape.head_dim})")
  return ""


def pallas_reason(shape: AttentionShape, device) -> str:
  """Why JAX's Pallas attention kernel cannot take the chain; "" when it can."""
  if capability(device) is None:
    return "JAX's Pallas attention kernel is written for NVIDIA GPUs"
  if shape.dtype not in PALLAS_DTYPES:
    return f"JAX's Pallas attention kernel takes f32, bf16 or f16 (q is {shape.dtype})"
  for what, n in (("queries", shape.queries), ("keys", shape.keys)):
    block = min(PALLAS_BLOCK, n)
    if n % block or block & (block - 1):
      # Triton's blocks are powers of two: a shorter sequence is one block.
      return (f"JAX's Pallas attention kernel needs the {what} ({n}) to be a "
              f"multiple of {PALLAS_BLOCK} or a power of two below it")
  return ""


def tpu_flash_reason(shape: AttentionShape, device) -> str:
  """Why JAX's Pallas TPU flash attention cannot take the chain on
  `device`; "" when it can."""
  if getattr(device, "platform", "") != "tpu":
    return "JAX's Pallas flash attention for TPUs needs a TPU"
  if shape.dtype not in TPU_FLASH_DTYPES:
    return f"JAX's TPU flash attention takes f32 or bf16 (q is {shape.dtype})"
  if shape.queries < TPU_FLASH_BLOCK:
    return (f"JAX's TPU flash attention needs at least {TPU_FLASH_BLOCK} queries "
            f"with its default blocks (there are {shape.queries})")
  if shape.keys < TPU_FLASH_BLOCK or shape.keys % TPU_FLASH_BLOCK:
    return (f"JAX's TPU flash attention needs the keys ({shape.keys}) to be a "
            f"multiple of {TPU_FLASH_BLOCK} with its default blocks")
  return ""


def cudnn_available() -> str:
  """Why this JAX cannot call cuDNN's fused attention ("" when it can): its
  cuDNN comes with the CUDA plugin (what compiling for a GPU needs anyway)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fa  # noqa: PLC0415
    fa.check_cudnn_version()
  except Exception as e:  # noqa: BLE001 - a private check: any failure means no.
    return (f"cuDNN is not available to this JAX ({e}): it comes with the CUDA "
            "plugin and the nvidia-cudnn-cu12 wheel")
  return ""
