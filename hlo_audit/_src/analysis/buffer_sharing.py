"""When an output may take the memory of an operand it reads: XLA's
`CanShareBuffer`, per backend.

The buffer assigner and the heap simulator let an instruction's output start
in the memory of an operand that dies where the output is written, when the
instruction reads each element of that operand before writing the element of
the output in its place. XLA asks `HloDataflowAnalysis::CanShareBuffer`,
which consults the backend's hint first:

- the default (XLA:CPU has no hint): same shape and layout, and an in-place
  pair, an elementwise op, or a loop/input fusion whose parameter is used
  only elementwise up to the root (`AreTransitiveUsesElementwiseOrTuple`);
  the operand's value and the output sit at the same tuple index;
- XLA:GPU (`xla/service/gpu/buffer_sharing.cc`): any fusion, Triton ones and
  gemms included, when every path from the fused parameter to the output is
  elementwise (or a bitcast, a matching dynamic-slice of a dynamic-update-
  slice, a scatter's input, or ends at the hero reduction of a reduction
  fusion); the shapes may differ if element count and element size agree;
  one output of a multi-output fusion may take an operand's memory;
  all-reduce works in place; cuBLASLt's bias operand (beta != 0) is
  overwritten.

`sharing_rule(platform)` picks the rule; `infer_platform` tells XLA:GPU's
optimized HLO from other backends' when no capture says which it is.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable

from hlo_audit._src import compat
from hlo_audit._src.analysis import tuple_tables
from hlo_audit._src.analysis.backend_traits import fusion_config_kind
from hlo_audit._src.analysis.dataflow import in_place_pairs
from hlo_audit._src.analysis.heap_packing import DECREASING_ORDERS, PackingOrder
from hlo_audit._src.hlo import dtypes, opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction
from hlo_audit._src.target import tpus

#: (module, computation, user, operand number, operand's value index, user's
#: output index) -> whether that output may take that operand value's memory.
SharingRule = Callable[[HloModule, Computation, Instruction, int, tuple, tuple], bool]


def can_share_buffer(module: HloModule, comp: Computation, user: Instruction,
                     operand_number: int, operand_index: tuple[int, ...],
                     user_index: tuple[int, ...]) -> bool:
  """XLA's default rule (what XLA:CPU uses), for an operand value at the
  output's own index.

  After `HloDataflowAnalysis::CanShareBuffer`: same shape and layout, and
  either an in-place pair, an elementwise op, or a loop/input fusion in
  which the operand's parameter is only used elementwise up to the root.
  """
  if operand_index != user_index:
    return False
  index = user_index
  operand = comp.instruction(user.operands[operand_number])
  if operand.opcode == "constant":
    return False
  try:
    out_shape = user.shape.subshape(index) if user.shape is not None else None
    in_shape = operand.shape.subshape(index) if operand.shape is not None else None
  except IndexError:
    return False
  if out_shape is None or in_shape is None or out_shape != in_shape:
    return False
  for out_index, k, operand_index in in_place_pairs(user, module):
    if k == operand_number and out_index == index and operand_index == index:
      return True
  if user.opcode == "fusion":
    if user.fusion_kind not in ("kLoop", "kInput"):
      return False
    calls = user.called_computations.get("calls", ())
    if not calls or calls[0] not in module:
      return False
    return _uses_elementwise(module, module.computation(calls[0]), operand_number)
  return user.opcode in opcodes.ELEMENTWISE and user.opcode not in (
      "convert", "bitcast-convert", "reduce-precision")


def _uses_elementwise(module: HloModule, fused: Computation, parameter_number: int) -> bool:
  """XLA's AreTransitiveUsesElementwiseOrTuple for a fused parameter."""
  params = [p for p in fused.instructions if p.opcode == "parameter" and
            p.parameter_number == parameter_number]
  if not params:
    return False
  # (Asked of each operand of a fusion: its body's users are found once.)
  users = module._cached(("fused users", fused.name), lambda: _users(fused))
  stack = [params[0].name]
  seen = set()
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    for u in users.get(name, ()):
      if u.opcode == "tuple" or u.opcode in opcodes.ELEMENTWISE:
        stack.append(u.name)
      else:
        return False
  return True


def _users(comp: Computation) -> dict[str, list[Instruction]]:
  users: dict[str, list[Instruction]] = {}
  for inst in comp.instructions:
    for o in dict.fromkeys(inst.operands):  # an instruction reading x twice is one user
      users.setdefault(o, []).append(inst)
  return users


# ---------------------------------------------------------------- XLA:GPU ----

_CUBLAS_LT_MATMUL = "__cublas$lt$matmul"
_CHOLESKY = "__cusolver$cholesky"


def gpu_can_share_buffer(module: HloModule, comp: Computation, user: Instruction,
                         operand_number: int, operand_index: tuple[int, ...],
                         user_index: tuple[int, ...]) -> bool:
  """XLA:GPU's rule: in-place pairs, then its `CanShareBufferHint`, then the
  default for the ops the hint leaves to it."""
  operand = comp.instruction(user.operands[operand_number])
  if operand.opcode == "constant" or operand.shape is None or user.shape is None:
    return False
  try:
    in_shape = operand.shape.subshape(operand_index)
    out_shape = user.shape.subshape(user_index)
  except IndexError:
    return False
  equal = in_shape == out_shape
  if equal:
    for out_index, k, index in in_place_pairs(user, module):
      if k == operand_number and out_index == user_index and index == operand_index:
        return True
  hint = _gpu_hint(module, comp, user, operand_number, operand, user_index)
  if hint is not None:
    return hint
  if not equal:
    return False
  if user.opcode in ("while", "conditional"):
    return True
  if user.opcode in ("dynamic-update-slice", "scatter"):
    return [i for i, o in enumerate(user.operands) if o == operand.name] == [0]
  return (user.opcode in opcodes.ELEMENTWISE and
          not _changes_bit_width(user, comp))


def _changes_bit_width(inst: Instruction, comp: Computation) -> bool:
  """A bitcast-convert between element types of different widths (not
  elementwise for XLA)."""
  if inst.opcode != "bitcast-convert" or not inst.operands:
    return False
  src = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
  return (src is None or src.shape is None or inst.shape is None or
          dtypes.bits_of(src.shape.element_type) != dtypes.bits_of(inst.shape.element_type))


def _gpu_hint(module: HloModule, comp: Computation, user: Instruction, operand_number: int,
              operand: Instruction, user_index: tuple[int, ...]) -> bool | None:
  """XLA:GPU's `CanShareBufferHint`; None where it defers to the default."""
  op = user.opcode
  if op in ("all-reduce", "all-reduce-start"):
    return len(user.operands) == 1 or (
        len(user_index) == 1 and user_index[0] < len(user.operands) and
        user.operands[user_index[0]] == operand.name)
  if op == "custom-call":
    target = user.custom_call_target or ""
    if target == _CUBLAS_LT_MATMUL:
      config = user.backend_config_json() or {}
      gemm = config.get("gemm_backend_config", {}) if isinstance(config, dict) else {}
      beta = gemm.get("beta", 0) if isinstance(gemm, dict) else 0
      try:
        beta = float(beta)
      except (TypeError, ValueError):
        beta = 0.0
      return beta != 0.0 and operand_number == 2
    if target == _CHOLESKY:
      return user_index == (0,)
    return False
  if op == "fusion":
    return _fusion_hint(module, user, operand_number, operand, user_index)
  return None


def _fusion_hint(module: HloModule, user: Instruction, operand_number: int,
                 operand: Instruction, user_index: tuple[int, ...]) -> bool:
  """XLA:GPU's `FusionCanShareBufferHint`."""
  out_shape = user.shape.subshape(user_index)
  in_shape = operand.shape
  if in_shape != out_shape:
    if not in_shape.is_array or not out_shape.is_array:
      return False
    # The same iteration space and element size: another shape will do.
    if in_shape.num_elements != out_shape.num_elements or \
        _element_bytes(in_shape) != _element_bytes(out_shape):
      return False
  calls = user.called_computations.get("calls", ())
  if not calls or calls[0] not in module:
    return False
  fused = module.computation(calls[0])
  param = next((p for p in fused.instructions if p.opcode == "parameter" and
                p.parameter_number == operand_number), None)
  if param is None:
    return False
  root = fused.root
  output = root
  if root.opcode == "tuple":
    if not user_index or user_index[0] >= len(root.operands):
      return False
    output = fused.instruction(root.operands[user_index[0]])
  non_bitcast_root = output
  if non_bitcast_root.opcode == "bitcast" and non_bitcast_root.operands:
    non_bitcast_root = fused.instruction(non_bitcast_root.operands[0])
  hero = _reduction_hero(user, fused)
  users = _users(fused)
  queue = collections.deque([param])
  visited = {param.name}
  found = False
  while queue:
    h = queue.popleft()
    if h.name == output.name:
      found = True  # other users of the output still count
    if hero is not None and h.name == hero.name:
      continue  # the reduction is computed before any output is written
    for u in users.get(h.name, ()):
      if u.name not in visited:
        visited.add(u.name)
        queue.append(u)
      at = u.operands.index(h.name)
      if u.name == non_bitcast_root.name and u.opcode == "scatter":
        inputs = len(u.shape.tuple_shapes) if u.shape is not None and u.shape.is_tuple else 1
        if at < inputs and u.operands.count(h.name) == 1:
          continue
      if (non_bitcast_root.opcode == "dynamic-update-slice" and
          u.opcode == "dynamic-slice" and
          non_bitcast_root.operands[0] == u.operands[0] and
          len(non_bitcast_root.operands) > 1 and
          u.shape == fused.instruction(non_bitcast_root.operands[1]).shape):
        update = fused.instruction(non_bitcast_root.operands[1])
        if not (_effective_scalar(u) and _effective_scalar(update)):
          # The same slice read and written: no element is read after it is written.
          if any(u.operands[i] != non_bitcast_root.operands[i + 1]
                 for i in range(1, len(u.operands))
                 if i + 1 < len(non_bitcast_root.operands)):
            return False
      elif ((not _elementwise_on(module, u, at) or u.opcode == "copy") and
            u.opcode not in ("bitcast", "tuple") and
            (hero is None or u.name != hero.name)):
        if (u.name != non_bitcast_root.name or u.opcode != "dynamic-update-slice" or
            at != 1):
          return False
  if root.opcode == "tuple" and non_bitcast_root.opcode not in opcodes.ELEMENTWISE:
    # Another output reached by the parameter may be written in another order.
    if any(o != output.name and o in visited for o in root.operands):
      return False
  return found


def _element_bytes(shape) -> int:
  """XLA's ByteSizeOfPrimitiveType: storage bytes of one element."""
  return (dtypes.storage_bits_of(shape.element_type) + 7) // 8


def _effective_scalar(inst: Instruction) -> bool:
  return inst.shape is not None and inst.shape.is_array and inst.shape.num_elements == 1


def _elementwise_on(module: HloModule, inst: Instruction, operand_number: int) -> bool:
  """XLA's `IsElementwiseOnOperand`."""
  op = inst.opcode
  if op == "dynamic-update-slice":
    return operand_number == 0
  if op == "fusion":
    calls = inst.called_computations.get("calls", ())
    if not calls or calls[0] not in module:
      return False
    return _uses_elementwise(module, module.computation(calls[0]), operand_number)
  return op in opcodes.ELEMENTWISE


def _reduction_hero(user: Instruction, fused: Computation) -> Instruction | None:
  """The reduction a reduction fusion computes before its other outputs
  (XLA's `FindHeroReduction`): a reduce among the roots, through bitcasts."""
  if user.fusion_kind != "kInput" or fusion_config_kind(user):
    return None
  root = fused.root
  roots = [fused.instruction(o) for o in root.operands] if root.opcode == "tuple" else [root]
  for r in roots:
    while r.opcode == "bitcast" and r.operands:
      r = fused.instruction(r.operands[0])
    if r.opcode == "reduce":
      return r
  return None


# -------------------------------------------------------------- choosing ----


@dataclasses.dataclass(frozen=True, slots=True)
class HeapModel:
  """How one backend lets buffers share memory and sizes its heap."""

  #: May an output take a dying operand's memory (see the module docstring).
  can_share: SharingRule
  #: Only a buffer of one value may take over an operand's heap memory, and
  #: only an operand's buffer of one value (XLA's heap simulator); else any.
  strict_operand_sharing: bool = False
  #: Alignment of XLA's best-fit packing of the temporaries into one heap
  #: (heap_packing.py); None: the heap is the most bytes live at once.
  packing_alignment: int | None = None
  #: The orders that packing tries, the smallest heap kept.
  packing_orders: tuple[PackingOrder, ...] = DECREASING_ORDERS
  #: Copy insertion orders a donated parameter's reads before the write of
  #: its aliased output where the dataflow allows (control edges), copying
  #: it only where a read must follow the write (XLA:GPU); else every read
  #: not already ordered before the write reads a copy (XLA:CPU).
  reorders_for_donation: bool = False
  #: Constants are part of the executable (XLA:TPU's program), outside the
  #: device's footprint; else each is an allocation of its own.
  constants_in_program: bool = False
  #: Bytes of the pointer table of a tuple of n elements (tuple_tables.py).
  tuple_table_bytes: Callable[[int], int] = tuple_tables.pointer_table_bytes
  #: XLA:TPU's accounting: every tuple table is held for the whole program,
  #: and the heap's peak is the temp `memory_analysis()` reports, not the
  #: packed heap's size (liveness.tpu_reported_temp).
  tpu_temp: bool = False
  #: A temporary may take a live-out allocation while the output is not yet
  #: live (XLA's BufferAssigner); else every temporary is in the heap
  #: (XLA:TPU of libtpu 0.0.50: compat.libtpu_temporaries_share_outputs).
  temporaries_share_outputs: bool = True


#: XLA:CPU, and HLO whose backend is unknown: the model the CPU suite holds
#: within 1% of XLA's footprint.
DEFAULT_MODEL = HeapModel(can_share_buffer)
#: XLA:GPU: one preallocated temp allocation, packed by best fit; chunks
#: aligned to 256 bytes (the offsets of its buffer-assignment dumps).
GPU_MODEL = HeapModel(gpu_can_share_buffer, strict_operand_sharing=True,
                      packing_alignment=256, reorders_for_donation=True)


#: XLA:TPU: XLA:CPU's sharing and allocation reuse (the suite's v5e
#: compiles hold to 1% with it), its constants in the program, its temp
#: packed by best fit in definition order at the 16 KiB its programs align
#: HBM to (`--xla_jf_program_hbm_alignment_in_kib`), its tuple tables a
#: v5e's (`heap_model` sizes them for the generation).
TPU_MODEL = HeapModel(can_share_buffer, constants_in_program=True, packing_alignment=16384,
                      packing_orders=(PackingOrder.DEFINITION,),
                      tuple_table_bytes=functools.partial(tpus.tuple_table_bytes, ""),
                      tpu_temp=True)


@functools.cache
def heap_model(platform: str, device: str = "", libtpu: str = "") -> HeapModel:
  """The model of the backend that compiled the module ("gpu", "tpu",
  "cpu", ""). `device`: the TPU generation it was compiled for ("v5e", a
  topology, or what jax calls the device), which sizes XLA:TPU's tuple
  tables; where it is unknown ("": HLO text names none), a v5e's.
  `libtpu`: the version of the libtpu that compiled it ("": unknown)."""
  if platform in ("gpu", "cuda", "rocm"):
    return GPU_MODEL
  if platform != "tpu":
    return DEFAULT_MODEL
  return dataclasses.replace(
      TPU_MODEL, tuple_table_bytes=functools.partial(tpus.tuple_table_bytes, device),
      temporaries_share_outputs=compat.libtpu_temporaries_share_outputs(libtpu))


def sharing_rule(platform: str) -> SharingRule:
  """The buffer-sharing rule of the backend that compiled the module."""
  return heap_model(platform).can_share


#: Backend-config keys and custom-call target prefixes only XLA:GPU writes.
_GPU_MARKS = ('"operation_queue_id"', "__triton", "__cublas", "__cudnn")
#: Backend-config keys only XLA:TPU writes (its kernels' windows and cycle
#: estimates), and its kernels' custom-call target.
_TPU_MARKS = ('"window_config"', '"estimated_cycles"', '"tpu_custom_call"')


def infer_platform(module: HloModule) -> str:
  """"gpu" when the module is XLA:GPU's optimized HLO (its backend configs
  name operation queues, Triton fusions, cuBLAS or cuDNN), "tpu" when it is
  XLA:TPU's (backend configs with kernel windows or cycle estimates, or a
  Mosaic kernel), else ""."""
  text = module.text
  marks = _GPU_MARKS + _TPU_MARKS
  if text is not None and not any(mark in text for mark in marks):
    return ""  # none of the marks anywhere: no instruction to decode
  tpu = False
  for comp in module.computations:
    for inst in comp.instructions:
      config = inst.backend_config
      target = inst.custom_call_target
      if config and any(mark in config for mark in _GPU_MARKS) or \
          target and target.startswith(("__cublas", "__cudnn")):
        return "gpu"
      tpu = tpu or bool(config and any(mark in config for mark in _TPU_MARKS)) or \
          target == "tpu_custom_call"
  return "tpu" if tpu else ""
