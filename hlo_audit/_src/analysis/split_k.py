"""XLA:GPU's split-K gemms: the partial sums a Triton gemm writes to memory.

XLA:GPU splits a gemm's K dimension when its (default, not autotuned) tiles
leave too few CTAs: the gemm fusion writes `f32[k, M, N]` partial sums and a
second kernel sums them over dimension 0 with a `*.reduce_sub_computation`
reducer (`backend_traits.is_split_k_reduce`), often with the dot's epilogue.
The partial sums are the gemm's workspace, k times its result: a kernel that
replaces the gemm without splitting K (a Pallas matmul, a gemm XLA's
autotuner keeps whole) writes only the `[M, N]` result. What-if replays
model that as `unsplit` (replay.py).
"""

from __future__ import annotations

import dataclasses

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.program import Program, buffer_name


@dataclasses.dataclass(frozen=True, slots=True)
class SplitK:
  """One gemm's split-K partial sums, as the audited program holds them."""

  #: The buffer of partial sums (a `Buffer` name, e.g. "gemm_fusion_dot.16").
  partials: str
  #: The gemm kernel writing them, and the kernels summing them.
  gemm: str
  readers: tuple[str, ...]
  #: k: how many partial sums of the result the buffer holds.
  splits: int
  #: Bytes of the partial sums, and of the summed result ([M, N]).
  bytes: int
  result_bytes: int


def split_k_partials(program: Program) -> dict[str, SplitK]:
  """The program's split-K partial sums, by buffer name (made once per
  program)."""
  found = program.cache.get("split_k")
  if found is None:
    found = program.cache["split_k"] = _find(program)
  return found


def _find(program: Program) -> dict[str, SplitK]:
  found: dict[str, SplitK] = {}
  module = program.module
  for k in program.kernels.values():
    if "reduce" not in k.fused_ops:
      continue
    inst = program.inst(k)
    calls = inst.called_computations.get("calls", ())
    if inst.opcode != "fusion" or not calls or calls[0] not in module:
      continue
    fused = module.computation(calls[0])
    params = {p.name: p.parameter_number for p in fused.parameters}
    for reduce in fused.instructions:
      if not bt.is_split_k_reduce(reduce):
        continue
      operand = fused.instruction(reduce.operands[0])
      while operand.opcode == "bitcast":  # the partials, seen as [k, M, N]
        operand = fused.instruction(operand.operands[0])
      result = reduce.shape.num_elements
      if operand.name not in params or not result:
        continue
      splits = operand.shape.num_elements // result
      outer = inst.operands[params[operand.name]]
      for _, vid in program.dataflow.holds.get(outer, ()):
        buf = program.buffers.get(buffer_name(program.dataflow.buffer_of.get(vid, vid)))
        if buf is None or not buf.producer or splits < 2:
          continue
        seen = found.get(buf.name)
        readers = seen.readers if seen is not None else ()
        found[buf.name] = SplitK(
            partials=buf.name, gemm=buf.producer,
            readers=readers + ((k.name,) if k.name not in readers else ()),
            splits=splits, bytes=buf.bytes,
            result_bytes=_result_bytes(program, fused, reduce))
  return found


def _result_bytes(program: Program, fused, reduce) -> int:
  """Bytes of the gemm's result in the program's dtype: the partial sums
  are float32 whatever the dot's type, and a bf16 dot's sum is converted
  right after the reduce (a kernel replacing the gemm writes bf16)."""
  users = program.users(fused, reduce.name)
  if (len(users) == 1 and users[0].opcode == "convert"
      and users[0].shape.num_elements == reduce.shape.num_elements):
    return users[0].shape.byte_size
  return reduce.shape.byte_size
