"""The layer that made an op, read off JAX's name stack.

JAX writes each op's name stack into its `op_name` metadata:
`jit(train_step)/transpose(jvp(Model))/MoE/router/dot_general` is the
`dot_general` of flax's `Model/MoE/router` in the backward pass;
`jit(make_step)/jvp(vmap(eqx.nn.MLP))/eqx.nn.Linear/dot_general` equinox's
`Linear` inside its `MLP`; a keras layer pushes its name the same way. When
the model lives in a library, the user's source line is the call of the
whole model (`model.apply(...)`, `model(tokens)`): the name stack says which
layer inside it.

The layer is the name stack without the outer `jit(...)`, the primitive at
its end, transformation wrappers (`jvp(...)`, `transpose(...)`, `vmap(...)`,
`remat`, `checkpoint`: their inner name is kept), control flow (`while`,
`body`, `cond`, `branch_N`, `closed_call`), inner `jit(...)` functions
(`jit(silu)`: a function, not a layer) and einsum specs (`vmap(BTNH,BSNH->
BNTS)`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from hlo_audit._src.analysis.program import Program
from hlo_audit._src.analysis.records import FusionDecisionRecord, with_changes

#: Wrappers JAX's transformations put around a name; the name inside is kept.
_WRAPPERS = ("jvp", "transpose", "vmap", "pmap", "xmap", "remat", "checkpoint",
             "custom_jvp_call", "custom_vjp_call", "shard_map", "pjit")
#: Name-stack parts of control flow and JAX's own plumbing, not layers.
_PLUMBING = re.compile(r"^(while|body|cond|branch_\d+|closed_call|core_call|checkpoint|"
                       r"rematted_computation|remat|scan|fori_loop|main|~|"
                       r"custom_jvp_call|custom_vjp_call|pjit|shard_map|)$")
_WRAPPED = re.compile(r"^([\w.]+)\((.*)\)$", re.S)


def _split(stack: str) -> list[str]:
  """`stack` split at the slashes outside parentheses."""
  parts, depth, cur = [], 0, []
  for ch in stack:
    if ch == "/" and depth == 0:
      parts.append("".join(cur))
      cur = []
      continue
    depth += (ch == "(") - (ch == ")")
    cur.append(ch)
  parts.append("".join(cur))
  return parts


def _unwrap(part: str) -> list[str]:
  """The layer names one name-stack part holds: `transpose(jvp(MoE))` ->
  ["MoE"]; `jit(silu)`, an einsum spec or plumbing -> []."""
  m = _WRAPPED.match(part)
  while m is not None and m.group(1) in _WRAPPERS:
    part = m.group(2)
    m = _WRAPPED.match(part)
  if m is not None:  # jit(f) inside the step, or an unknown call: a function
    return []
  if not part or _PLUMBING.match(part) or "," in part or "->" in part or "(" in part:
    return []
  # An inner wrapper's own stack (`vmap(a/b)`) splits again.
  if "/" in part:
    return [name for p in _split(part) for name in _unwrap(p)]
  return [part]


@functools.lru_cache(maxsize=16384)
def layer_of(op_name: str) -> str:
  """The layer path in `op_name`'s name stack, "" where it names none:
  "jit(train_step)/transpose(jvp(Model))/MoE/router/dot_general" ->
  "Model/MoE/router"."""
  if not op_name:
    return ""
  # Fused ops join their names with ';': the first is the kernel's own.
  parts = _split(op_name.split(";", 1)[0].strip())
  if parts and parts[0].startswith("jit("):
    parts = parts[1:]  # the jitted function itself
  parts = parts[:-1]  # the primitive
  names = [name for p in parts for name in _unwrap(p)]
  return "/".join(names)


def with_layers(findings: Iterable[FusionDecisionRecord],
                program: Program) -> tuple[FusionDecisionRecord, ...]:
  """`findings`, each naming the layer that made its boundary (the boundary
  buffer's op_name, else its producer kernel's)."""
  out = []
  for f in findings:
    b = program.buffers.get(f.boundary)
    k = program.kernels.get(f.producer)
    op_name = _output_op_name(program, k, b.index) if k is not None and b is not None else ""
    if not op_name:
      op_name = b.op_name if b is not None and b.op_name else k.op_name if k is not None else ""
    layer = layer_of(op_name)
    out.append(with_changes(f, layer=layer) if layer else f)
  return tuple(out)


def _output_op_name(program: Program, k, index: tuple[int, ...]) -> str:
  """The op_name of what writes output `index` of a multi-output fusion (its
  root tuple's operand), "" for other kernels: the fusion's own op_name is
  its first output's, and its other outputs may come from another layer."""
  if not index:
    return ""
  inst = program.inst(k)
  names = inst.called_computations.get("calls", ())
  if inst.opcode != "fusion" or len(names) != 1 or names[0] not in program.module:
    return ""
  fused = program.module.computation(names[0])
  root = fused.root
  if root.opcode != "tuple" or index[0] >= len(root.operands):
    return ""
  part = root.operands[index[0]]
  return fused.instruction(part).op_name if part in fused else ""
