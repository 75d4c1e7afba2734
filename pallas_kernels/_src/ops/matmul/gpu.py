"""GPU specifics of the matmul kernels: Triton compiler params and limits.

Decision: JAX 0.11 deprecated Pallas's Triton lowering in favour of Mosaic GPU.
The matmul still compiles through `pallas_call` with explicit Triton compiler
params on GPU, because that one BlockSpec program runs on A100, H100 and H200
alike (Mosaic GPU targets Hopper and newer), and the same body runs in
interpret mode on CPU, where the tests run. Passing Triton params explicitly
also pins the lowering: with `compiler_params=None` newer JAX may pick Mosaic
GPU (`jax_pallas_use_mosaic_gpu`), which this kernel body is not written for.
The planned Hopper path is a Mosaic GPU kernel (`plgpu.kernel`, TMA loads and
WGMMA) in a sibling module, chosen by `api.py`; nothing in `kernel.py`'s math
would change, only this module's launch details.

What the Triton lowering implies for the kernel body (see `kernel.py`):
  * Blocks are neither padded nor bounds-checked: every access at a ragged
    edge goes through the masked `load`/`store` of `pallas_kernels._src.gpu`.
  * Tensor shapes must be powers of two, and `tt.dot` needs every tile edge
    >= 16 (`config.GPU_MIN_BLOCK`).
  * Both dot operands must have the same element type: quantized tiles are
    converted to the compute dtype in registers before the dot.
  * float32 operands follow the caller's `precision` as XLA's dots do:
    `DEFAULT` and `HIGH` lower to TF32 tensor cores, `HIGHEST` to IEEE fp32
    FMA (see `resolve_precision`); 16-bit and quantized tiles are unaffected.
  * There is no `erf` and no `round` lowering: the epilogue uses its own erf
    (`kernel.erf`) and the shared quantizer rounds with floor.
  * float8_e4m3fn conversions need compute capability >= 8.9.
  * int4 is loaded packed (two per byte) when a tile is contiguous and even
    along the array's last axis, which every matmul tile is.
"""

from __future__ import annotations

from typing import Any

import jax

from pallas_kernels._src import backend as backend_lib
from pallas_kernels._src import compat
from pallas_kernels._src import gpu as shared_gpu

#: Used when there is no GPU to ask (lowering without one): A100's value.
_DEFAULT_SMEM_BYTES = shared_gpu.SHARED_MEMORY_PER_BLOCK[80]


def unavailable_reason(interpret: bool) -> str | None:
  """Why the matmul Pallas kernel cannot run here, or None if it can.

  Args:
    interpret: whether the kernel would run in interpret mode.
  """
  reason = shared_gpu.unavailable_reason(True)
  if reason:
    return reason
  if interpret:
    return None
  kind = backend_lib.current_backend()
  if kind is not backend_lib.Backend.GPU:
    # The body relies on Triton's masked loads; Mosaic TPU needs another kernel.
    return f"no compiled matmul kernel for backend {kind.value!r}"
  if compat.TRITON_COMPILER_PARAMS is None:
    return "this JAX has no Triton CompilerParams for pallas_call"
  return None


def compiler_params(*, num_warps: int, num_stages: int, interpret: bool) -> Any:
  """Triton compiler params for `pallas_call`.

  Args:
    num_warps: warps per program.
    num_stages: software-pipelining depth of the kernel's loops.
    interpret: whether the call runs in interpret mode (then no params: no
      Triton lowering follows).

  Returns:
    An instance of this JAX's Triton params class (None if it has none; the
    guard keeps such a JAX from compiling).
  """
  if interpret:
    return None
  return compat.triton_compiler_params(num_warps=num_warps, num_stages=num_stages)


def compute_capability() -> int | None:
  """Compute capability of the default GPU (90 for H100/H200), else None."""
  return shared_gpu.compute_capability()


def float8_reason(interpret: bool) -> str | None:
  """Why float8_e4m3fn tiles cannot be converted here, or None."""
  return shared_gpu.float8_reason(interpret)


def shared_memory_bytes() -> int:
  """Shared memory a Triton program may use on the default GPU."""
  cc = compute_capability()
  if cc is None:
    return _DEFAULT_SMEM_BYTES
  return shared_gpu.shared_memory_per_block(cc)


def shared_memory_bytes_of(device_kind: str) -> int:
  """Shared memory per program by device name (for tiling without a device).

  Args:
    device_kind: e.g. "NVIDIA H200"; unknown or empty names get A100's value.
  """
  kind = device_kind.upper()
  smem = shared_gpu.SHARED_MEMORY_PER_BLOCK
  if any(tag in kind for tag in ("H100", "H200", "H800", "H20", "B100", "B200")):
    return smem[90]
  if any(tag in kind for tag in ("A100", "A800", "A30")) or not kind:
    return smem[80]
  return smem[86]


def pipeline_smem_bytes(block_m: int, block_n: int, block_k: int, x_itemsize: float,
                        w_itemsize: float, num_stages: int,
                        compute_itemsize: float | None = None) -> int:
  """Shared memory the kernel needs, erring high: `num_stages` x and w tiles
  of the K-loop pipeline, plus, for an operand stored narrower than the
  compute dtype (int8, int4, fp8), one tile of it converted to the compute
  dtype, which Triton stages through shared memory on its way to the dot.

  Compiled for sm_90a the pipeline alone undercounts quantized weights by up
  to a compute-dtype tile (int8 131,072 estimated vs 147,456 used; int4
  98,304 vs 122,880; see `gpu_report` and its test, which holds this
  estimate above what Triton allocates for every default config).
  """
  per_stage = block_m * block_k * x_itemsize + block_k * block_n * w_itemsize
  total = per_stage * max(1, num_stages)
  if compute_itemsize is not None:
    if x_itemsize < compute_itemsize:
      total += block_m * block_k * compute_itemsize
    if w_itemsize < compute_itemsize:
      total += block_k * block_n * compute_itemsize
  return int(total)


def resolve_precision(precision: Any) -> str:
  """The `jax.lax.Precision` name a matmul runs at: the caller's, else JAX's
  `jax_default_matmul_precision`, else DEFAULT, as for `jnp.matmul`.

  On a GPU, DEFAULT (and HIGH) f32 dots use TF32 tensor cores in XLA and in
  Triton alike; HIGHEST is IEEE fp32. Interpret mode on CPU is exact either way.

  Raises:
    ValueError: for a value `jax.lax.Precision` does not take (a dot algorithm
      preset included: the kernel does not implement those).
  """
  if precision is None:
    precision = jax.config.jax_default_matmul_precision
    if precision is None:
      return "DEFAULT"
  if isinstance(precision, (tuple, list)) and len(precision) == 2:
    # jax's (lhs, rhs) pair: the more precise of the two, as XLA takes it.
    names = [resolve_precision(p) for p in precision]
    return max(names, key=("DEFAULT", "HIGH", "HIGHEST").index)
  try:
    return jax.lax.Precision(precision).name
  except (TypeError, ValueError):
    raise ValueError(
        f"precision must be None, a jax.lax.Precision or its name ('default', 'high', "
        f"'highest', 'bfloat16', 'tensorfloat32', 'float32'), got {precision!r}") from None


def dot_precision(name: str) -> jax.lax.Precision:
  """The in-kernel dot's precision for a `resolve_precision` name."""
  return jax.lax.Precision[name]


# Masked access is shared with the row-wise ops: one implementation of the
# "never touch memory past the array" rule.
load = shared_gpu.load
store = shared_gpu.store
