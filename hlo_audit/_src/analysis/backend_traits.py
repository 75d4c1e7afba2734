"""What backends put in optimized HLO: the one table of library calls, fusion
kinds and fused epilogues, so no analysis keeps its own list of names.

Sources: custom-call targets and backend configs printed by XLA's CPU, GPU
(cuBLAS, cuBLASLt, cuDNN, Triton) and TPU pipelines, as seen in XLA's tests.
"""

from __future__ import annotations

import enum
import json

from hlo_audit._src.hlo.ir import Instruction


class KernelKind(enum.Enum):
  """What launches the work of one kernel."""

  LOOP_FUSION = "loop fusion"
  INPUT_FUSION = "input fusion"
  OUTPUT_FUSION = "output fusion"
  CUSTOM_FUSION = "custom fusion"
  TRITON_GEMM = "triton gemm fusion"
  TRITON_FUSION = "triton fusion"
  CUDNN_FUSION = "cudnn fusion"
  CPU_LIBRARY_FUSION = "cpu library fusion"
  LIBRARY_CALL = "library call"
  PALLAS = "pallas kernel"
  CUSTOM_CALL = "custom call"
  COLLECTIVE = "collective"
  COPY = "copy"
  UNFUSED_OP = "unfused op"


#: Custom-call target prefixes of vendor libraries, with the library's name.
LIBRARY_TARGETS: tuple[tuple[str, str], ...] = (
    ("__cublas$lt", "cuBLASLt"),
    ("__cublas$", "cuBLAS"),
    ("__cudnn$", "cuDNN"),
    ("__cusolver$", "cuSOLVER"),
    ("__onednn$", "oneDNN"),
    ("__op$", "XLA library op"),
    ("__gpu$TopK", "XLA GPU TopK"),
    ("__gpu$xla.gpu.ptx", "PTX kernel"),
)

#: Custom-call targets of user kernels (Pallas, Mosaic, Triton).
KERNEL_TARGETS: tuple[tuple[str, str], ...] = (
    ("tpu_custom_call", "Pallas/Mosaic TPU"),
    ("__gpu$xla.gpu.triton", "Pallas/Triton GPU"),
    ("mosaic_gpu", "Pallas/Mosaic GPU"),
    ("triton_kernel_call", "Triton (jax-triton)"),
)

#: Custom-call targets that launch nothing (markers and annotations).
NO_OP_TARGETS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
    "LayoutConstraint", "AllocateBuffer", "MoveToHost", "MoveToDevice",
    "PartitionId", "annotate_device_placement", "xla_python_cpu_callback",
})

#: Library custom calls that compute a matrix product.
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__onednn$matmul",
                "__op$block_scaled_dot")
#: Library custom calls that compute a convolution.
CONV_TARGETS = ("__cudnn$conv",)

#: GPU fusion backend-config kinds, by kernel kind.
_FUSION_CONFIG_KINDS = {
    "__triton_gemm": KernelKind.TRITON_GEMM,
    "__triton_nested_gemm_fusion": KernelKind.TRITON_GEMM,
    "__triton": KernelKind.TRITON_FUSION,
    "__triton_softmax": KernelKind.TRITON_FUSION,
    "__triton_collective": KernelKind.TRITON_FUSION,
    "__cudnn$fusion": KernelKind.CUDNN_FUSION,
    "__custom_fusion": KernelKind.CUSTOM_FUSION,
    "__ynn_fusion": KernelKind.CPU_LIBRARY_FUSION,
    "__onednn_fusion": KernelKind.CPU_LIBRARY_FUSION,
}
_FUSION_KINDS = {"kLoop": KernelKind.LOOP_FUSION, "kInput": KernelKind.INPUT_FUSION,
                 "kOutput": KernelKind.OUTPUT_FUSION, "kCustom": KernelKind.CUSTOM_FUSION}

#: cuBLASLt epilogues, and the elementwise work each one fuses.
GEMM_EPILOGUES: dict[str, tuple[str, ...]] = {
    "DEFAULT": (),
    "BIAS": ("bias",),
    "RELU": ("activation",),
    "BIAS_RELU": ("bias", "activation"),
    "GELU": ("activation",),
    "GELU_AUX": ("activation",),
    "BIAS_GELU": ("bias", "activation"),
    "BIAS_GELU_AUX": ("bias", "activation"),
    "SILU": ("activation",),
    "BIAS_SILU": ("bias", "activation"),
}


def fusion_config_kind(inst: Instruction) -> str | None:
  """The backend-config fusion kind ("__triton_gemm", "__ynn_fusion", ...)."""
  config = inst.backend_config_json()
  if not config:
    return None
  for key in ("fusion_backend_config", "fusion_config"):
    sub = config.get(key)
    if isinstance(sub, dict) and isinstance(sub.get("kind"), str):
      return sub["kind"]
  return None


def library_of(target: str) -> str | None:
  """"cuBLASLt", "cuDNN", ... for a library custom-call target."""
  for prefix, name in LIBRARY_TARGETS:
    if target.startswith(prefix):
      return name
  return None


def user_kernel_of(target: str) -> str | None:
  """"Pallas/Mosaic TPU", ... for a user-kernel custom-call target."""
  for prefix, name in KERNEL_TARGETS:
    if target.startswith(prefix):
      return name
  return None


def classify_fusion(inst: Instruction) -> tuple[KernelKind, str]:
  """Kernel kind of a fusion instruction and a short detail string."""
  config_kind = fusion_config_kind(inst)
  if config_kind in _FUSION_CONFIG_KINDS:
    return _FUSION_CONFIG_KINDS[config_kind], config_kind
  kind = _FUSION_KINDS.get(inst.fusion_kind or "", KernelKind.LOOP_FUSION)
  return kind, config_kind or (inst.fusion_kind or "")


def gemm_epilogue(inst: Instruction) -> str | None:
  """The cuBLAS/cuBLASLt epilogue of a library gemm ("BIAS_GELU", ...)."""
  config = inst.backend_config_json()
  if not config:
    return None
  gemm = config.get("gemm_backend_config")
  if isinstance(gemm, dict) and isinstance(gemm.get("epilogue"), str):
    return gemm["epilogue"]
  return None


def is_gemm_call(inst: Instruction) -> bool:
  target = inst.custom_call_target or ""
  return inst.opcode == "custom-call" and any(target.startswith(t) for t in GEMM_TARGETS)


def is_conv_call(inst: Instruction) -> bool:
  target = inst.custom_call_target or ""
  return inst.opcode == "custom-call" and any(target.startswith(t) for t in CONV_TARGETS)


#: XLA:GPU's split-K rewrite names the reducer of a gemm's partial sums
#: after the dot: `<dot>.reduce_sub_computation`.
SPLIT_K_REDUCER_SUFFIX = "reduce_sub_computation"

#: cuDNN's fused convolution: the bias, a side input and the activation run
#: in the convolution call itself.
CONV_BIAS_ACTIVATION_TARGET = "__cudnn$convBiasActivationForward"
#: cuDNN's weight gradient: operands (x, dy) in the forward's dim_labels,
#: the result the kernel's gradient.
CONV_BACKWARD_FILTER_TARGET = "__cudnn$convBackwardFilter"


def is_split_k_reduce(inst: Instruction) -> bool:
  """Whether `inst` sums a Triton gemm's split-K partial sums (part of the
  gemm, not a reduction of the program's)."""
  return inst.opcode == "reduce" and any(
      name.endswith(SPLIT_K_REDUCER_SUFFIX)
      for name in inst.called_computations.get("to_apply", ()))


def conv_epilogue(inst: Instruction) -> tuple[str, ...]:
  """The work a cuDNN fused convolution runs after the convolution ("bias",
  "residual", "activation:relu"), () for any other instruction."""
  if inst.opcode != "custom-call" or inst.custom_call_target != CONV_BIAS_ACTIVATION_TARGET:
    return ()
  config = (inst.backend_config_json() or {}).get("cudnn_conv_backend_config", {})
  items = ["bias"]
  if isinstance(config, dict):
    if config.get("side_input_scale", 0) not in (0, "0"):
      items.append("residual")
    mode = config.get("activation_mode", "kNone")
    if isinstance(mode, str) and mode not in ("kNone", "NONE", ""):
      items.append(f"activation:{mode.removeprefix('k').lower()}")
  return tuple(items)


def trip_count(inst: Instruction) -> int | None:
  """A while loop's trip count when XLA states it (`known_trip_count`)."""
  config = inst.backend_config_json()
  if not config:
    return None
  known = config.get("known_trip_count")
  if isinstance(known, dict) and "n" in known:
    try:
      return int(known["n"])
    except (TypeError, ValueError):
      return None
  return None


#: Anchors whose library implementation fixes its operand layouts: XLA's
#: layout assignment canonicalises convolutions for oneDNN/XNNPACK (CPU) and
#: cuDNN (GPU) (NHWC activations, HWIO/OHWI filters, and the transposed
#: filter of the weight gradient) and inserts the transposes on purpose. A
#: transpose feeding one of these is the library's contract, not a gap that
#: dimension numbers could absorb. Dots are different: every backend's gemm
#: takes either operand transposed, so a transpose feeding only a dot is
#: avoidable.
LAYOUT_FIXED_ANCHORS = frozenset({"convolution"})


#: Asynchronous halves that move data between memory spaces on XLA:TPU
#: (memory-space assignment's prefetches into VMEM and evictions to HBM).
_STAGING_OPS = frozenset({"copy-start", "copy-done", "slice-start", "slice-done"})


def scoped_on_chip_bytes(inst: Instruction) -> int:
  """Bytes of on-chip memory a kernel reserves for itself beyond its
  operands: XLA:TPU's `used_scoped_memory_configs` outside memory space 0
  (its VMEM scratch); 0 where the backend config names none."""
  config = inst.backend_config
  if not config or '"used_scoped_memory_configs"' not in config:
    return 0
  try:
    used = json.loads(config).get("used_scoped_memory_configs") or ()
    return sum(int(c.get("size", 0)) for c in used if str(c.get("memory_space", "0")) != "0")
  except (ValueError, AttributeError, TypeError):
    return 0


def stages_memory_space(comp, inst: Instruction) -> bool:
  """Whether `inst` (of `comp`) is XLA:TPU's memory-space assignment moving
  a value between memory spaces: a copy or slice start/done whose result
  lies in another space (`S(n)`) than its source. Such a move is how XLA
  stages data into VMEM and evicts it back, not a copy the program asks for;
  a same-space async copy (XLA:GPU's) is a copy like any other."""
  if inst.opcode not in _STAGING_OPS or not inst.operands or inst.operands[0] not in comp:
    return False
  start = inst if inst.opcode.endswith("-start") else comp.instruction(inst.operands[0])
  parts = start.shape.tuple_shapes if start.shape is not None else ()
  if len(parts) < 2:
    return False
  # copy-start: (destination, source, context); slice-start: ((sources),
  # destination, context).
  dst, src = (parts[0], parts[1]) if start.opcode == "copy-start" else (parts[1], parts[0])
  leaf = lambda s: s.tuple_shapes[0] if s.element_type == "tuple" and s.tuple_shapes else s  # noqa: E731
  return leaf(src).memory_space != leaf(dst).memory_space


def moves_memory_space(comp, inst: Instruction) -> bool:
  """Whether a plain `copy` (of `comp`) writes its operand into another
  memory space (XLA:TPU copying a value it held in VMEM out to HBM)."""
  if inst.opcode != "copy" or not inst.operands or inst.operands[0] not in comp:
    return False
  src = comp.instruction(inst.operands[0]).shape
  return src is not None and inst.shape is not None and src.is_array and \
      inst.shape.is_array and src.memory_space != inst.shape.memory_space
