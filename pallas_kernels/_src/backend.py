"""Which device a kernel is built for, and whether Pallas must interpret it.

This is the one place that knows backend traits. Kernels ask `target()` and
`resolve_interpret` instead of testing the platform themselves, so that a
CPU-only machine runs every kernel in interpret mode, a GPU or TPU compiles it,
and a GPU this machine does not have can still be lowered for:

  * under `jax.sharding.use_abstract_mesh(AbstractMesh(..., abstract_device=
    AbstractDevice("NVIDIA H200", 132, "cuda")))` the ops trace for that device
    (its kind and compute capability pick tiles and guards);
  * with no GPU, no TPU and no abstract device, `implementation="pallas"` with
    `interpret=None` traces both an interpreted kernel and the kernel compiled
    for `DEFAULT_GPU` (an H200) under `jax.lax.platform_dependent`, so that
    `.lower(lowering_platforms=("cuda",))` keeps the compiled one and a CPU
    run the interpreted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

from pallas_kernels._src import compat
from pallas_kernels._src import devices
from pallas_kernels._src import guard


class Backend(enum.Enum):
  """The kinds of device a kernel can target."""

  CPU = "cpu"
  GPU = "gpu"
  TPU = "tpu"


#: Backends on which Pallas kernels are compiled rather than interpreted.
COMPILED_BACKENDS = frozenset({Backend.GPU, Backend.TPU})


def _backend_of(platform: str) -> Backend:
  if platform in ("gpu", "cuda", "rocm"):
    return Backend.GPU
  if platform == "tpu":
    return Backend.TPU
  return Backend.CPU


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
  """The device kernels are traced for."""

  backend: Backend
  #: `device_kind`, e.g. "NVIDIA H200"; "cpu" for the host.
  device_kind: str
  #: NVIDIA compute capability as an int (90 for sm_90); None when not known.
  compute_capability: int | None = None
  #: Named by an abstract mesh or by default, not a device of this process.
  abstract: bool = False


#: The GPU a CPU-only machine lowers for when nothing names one.
DEFAULT_GPU = Target(Backend.GPU, "NVIDIA H200", 90, abstract=True)

_override = threading.local()


def _capability_of(kind: str) -> int | None:
  spec = devices.lookup(kind)
  return None if spec is None else spec.compute_capability


@functools.cache
def _local_target() -> Target:
  device = jax.devices()[0]
  backend = _backend_of(jax.default_backend())
  cc = None
  if backend is Backend.GPU:
    raw = getattr(device, "compute_capability", None)
    try:
      cc = int(str(raw).replace(".", "")) if raw is not None else None
    except ValueError:  # ROCm reports e.g. "gfx942".
      cc = None
  return Target(backend, device.device_kind, cc)


def target() -> Target:
  """The device the current trace is for: an explicit `targeting` scope, else
  the abstract mesh's device, else JAX's default device."""
  forced = getattr(_override, "target", None)
  if forced is not None:
    return forced
  abstract = compat.abstract_device()
  if abstract is not None and str(abstract.device_kind) != _local_target().device_kind:
    # (A mesh mirroring the local device describes it: the local one knows more.)
    kind = str(abstract.device_kind)
    return Target(_backend_of(str(abstract.platform)), kind, _capability_of(kind),
                  abstract=True)
  return _local_target()


@contextlib.contextmanager
def targeting(t: Target) -> Iterator[Target]:
  """Within, `target()` is `t` on this thread (custom_vjp rules re-enter the
  target their forward was traced for, since JAX traces them later)."""
  prev = getattr(_override, "target", None)
  _override.target = t
  try:
    yield t
  finally:
    _override.target = prev


def current_backend() -> Backend:
  """The backend of the device the current trace is for (see `target`)."""
  return target().backend


def per_platform(interpret: bool | None, launch: Callable[[bool], Any]) -> Any:
  """Runs `launch(interpret)`, or on a machine with nothing to compile for,
  lowers both ways (see the module docstring).

  Args:
    interpret: the caller's `interpret=`; only None lets us choose per platform.
    launch: builds the op's result for the current `target()` and the given
      interpret mode.
  """
  if interpret is not None or target().backend in COMPILED_BACKENDS:
    return launch(resolve_interpret(interpret))

  def on_gpu():
    # What this branch would fall back on concerns only a lowering for CUDA:
    # the record says so, lest a CPU run seem to have fallen back.
    with targeting(DEFAULT_GPU), guard.collect_fallbacks() as records:
      out = launch(False)
    for f in records:
      guard.record_fallback(f.op, f"when lowered for CUDA ({DEFAULT_GPU.device_kind} "
                            f"assumed): {f.reason}", f.signature)
    return out

  return jax.lax.platform_dependent(cuda=on_gpu, default=lambda: launch(True))


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
  """`device_kind` of the target device, e.g. "NVIDIA H200" or "cpu"."""
  return target().device_kind


#: Prefix of the named scope around every kernel launch. The audit reads it from
#: HLO metadata (op_name) to count an interpreted kernel's loop as one kernel.
KERNEL_SCOPE_PREFIX = "pallas_kernels."


def kernel_scope(op: str):
  """`jax.named_scope` to wrap around the `pallas_call` of op `op`."""
  return jax.named_scope(KERNEL_SCOPE_PREFIX + op)
