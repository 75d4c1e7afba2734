"""Which device a kernel is built for, and whether Pallas must interpret it.

This is the one place that knows backend traits. An op hands its operands
and a `launch(interpret)` to `dispatch`, which builds the op for the device
the operands are placed on, never for the process's default backend:

  * an explicit `targeting(...)` scope (the ops' VJP rules re-enter the
    target their forward was traced for; `swap`, `check_guard` and
    `validate` take a `target=`);
  * the operands' placement: a concrete array's device, or a traced value's
    `NamedSharding`, whose mesh names its device (a compile-only CUDA
    topology's GPUs included);
  * the abstract mesh's device (`jax.sharding.use_abstract_mesh(AbstractMesh(
    ..., abstract_device=AbstractDevice("NVIDIA H200", 132, "cuda")))`);
  * on a machine with a GPU or TPU, that device.

On a CPU-only machine, a traced operand that names none of these (a plain
tracer, or a `ShapeDtypeStruct` with a `SingleDeviceSharding` of a topology
device, which JAX does not show while tracing) is decided when the program is
lowered, the one moment the device is known: the op is built for this CPU
for each GPU of `DEFERRED_GPUS` and for a TPU, and a `pallas_kernels_target`
index, lowered for the compiling client's device, keeps the build of the
nearest GPU (`lax.platform_dependent` keeps the CPU build on "cpu" and the
TPU build on "tpu": the row ops' Mosaic TPU kernels, elsewhere each op's
guard says why it runs XLA's ops). Fallbacks of a
build are recorded when, and only when, that build is the one lowered, with
the device they concern.

`Target.abstract` marks a device that is not this process's: building for
it enters an abstract mesh naming it, which is what Pallas's Triton lowering
reads (see `compat`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import mlir

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
  #: Named by an abstract mesh, a topology or by default, not a device of
  #: this process.
  abstract: bool = False
  #: Streaming multiprocessors of a GPU (persistent kernels launch one
  #: program each); None when not known.
  core_count: int | None = None

  def describe(self) -> str:
    """"NVIDIA H200 (sm_90)"-style name for reports."""
    if self.backend is Backend.GPU and self.compute_capability:
      return f"{self.device_kind} (sm_{self.compute_capability})"
    return self.device_kind


#: The GPU a lowering for "cuda" is built for when nothing names one.
DEFAULT_GPU = Target(Backend.GPU, "NVIDIA H200", 90, abstract=True, core_count=132)
#: The GPUs a CPU-only machine builds an op for when its device is decided at
#: lowering: one per kernel family (Hopper: wgmma; Ampere: mma.sync). A GPU
#: of another compute capability gets the build of the nearest lower one.
DEFERRED_GPUS: tuple[Target, ...] = (
    DEFAULT_GPU,
    Target(Backend.GPU, "NVIDIA A100-SXM4-80GB", 80, abstract=True, core_count=108),
)

_override = threading.local()


def _capability(raw: Any) -> int | None:
  """90 from "9.0" (CUDA), None from "gfx942" (ROCm) or nothing."""
  if raw is None:
    return None
  try:
    major, _, minor = str(raw).partition(".")
    return int(major) * 10 + int(minor or 0)
  except ValueError:
    return None


def _spec_capability(kind: str) -> int | None:
  spec = devices.lookup(kind)
  return None if spec is None else spec.compute_capability


def _spec_cores(kind: str) -> int | None:
  spec = devices.lookup(kind)
  return None if spec is None else spec.sm_count


@functools.cache
def _local_devices() -> frozenset[Any]:
  return frozenset(jax.devices())


@functools.cache
def _local_target() -> Target:
  return target_of_device(jax.devices()[0])


def target_of_device(device: Any) -> Target:
  """The `Target` of a `jax.Device` (a topology's included) or an
  `AbstractDevice`."""
  if isinstance(device, jax.sharding.AbstractDevice):
    kind = str(device.device_kind)
    backend = _backend_of(str(device.platform))
    return Target(backend, kind, _spec_capability(kind) if backend is Backend.GPU else None,
                  abstract=True, core_count=device.num_cores or _spec_cores(kind))
  backend = _backend_of(device.platform)
  kind = device.device_kind
  cc = cores = None
  if backend is Backend.GPU:
    cc = _capability(getattr(device, "compute_capability", None)) or _spec_capability(kind)
    cores = getattr(device, "core_count", None) or _spec_cores(kind)
  return Target(backend, kind, cc, abstract=device not in _local_devices(), core_count=cores)


def _abstract_target() -> Target | None:
  abstract = compat.abstract_device()
  if abstract is None or str(abstract.device_kind) == _local_target().device_kind:
    # (A mesh mirroring the local device describes it: the local one knows more.)
    return None
  return target_of_device(abstract)


def target() -> Target:
  """The device the current trace is for: an explicit `targeting` scope, else
  the abstract mesh's device, else this process's first device."""
  forced = getattr(_override, "target", None)
  if forced is not None:
    return forced
  return _abstract_target() or _local_target()


def operand_target(operands: Sequence[Any]) -> Target | None:
  """The device an op on `operands` is built for (see the module docstring),
  or None when only its lowering will know (a CPU-only machine)."""
  forced = getattr(_override, "target", None)
  if forced is not None:
    return forced
  for x in operands:
    if x is None:
      continue
    device = compat.placed_device(x)
    if device is not None:
      t = target_of_device(device)
      if t.device_kind == _local_target().device_kind:
        return _local_target()
      return t
  abstract = _abstract_target()
  if abstract is not None:
    return abstract
  local = _local_target()
  return local if local.backend in COMPILED_BACKENDS else None


@contextlib.contextmanager
def targeting(t: Target) -> Iterator[Target]:
  """Within, `target()` is `t` on this thread; for a GPU that is not this
  process's, the abstract mesh names it too (Pallas's Triton lowering reads
  that, see `compat`)."""
  prev = getattr(_override, "target", None)
  _override.target = t
  try:
    with contextlib.ExitStack() as stack:
      current = compat.abstract_device()
      if (t.backend is Backend.GPU and t.abstract
          and (current is None or str(current.device_kind) != t.device_kind)):
        stack.enter_context(compat.use_abstract_device(t.device_kind, t.core_count, "cuda"))
      yield t
  finally:
    _override.target = prev


#: Pallas backends our GPU kernels lower through.
KERNEL_BACKENDS = ("mosaic_gpu", "triton")
#: The compute capability Mosaic GPU kernels are written for (wgmma, TMA).
MOSAIC_GPU_CAPABILITY = 90


def preferred_kernel_backend(t: Target, interpret: bool) -> tuple[str, str]:
  """(the Pallas backend an op's GPU kernel is built with for target `t`,
  why not Mosaic GPU when it is Triton).

  Mosaic GPU on Hopper (sm_90a: TMA and wgmma) with a JAX that can also
  interpret it (>= 0.11); Triton on other GPUs, on older JAX, and when
  interpreting on a CPU without a named GPU (what the Triton kernels were
  validated in). Interpreting for a named Hopper builds Mosaic GPU.
  """
  reason = compat.mosaic_gpu_unavailable_reason()
  if reason:
    return "triton", reason
  if t.backend is not Backend.GPU:
    return "triton", "no GPU named: the Triton kernel is interpreted"
  if t.compute_capability != MOSAIC_GPU_CAPABILITY:
    return "triton", (f"{t.device_kind} (sm_{t.compute_capability}) has no wgmma; the Mosaic "
                      f"GPU kernels are built for sm_90a")
  return "mosaic_gpu", ""


def current_backend() -> Backend:
  """The backend of the device the current trace is for (see `target`)."""
  return target().backend


# ------------------------------------------------- lowering-time choice ----


class _Builds:
  """Fallback records of each build of a deferred op, kept until the
  lowering says which build is the program's (hashed by identity: a
  primitive parameter)."""

  def __init__(self, count: int):
    self.records: list[guard.Records] = [guard.Records() for _ in range(count)]

  def record(self, index: int, where: str) -> None:
    for f in self.records[index]:
      guard.record_fallback(f.op, f"{where}{f.reason}" if where else f.reason, f.signature)
    for c in self.records[index].choices:
      guard.record_choice(c.op, c.backend, c.why, c.signature)


def _nearest_deferred(cc: int | None) -> int:
  """Index in `DEFERRED_GPUS` of the build for a GPU of capability `cc`: the
  build of its own major version, else the Ampere one (Hopper's wgmma exists
  on sm_90 only; mma.sync runs on sm_80 and later); None: the default GPU."""
  if cc is None:
    return 0
  for i, t in enumerate(DEFERRED_GPUS):
    if t.compute_capability // 10 == cc // 10:
      return i
  return len(DEFERRED_GPUS) - 1


#: The TPU a lowering for "tpu" is built for (which one it is, the lowering
#: says: the fallback records name it).
DEFERRED_TPU = Target(Backend.TPU, "TPU", abstract=True)
#: Build index of the TPU build (after the CPU's and the GPUs').
TPU_BUILD = 1 + len(DEFERRED_GPUS)


def lowering_target(platform: str, lowering_devices: Sequence[Any]) -> tuple[int, str]:
  """(build index, the words a fallback of that build is recorded with) for
  a lowering: 0 is the CPU build, 1 + i the build for `DEFERRED_GPUS[i]`,
  `TPU_BUILD` the TPU's."""
  if _backend_of(platform) is Backend.TPU:
    kinds = [d.device_kind for d in lowering_devices
             if _backend_of(d.platform) is Backend.TPU]
    return TPU_BUILD, f"when lowered for {kinds[0] if kinds else 'TPU'}: "
  if _backend_of(platform) is not Backend.GPU:
    return 0, ""
  gpus = [d for d in lowering_devices if _backend_of(d.platform) is Backend.GPU]
  if not gpus:
    i = 0
    where = f"when lowered for {platform.upper()} ({DEFERRED_GPUS[0].device_kind} assumed): "
  else:
    t = target_of_device(gpus[0])
    i = _nearest_deferred(t.compute_capability)
    built = DEFERRED_GPUS[i]
    where = f"when lowered for {t.device_kind}"
    if built.compute_capability != t.compute_capability:
      where += f" (built as for {built.describe()})"
    where += ": "
  return 1 + i, where


_target_index_p = jex_core.Primitive("pallas_kernels_target")


@_target_index_p.def_abstract_eval
def _target_index_aval(*, builds: _Builds):
  del builds
  return jax.core.ShapedArray((), np.int32)


@_target_index_p.def_impl
def _target_index_impl(*, builds: _Builds):
  # Run eagerly: the program runs here, on this process's device.
  local = _local_target()
  index, where = lowering_target(local.backend.value, jax.devices())
  builds.record(index, where if local.abstract else "")
  return np.int32(index)


def _target_index_lowering(ctx, *, builds: _Builds):
  def rule_for(platform: str):
    def rule(ctx):
      index, where = lowering_target(platform, compat.lowering_devices(ctx))
      builds.record(index, where)
      return [mlir.ir_constant(np.int32(index))]
    return rule

  platforms = compat.lowering_platforms(ctx)
  return compat.lower_per_platform(ctx, "pallas_kernels target",
                                   {p: rule_for(p) for p in platforms}, None)


mlir.register_lowering(_target_index_p, _target_index_lowering)


def _collected(builds: _Builds, index: int, build: Callable[[], Any]) -> Any:
  with guard.collect_fallbacks() as records:
    out = build()
  builds.records[index].extend(records)
  builds.records[index].choices.extend(records.choices)
  return out


def _deferred(interpret: bool | None, launch: Callable[[bool], Any]) -> Any:
  """Builds for this CPU, each of `DEFERRED_GPUS` and a TPU; the lowering
  keeps one."""
  builds = _Builds(2 + len(DEFERRED_GPUS))
  cpu = _local_target()

  def on_cpu(_):
    with targeting(cpu):
      return _collected(builds, 0, lambda: launch(resolve_interpret(interpret)))

  def on_gpu(index):
    def build(i):
      def run():
        with targeting(DEFERRED_GPUS[i]):
          return _collected(builds, 1 + i, lambda: launch(resolve_interpret(interpret)))
      return run
    branches = [build(i) for i in range(len(DEFERRED_GPUS))]
    return jax.lax.switch(index - 1, branches)

  def on_tpu(_):
    with targeting(DEFERRED_TPU):
      return _collected(builds, TPU_BUILD, lambda: launch(resolve_interpret(interpret)))

  index = _target_index_p.bind(builds=builds)
  return jax.lax.platform_dependent(index, cuda=on_gpu, rocm=on_gpu, tpu=on_tpu,
                                    default=on_cpu)


def dispatch(interpret: bool | None, operands: Sequence[Any],
             launch: Callable[[bool], Any]) -> Any:
  """Runs `launch(interpret)` for the device `operands` are placed on.

  Args:
    interpret: the caller's `interpret=`: True interprets (on the operands'
      device if known, else this CPU); None interprets exactly where nothing
      compiles kernels; False compiles.
    operands: the op's array arguments (None entries are skipped).
    launch: builds the op's result for the current `target()` and the given
      interpret mode.
  """
  t = operand_target(operands)
  if t is None and interpret:
    t = _local_target()
  if t is None:
    return _deferred(interpret, launch)
  if t == getattr(_override, "target", None):
    return launch(resolve_interpret(interpret))
  with targeting(t):
    return launch(resolve_interpret(interpret))


def resolve_interpret(interpret: bool | None) -> bool:
  """Returns the `interpret=` value for `pallas_call`.

  Args:
    interpret: the caller's wish; `None` means "choose": interpret exactly when
      the target is neither a GPU nor a TPU, because Pallas has no CPU lowering.
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


#: A TPU named by device kind or by generation and slice.
_TPU_NAME = re.compile(r"^(tpu\b.*|v[2-7][a-z]*(:\d+(x\d+)*)?)$")


def resolve_target(spec: Any) -> Target | None:
  """A `Target` from what a caller may pass as `target=`: None, a `Target`,
  a `jax.Device` (a topology's too), an `AbstractDevice`, or a device name
  ("h200", "NVIDIA A100-SXM4-80GB", "cpu", "tpu": a TPU, whose kernels
  run in TPU interpret mode with `interpret=True` on a CPU).

  Raises:
    ValueError: for a name no entry of `devices.DEVICES` matches.
  """
  if spec is None or isinstance(spec, Target):
    return spec
  if isinstance(spec, str):
    if spec.lower() == "cpu":
      return _local_target() if _local_target().backend is Backend.CPU else Target(
          Backend.CPU, "cpu")
    if spec.lower() == "tpu":
      return _local_target() if _local_target().backend is Backend.TPU else DEFERRED_TPU
    if _TPU_NAME.match(spec.strip().lower()):
      # A TPU by what jax calls it ("TPU v5 lite") or by generation ("v5e",
      # "v5e:2x2"): the Mosaic TPU kernels do not depend on which one.
      local = _local_target()
      if local.backend is Backend.TPU:
        return local
      kind = spec.strip() if spec.lower().startswith("tpu") else f"TPU {spec.strip()}"
      return Target(Backend.TPU, kind, abstract=True)
    entry = devices.lookup(spec)
    if entry is None or entry.compute_capability is None:
      known = ", ".join(d.name for d in devices.DEVICES if d.compute_capability)
      raise ValueError(f"unknown target {spec!r}; known GPUs: {known}, 'tpu' or 'cpu'")
    local = _local_target()
    if local.backend is Backend.GPU and devices.lookup(local.device_kind) is entry:
      return local
    return Target(Backend.GPU, entry.name, entry.compute_capability, abstract=True,
                  core_count=entry.sm_count)
  return target_of_device(spec)


#: Prefix of the named scope around every kernel launch. The audit reads it from
#: HLO metadata (op_name) to count an interpreted kernel's loop as one kernel.
KERNEL_SCOPE_PREFIX = "pallas_kernels."


def kernel_scope(op: str):
  """`jax.named_scope` to wrap around the `pallas_call` of op `op`."""
  return jax.named_scope(KERNEL_SCOPE_PREFIX + op)
