"""Facts that differ between the supported JAX versions, one section per topic.

Code elsewhere asks these functions instead of testing `jax.__version__`.
"""

from __future__ import annotations

from typing import Any

import jax

# Target devices
# --------------
# Lowering for a GPU this machine does not have. Every supported JAX has the
# public `jax.sharding.use_abstract_mesh` / `get_abstract_mesh` and an
# `AbstractMesh(..., abstract_device=AbstractDevice(kind, cores, platform))`.
# What Pallas's Triton lowering does with it differs:
#   * jax <= 0.10.2 ignores the abstract device and, with no local GPU, lowers
#     for compute capability 9.0 (it embeds Triton IR at lowering time);
#   * jax >= 0.11 reads the abstract device's kind (a table in
#     `jax._src.pallas.triton.gpu_info`) and, with neither a GPU nor an abstract
#     GPU device, fails with "No supported GPU devices found".
# Our ops read the same abstract device at trace time, so their tiles and
# guards follow the device the caller names on every version.


def abstract_device() -> Any | None:
  """The `AbstractDevice` named by the current abstract mesh, or None.

  Read through the public `jax.sharding.get_abstract_mesh()`; a JAX without
  it, or a mesh without a device, gives None.
  """
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  if get is None:  # pragma: no cover - every supported JAX has it.
    return None
  mesh = get()
  return getattr(mesh, "abstract_device", None) if mesh is not None else None


def lowering_needs_abstract_gpu() -> bool:
  """Whether Pallas's Triton lowering needs an abstract GPU device (or a real
  GPU) to lower for "cuda": true from jax 0.11 on (see above)."""
  return _jax_version() >= (0, 11)


def _jax_version() -> tuple[int, ...]:
  parts = []
  for p in jax.__version__.split(".")[:3]:
    digits = "".join(ch for ch in p if ch.isdigit())
    parts.append(int(digits) if digits else 0)
  return tuple(parts)
