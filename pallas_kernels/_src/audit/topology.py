"""Compile for a GPU this machine does not have, through hlo_audit's target.

`hlo_audit.get_target` builds a compile-only CUDA topology from XLA's
`GpuTargetConfigProto` of the GPU (it needs the CUDA plugin wheels of the
installed jax and `nvidia-cuda-nvcc-cu12`: `pip install 'hlo-audit[gpu-target]'`).
Arguments placed on one of its devices (a `SingleDeviceSharding`) make
`jax.jit(f).trace(*args).lower().compile()` an XLA:GPU compile with the
kernels' custom calls compiled to PTX and cubin: what `compile_report` and
the target tests read. Run with `JAX_PLATFORMS=cpu` so that no GPU is probed.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

import hlo_audit

#: The GPUs the kernels are compiled for, by ptxas arch: hlo_audit's target name.
SPECS = {"sm_90a": "h200", "sm_80": "a100-sxm-80"}


@functools.cache
def unavailable_reason() -> str | None:
  """Why this environment cannot compile for a GPU topology (naming the pip
  command that fixes it), or None."""
  try:
    hlo_audit.get_target(SPECS["sm_90a"]).devices()
  except hlo_audit.TargetError as e:
    return str(e)
  return None


@functools.cache
def device(arch: str) -> Any:
  """The one GPU of a compile-only topology of `arch` ("sm_90a", "sm_80").

  Raises:
    hlo_audit.TargetError: when the wheels are missing (`unavailable_reason`).
  """
  return hlo_audit.get_target(SPECS[arch]).devices()[0]


def placed(arch: str, *specs: jax.ShapeDtypeStruct) -> tuple[jax.ShapeDtypeStruct, ...]:
  """`specs` placed on `device(arch)` (what a compile for it traces)."""
  sharding = jax.sharding.SingleDeviceSharding(device(arch))
  return tuple(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs)


def compile_for(arch: str, fn, *specs: jax.ShapeDtypeStruct) -> Any:
  """`jax.jit(fn)` compiled for `arch`'s GPU (a `jax.stages.Compiled`)."""
  return jax.jit(fn).trace(*placed(arch, *specs)).lower().compile()
