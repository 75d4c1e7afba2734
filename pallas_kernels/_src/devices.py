"""Peak numbers of the devices we report rooflines against: the one table.

Dense peaks (no 2:4 sparsity), vendor datasheet figures. A device is matched by
a substring of its `device_kind` (case-insensitive), first match wins, so the
more specific names come first.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceSpec:
  """Peak memory bandwidth and arithmetic throughput of one device."""

  #: Display name.
  name: str
  #: Lower-case substrings of `jax.Device.device_kind` that identify it.
  match: tuple[str, ...]
  #: Peak HBM (or DRAM) bandwidth, GB/s (1e9 bytes per second).
  hbm_gbps: float
  #: Peak dense bfloat16 matrix throughput, TFLOP/s.
  bf16_tflops: float
  #: Peak float32 throughput without TF32 tensor cores, TFLOP/s.
  f32_tflops: float
  #: NVIDIA compute capability as an int (90 for sm_90), None for others.
  compute_capability: int | None = None
  #: Streaming multiprocessors (NVIDIA), None for others.
  sm_count: int | None = None

  def peak_tflops(self, dtype_name: str) -> float:
    """Peak TFLOP/s for arithmetic in `dtype_name` (16-bit types use bf16)."""
    if dtype_name in ("bfloat16", "float16", "int8", "float8_e4m3fn"):
      return self.bf16_tflops
    return self.f32_tflops


DEVICES: tuple[DeviceSpec, ...] = (
    # NVIDIA H200 datasheet: 4.8 TB/s HBM3e; same Hopper SXM compute as H100:
    # 989 dense BF16 tensor TFLOP/s, 67 FP32 TFLOP/s.
    DeviceSpec("NVIDIA H200", ("h200",), hbm_gbps=4800.0, bf16_tflops=989.0,
               f32_tflops=67.0, compute_capability=90, sm_count=132),
    # NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3, 989 dense BF16, 67 FP32.
    DeviceSpec("NVIDIA H100 SXM", ("h100",), hbm_gbps=3350.0, bf16_tflops=989.0,
               f32_tflops=67.0, compute_capability=90, sm_count=132),
    # NVIDIA A100 80GB SXM datasheet: 2.039 TB/s HBM2e, 312 dense BF16, 19.5 FP32.
    DeviceSpec("NVIDIA A100 80GB", ("a100",), hbm_gbps=2039.0, bf16_tflops=312.0,
               f32_tflops=19.5, compute_capability=80, sm_count=108),
    # Google Cloud TPU v5e docs: 819 GB/s HBM2, 197 BF16 TFLOP/s per chip; no
    # native f32 matrix unit, f32 matmuls take several bf16 passes (~1/3).
    DeviceSpec("TPU v5e", ("v5 lite", "v5e", "v5litepod"), hbm_gbps=819.0,
               bf16_tflops=197.0, f32_tflops=65.0),
    # Generic CPU: a nominal dual-channel DDR5 server socket, order-of-magnitude
    # only; CPU percentages are not meaningful and are reported as such.
    DeviceSpec("generic CPU", ("cpu",), hbm_gbps=100.0, bf16_tflops=1.0,
               f32_tflops=1.0),
)


def lookup(device_kind: str) -> DeviceSpec | None:
  """The spec whose `match` occurs in `device_kind`, or None if unknown."""
  kind = device_kind.lower()
  for spec in DEVICES:
    if any(m in kind for m in spec.match):
      return spec
  return None
