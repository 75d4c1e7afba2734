"""Which backend a kernel runs on, and whether Pallas must interpret it.

This is the one place that knows backend traits. Kernels ask `resolve_interpret`
instead of testing the platform themselves, so that a CPU-only machine runs every
kernel in interpret mode and a GPU or TPU compiles it.
"""

from __future__ import annotations

import enum

import jax


class Backend(enum.Enum):
  """The kinds of device a kernel can target."""

  CPU = "cpu"
  GPU = "gpu"
  TPU = "tpu"


#: Backends on which Pallas kernels are compiled rather than interpreted.
COMPILED_BACKENDS = frozenset({Backend.GPU, Backend.TPU})


def current_backend() -> Backend:
  """The backend of JAX's default device."""
  platform = jax.default_backend()
  if platform in ("gpu", "cuda", "rocm"):
    return Backend.GPU
  if platform == "tpu":
    return Backend.TPU
  return Backend.CPU


def resolve_interpret(interpret: bool | None) -> bool:
  """Returns the `interpret=` value for `pallas_call`.

  Args:
    interpret: the caller's wish; `None` means "choose": interpret exactly when
      no GPU or TPU is present, because Pallas has no CPU lowering.
  """
  if interpret is not None:
    return bool(interpret)
  return current_backend() not in COMPILED_BACKENDS


def default_implementation(interpret: bool | None,
                           backend: Backend | None = None) -> str:
  """The implementation an op runs when the caller names none: "pallas"
  where the kernel compiles (or the caller asked for interpret mode), "xla"
  where it would only be interpreted (slower than XLA, with nothing to gain)."""
  backend = current_backend() if backend is None else backend
  return "pallas" if backend in COMPILED_BACKENDS or interpret else "xla"


def device_kind() -> str:
  """`device_kind` of the default device, e.g. "NVIDIA H200" or "cpu"."""
  return jax.devices()[0].device_kind


#: Prefix of the named scope around every kernel launch. The audit reads it from
#: HLO metadata (op_name) to count an interpreted kernel's loop as one kernel.
KERNEL_SCOPE_PREFIX = "pallas_kernels."


def kernel_scope(op: str):
  """`jax.named_scope` to wrap around the `pallas_call` of op `op`."""
  return jax.named_scope(KERNEL_SCOPE_PREFIX + op)
