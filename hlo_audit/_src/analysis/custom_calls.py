"""What each custom call of optimized GPU (and CPU/TPU) HLO launches.

A custom call is opaque to the audit: its reads and writes count, its insides
do not. So every target gets a family here (a library gemm, a convolution,
fused attention, a user kernel, a host transfer, a runtime helper, a marker),
and a target we do not know is reported as unknown rather than taken for a
plain op. Library and user-kernel names come from `backend_traits`; this table
adds the rest of what XLA's GPU pipeline and JAX emit.

Plain data, no JAX.
"""

from __future__ import annotations

import dataclasses
import enum

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.hlo.ir import HloModule, Instruction


class CallFamily(enum.Enum):
  """What a custom call does, coarsely."""

  GEMM = "gemm"
  CONVOLUTION = "convolution"
  ATTENTION = "fused attention"
  LIBRARY = "library kernel"
  USER_KERNEL = "user kernel"
  SORT_SCAN = "sort/scan"
  HOST = "host transfer or callback"
  RUNTIME = "runtime helper"
  MARKER = "marker (launches nothing)"
  UNKNOWN = "unknown"


#: Target prefix -> (family, provider), first match wins (specific first).
#: Sources: XLA's GPU custom-call targets (cublas_cudnn.cc, the Triton FFI
#: handler), JAX's Pallas (Triton and Mosaic GPU) and jax-triton lowerings.
_TABLE: tuple[tuple[str, CallFamily, str], ...] = (
    ("__cublas$lt$matmul", CallFamily.GEMM, "cuBLASLt"),
    ("__cublas$gemm", CallFamily.GEMM, "cuBLAS"),
    ("__cublas$", CallFamily.LIBRARY, "cuBLAS"),
    ("__cudnn$conv", CallFamily.CONVOLUTION, "cuDNN"),
    ("__cudnn$fmha", CallFamily.ATTENTION, "cuDNN"),
    ("__cudnn$", CallFamily.LIBRARY, "cuDNN"),
    ("__cusolver$", CallFamily.LIBRARY, "cuSOLVER"),
    ("__onednn$matmul", CallFamily.GEMM, "oneDNN"),
    ("__onednn$", CallFamily.LIBRARY, "oneDNN"),
    ("__op$block_scaled_dot", CallFamily.GEMM, "XLA"),
    ("__gpu$TopK", CallFamily.LIBRARY, "XLA GPU TopK"),
    ("__gpu$xla.gpu.ptx", CallFamily.USER_KERNEL, "PTX kernel"),
    ("__gpu$xla.gpu.triton", CallFamily.USER_KERNEL, "Pallas/Triton (FFI)"),
    ("triton_kernel_call", CallFamily.USER_KERNEL, "Triton (jax-triton, FFI)"),
    ("mosaic_gpu", CallFamily.USER_KERNEL, "Pallas/Mosaic GPU"),
    ("tpu_custom_call", CallFamily.USER_KERNEL, "Pallas/Mosaic TPU"),
    ("xla.gpu.ext.cub_sort", CallFamily.SORT_SCAN, "CUB"),
    ("xla.gpu.ext.cub_scan", CallFamily.SORT_SCAN, "CUB"),
    ("__cub$", CallFamily.SORT_SCAN, "CUB"),
    ("MoveToHost", CallFamily.HOST, "XLA host offload"),
    ("MoveToDevice", CallFamily.HOST, "XLA host offload"),
    ("Pin", CallFamily.HOST, "XLA host memory pinning"),
    ("Unpin", CallFamily.HOST, "XLA host memory pinning"),
    ("HostExecute", CallFamily.HOST, "XLA host execution"),
    ("xla_python_gpu_callback", CallFamily.HOST, "JAX host callback"),
    ("xla_ffi_python_gpu_callback", CallFamily.HOST, "JAX host callback (FFI)"),
    ("xla_python_cpu_callback", CallFamily.HOST, "JAX host callback"),
    ("xla_ffi_python_cpu_callback", CallFamily.HOST, "JAX host callback (FFI)"),
    ("__xla_gpu_assert", CallFamily.RUNTIME, "XLA GPU runtime"),
    ("__xla_gpu_debug_print", CallFamily.RUNTIME, "XLA GPU runtime"),
    ("__xla_gpu_append_to_file", CallFamily.RUNTIME, "XLA GPU runtime"),
    ("xla.gpu.update_buffer", CallFamily.RUNTIME, "XLA GPU runtime"),
    ("__nop", CallFamily.MARKER, "XLA"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class CallClass:
  """The classification of one custom call."""

  target: str
  family: CallFamily
  #: Who implements it: "cuBLASLt", "cuDNN", "Pallas/Triton (FFI)", ...
  provider: str
  #: A library gemm's fused epilogue from its backend config ("BIAS_GELU"),
  #: else None.
  epilogue: str | None = None
  #: The elementwise work that epilogue performs (`backend_traits.GEMM_EPILOGUES`).
  fused: tuple[str, ...] = ()

  @property
  def known(self) -> bool:
    return self.family is not CallFamily.UNKNOWN

  @property
  def already_fused(self) -> bool:
    """A library call that already applies an epilogue to its result."""
    return bool(self.fused)


#: Families of custom calls only XLA's backend passes write (a dot or
#: convolution rewritten into a library call): HLO holding one is optimized.
REWRITTEN_BY_XLA = frozenset({CallFamily.GEMM, CallFamily.CONVOLUTION,
                              CallFamily.ATTENTION})


def classify_target(target: str) -> tuple[CallFamily, str]:
  """(family, provider) of a custom-call target string."""
  if target in bt.NO_OP_TARGETS:
    return CallFamily.MARKER, "XLA"
  for prefix, family, provider in _TABLE:
    if target.startswith(prefix):
      return family, provider
  return CallFamily.UNKNOWN, ""


def classify(inst: Instruction) -> CallClass:
  """The classification of a custom-call instruction (with its gemm epilogue)."""
  target = inst.custom_call_target or ""
  family, provider = classify_target(target)
  epilogue = bt.gemm_epilogue(inst) if family is CallFamily.GEMM else None
  fused = bt.GEMM_EPILOGUES.get(epilogue, ()) if epilogue else ()
  if epilogue and epilogue not in bt.GEMM_EPILOGUES:
    fused = (epilogue.lower(),)  # An epilogue newer than our table: still fused work.
  return CallClass(target=target, family=family, provider=provider,
                   epilogue=epilogue, fused=tuple(fused))


def custom_calls(module: HloModule) -> tuple[tuple[str, str, CallClass], ...]:
  """(computation, instruction, class) of every custom call in the module."""
  out = []
  for comp in module.computations:
    for inst in comp.instructions:
      if inst.opcode == "custom-call":
        out.append((comp.name, inst.name, classify(inst)))
  return tuple(out)


def unknown_targets(module: HloModule) -> tuple[str, ...]:
  """Distinct custom-call targets of the module that no table names, sorted."""
  return tuple(sorted({c.target for _, _, c in custom_calls(module) if not c.known}))


#: Ops that move or reinterpret data without computing on it.
_DATA_MOVEMENT = frozenset({
    "parameter", "constant", "bitcast", "reshape", "transpose", "broadcast", "copy",
    "slice", "dynamic-slice", "concatenate", "pad", "iota", "tuple",
    "get-tuple-element", "convert"})


def gemm_fusion_epilogue(module: HloModule, inst: Instruction) -> tuple[str, ...]:
  """Opcodes a triton gemm fusion applies to its dot's result before the root
  (sorted, distinct): the epilogue XLA already fused, or () for a bare dot.

  Conversions and data movement do not count; a nested fusion (XLA's nested
  gemm form) is followed into.
  """
  called = inst.called_computations.get("calls", ())
  if not called or called[0] not in module:
    return ()
  comp = module.computation(called[0])
  users: dict[str, list[Instruction]] = {}
  for i in comp.instructions:
    for op in i.operands:
      users.setdefault(op, []).append(i)
  dots = [i for i in comp.instructions if i.opcode in ("dot", "scaled-dot")]
  if not dots:
    # Nested form: the dot sits in a fusion called from this one.
    dots = [i for i in comp.instructions if i.opcode == "fusion"
            and any(module.computation(c).root.opcode in ("dot", "scaled-dot")
                    for c in i.called_computations.get("calls", ()) if c in module)]
  work: set[str] = set()
  stack = [d.name for d in dots]
  seen = set(stack)
  while stack:
    for user in users.get(stack.pop(), ()):
      if user.name in seen:
        continue
      seen.add(user.name)
      if user.opcode not in _DATA_MOVEMENT:
        work.add(user.opcode)
      stack.append(user.name)
  return tuple(sorted(work))
