"""Compile for a GPU this machine does not have: a compile-only CUDA topology.

With the CUDA plugin wheels of the installed jax (`jax-cuda12-plugin`,
`jax-cuda12-pjrt`) and `nvidia-cuda-nvcc-cu12` (ptxas, libdevice), XLA:GPU
compiles for a topology built from a `GpuTargetConfigProto` text, the
device's facts (`gpu_specs/*.txtpb`, copied from the 0.12 plugin, which
embeds them; the 0.11 plugin accepts the same text). Arguments placed on
`device(arch)` (a `SingleDeviceSharding`) make `jax.jit(f).trace(*args)
.lower().compile()` an XLA:GPU compile with the kernels' custom calls
compiled to PTX and cubin: what `compile_report` and the target tests read.
Run with `JAX_PLATFORMS=cpu` so that no GPU is probed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from typing import Any

import jax

#: The GPUs we compile for, by ptxas arch: (spec file, device kind prefix).
SPECS = {"sm_90a": "h200.txtpb", "sm_80": "a100.txtpb"}
#: The wheels a compile-only GPU compile needs, at the installed jax's version
#: (the first two), the third at any.
WHEELS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cuda-nvcc-cu12")


def install_command() -> str:
  """The pip command that brings the wheels for this jax."""
  v = jax.__version__
  return f"pip install jax-cuda12-plugin=={v} jax-cuda12-pjrt=={v} nvidia-cuda-nvcc-cu12"


@functools.cache
def unavailable_reason() -> str | None:
  """Why this environment cannot compile for a GPU topology, or None."""
  for wheel in WHEELS:
    try:
      version = importlib.metadata.version(wheel)
    except importlib.metadata.PackageNotFoundError:
      return f"{wheel} is not installed ({install_command()})"
    if wheel != "nvidia-cuda-nvcc-cu12" and version != jax.__version__:
      return (f"{wheel} {version} does not match jax {jax.__version__} "
              f"({install_command()})")
  if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    return f"the CUDA plugin does not import ({install_command()})"
  return None


def spec_text(arch: str) -> str:
  """The `GpuTargetConfigProto` text of `arch`'s GPU ("sm_90a": H200)."""
  path = os.path.join(os.path.dirname(__file__), "gpu_specs", SPECS[arch])
  with open(path, encoding="utf-8") as f:
    return f.read()


@functools.cache
def device(arch: str) -> Any:
  """The one GPU of a compile-only topology of `arch` ("sm_90a", "sm_80").

  Raises:
    RuntimeError: when the wheels are missing (`unavailable_reason`).
  """
  reason = unavailable_reason()
  if reason:
    raise RuntimeError(f"cannot compile for a GPU here: {reason}")
  from jax.experimental import topologies  # noqa: PLC0415 - needs the plugin.
  topo = topologies.get_topology_desc("", platform="cuda", target_config=spec_text(arch),
                                      topology="1x1x1")
  return topo.devices[0]


def placed(arch: str, *specs: jax.ShapeDtypeStruct) -> tuple[jax.ShapeDtypeStruct, ...]:
  """`specs` placed on `device(arch)` (what a compile for it traces)."""
  sharding = jax.sharding.SingleDeviceSharding(device(arch))
  return tuple(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs)


def compile_for(arch: str, fn, *specs: jax.ShapeDtypeStruct) -> Any:
  """`jax.jit(fn)` compiled for `arch`'s GPU (a `jax.stages.Compiled`)."""
  return jax.jit(fn).trace(*placed(arch, *specs)).lower().compile()
