"""Suggested kernel calls: every finding a `pallas_kernels` op closes gets a
ready-to-paste call with the finding's shapes and dtypes, and the op's guard
verdict for them.

A pure function over the findings and the module: shapes and dtypes come from
the anchor (the dot inside the producer or consumer kernel, its operands and
dimension numbers) and the boundary buffer. The guard verdict needs JAX and
`pallas_kernels`, imported lazily here, so the parser and the analyses still
import without JAX; without them the verdict says so.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from hlo_audit._src.analysis.records import FindingKind, FusionDecisionRecord
from hlo_audit._src.hlo import dtypes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction, Shape

#: What the verdict says where the guard cannot be asked.
UNAVAILABLE = "guard not evaluated: pallas_kernels unavailable"

_CLASSES = (FindingKind.UNFUSED_EPILOGUE, FindingKind.UNFUSED_PROLOGUE,
            FindingKind.SEPARATE_REDUCTION)


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
  """A suggested call: op, arguments (name, dtype, dims or a Python value)."""

  op: str
  #: (name, "f32", dims) for arrays, in call order; positional first.
  arrays: tuple[tuple[str, str, tuple[int, ...], bool], ...]
  #: Other keyword arguments: (name, Python source text, value for the guard).
  options: tuple[tuple[str, str, object], ...]
  result: str

  def text(self) -> str:
    args = [name if positional else f"{name}={name}"
            for name, _, _, positional in self.arrays]
    args += [f"{k}={text}" for k, text, _ in self.options]
    shapes = ", ".join(f"{name}: {dt}[{','.join(map(str, dims))}]"
                       for name, dt, dims, _ in self.arrays)
    return f"pallas_kernels.{self.op}({', '.join(args)})  # {shapes} -> {self.result}"


def add_suggestions(findings: tuple[FusionDecisionRecord, ...],
                    module: HloModule) -> tuple[FusionDecisionRecord, ...]:
  """`findings` with `suggestion` and `guard_verdict` filled where a
  `pallas_kernels` op closes the finding."""
  out = []
  eps = functools.cache(lambda: _eps(module))  # one scan of the module, if any
  verdicts: dict[_Call, str] = {}  # (a model's layers repeat the same calls)
  for f in findings:
    call = None
    if f.kind in _CLASSES and f.kernel:
      try:
        call = _suggest(f, module, eps)
      except (KeyError, IndexError, ValueError):
        call = None  # An anchor this module does not let us read.
    if call is None:
      out.append(f)
      continue
    verdict = verdicts.get(call)
    if verdict is None:
      verdict = verdicts[call] = _verdict(call)
    out.append(dataclasses.replace(f, suggestion=call.text(), guard_verdict=verdict))
  return tuple(out)


# ---------------------------------------------------------------- anchors ----


def _inst(module: HloModule, comp: str, name: str) -> tuple[Computation, Instruction]:
  c = module.computation(comp)
  return c, c.instruction(name)


def _find_dot(module: HloModule, comp: Computation, inst: Instruction
              ) -> tuple[Computation, Instruction] | None:
  if inst.opcode == "dot":
    return comp, inst
  if inst.opcode == "fusion":
    stack = list(inst.called_computations.get("calls", ()))
    while stack:
      name = stack.pop()
      if name not in module:
        continue
      fused = module.computation(name)
      for i in fused.instructions:
        if i.opcode == "dot":
          return fused, i
        if i.opcode == "fusion":
          stack.extend(i.called_computations.get("calls", ()))
  if inst.opcode == "custom-call" and len(inst.operands) >= 2:
    return comp, inst  # A library GEMM: operands 0 and 1, [M,K] x [K,N].
  return None


def _shape_of(comp: Computation, name: str) -> Shape:
  return comp.instruction(name).shape


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
  """"f32[64,128]" -> ("f32", (64, 128))."""
  dt, _, rest = text.partition("[")
  dims = tuple(int(d) for d in rest.rstrip("]").split(",") if d.strip())
  return dt, dims


def _dot_call(module: HloModule, f: FusionDecisionRecord, anchor_name: str,
              anchor_comp: str) -> tuple[dict, list, tuple[int, ...]] | None:
  """x/w arrays, options and result dims of the dot in kernel `anchor_name`."""
  comp, inst = _inst(module, anchor_comp, anchor_name)
  found = _find_dot(module, comp, inst)
  if found is None:
    return None
  dcomp, dot = found
  lhs, rhs = (_shape_of(dcomp, o) for o in dot.operands[:2])
  dn = dot.dot_dimension_numbers if dot.opcode == "dot" else None
  nb = len(dn.lhs_batch) if dn else 0
  options = []
  if dn is not None:
    if tuple(dn.lhs_batch) != tuple(range(nb)) or tuple(dn.rhs_batch) != tuple(range(nb)):
      return None
    if dn.lhs_contracting and dn.lhs_contracting[0] == len(lhs.dims) - 2:
      options.append(("transpose_x", "True", True))
    if dn.rhs_contracting and dn.rhs_contracting[0] == len(rhs.dims) - 1:
      options.append(("transpose_w", "True", True))
  out = dot.shape
  result_dims = tuple(out.dims) if out is not None and out.is_array else ()
  arrays = {"x": (lhs.element_type, tuple(lhs.dims)), "w": (rhs.element_type, tuple(rhs.dims))}
  return arrays, options, result_dims


def _suggest(f: FusionDecisionRecord, module: HloModule,
             module_eps: Callable[[], float | None] | None = None) -> _Call | None:
  op = f.kernel.rsplit(".", 1)[-1]
  bdt, bdims = _parse_shape(f.boundary_shape)
  if op == "matmul" and f.kind is FindingKind.UNFUSED_EPILOGUE:
    found = _dot_call(module, f, f.producer, f.computation)
    if found is None:
      return None
    arrays, options, rdims = found
    rdims = rdims or bdims
    n = rdims[-1]
    out = [("x", *arrays["x"], True), ("w", *arrays["w"], True)]
    result_dt = bdt
    for item in f.ops:
      base, _, arg = item.partition(":")
      if base == "bias":
        out.append(("bias", bdt, (n,), False))
      elif base == "scale":
        options.append(("scale", "scale", 1.0))
      elif base == "residual":
        out.append(("residual", bdt, rdims, False))
      elif base == "activation" and arg:
        options.append(("activation", repr(arg), arg))
      elif base == "clamp":
        options.append(("clamp", "(lo, hi)", (-1.0, 1.0)))
      elif base == "cast" and arg:
        name = dtypes.NUMPY_NAMES.get(arg, arg)
        options.append(("out_dtype", f"jnp.{name}", name))
        result_dt = arg
      elif base == "quantize" and arg:
        name = dtypes.NUMPY_NAMES.get(arg, arg)
        options.append(("quantize", repr(name), name))
    return _Call("matmul", tuple(out), tuple(options),
                 f"{result_dt}[{','.join(map(str, rdims))}]")
  if op == "matmul" and f.kind is FindingKind.UNFUSED_PROLOGUE and f.consumers:
    found = _dot_call(module, f, f.consumers[0], f.computation)
    if found is None:
      return None
    arrays, options, rdims = found
    comp, producer = _inst(module, f.computation, f.producer)
    src = [_shape_of(comp, o) for o in producer.operands]
    src = [s for s in src if s is not None and s.is_array and tuple(s.dims) == bdims]
    side = "w" if arrays["w"][1] == bdims and arrays["x"][1] != bdims else "x"
    if src:
      arrays[side] = (src[0].element_type, bdims)
    out = [("x", *arrays["x"], True), ("w", *arrays["w"], True)]
    if any(i.startswith("dequantize") for i in f.ops):
      options.append((f"{side}_scale", f"{side}_scale", 1.0))
    return _Call("matmul", tuple(out), tuple(options),
                 f"{bdt if side == 'x' else arrays['x'][0]}[{','.join(map(str, rdims))}]")
  if op in ("layer_norm", "rms_norm", "softmax") and bdims:
    n = bdims[-1]
    arrays = [("x", bdt, bdims, True)]
    options = []
    if op != "softmax":
      arrays.append(("gamma", bdt, (n,), True))
      if op == "layer_norm":
        arrays.append(("beta", bdt, (n,), True))
      eps = module_eps() if module_eps else _eps(module)
      if eps is None:  # none, or several: never print a guess as a fact
        options.append(("eps", "EPS", 1e-6))
      else:
        options.append(("eps", repr(eps), eps))
    return _Call(op, tuple(arrays), tuple(options), f.boundary_shape)
  return None


#: Ops that carry a value unchanged in meaning between a norm's epsilon
#: and its rsqrt (XLA leaves copies and bitcasts between them, e.g.
#: `rsqrt(copy(bitcast(add(var, broadcast(constant(1e-05))))))`).
_CARRIERS = ("bitcast", "copy", "convert", "reshape", "broadcast")


def _skip_carriers(comp: Computation, inst: Instruction) -> Instruction:
  while inst.opcode in _CARRIERS and inst.operands and inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  return inst


def _eps(module: HloModule) -> float | None:
  """The epsilon of the module's norms: the constant added before an rsqrt,
  when the module has exactly one such value (XLA puts the rsqrt in another
  fusion than the reduction, so the module is searched)."""
  found = set()
  for comp in module.computations:
    for i in comp.instructions:
      if i.opcode != "rsqrt" or not i.operands:
        continue
      add = _skip_carriers(comp, comp.instruction(i.operands[0]))
      for o in add.operands if add.opcode == "add" else ():
        c = _skip_carriers(comp, comp.instruction(o))
        if c.opcode == "constant" and c.literal:
          try:
            value = float(c.literal.strip().strip("{}"))
          except ValueError:
            continue
          if 0 < value < 0.1:
            found.add(value)
  return found.pop() if len(found) == 1 else None


# ---------------------------------------------------------------- verdict ----


def _verdict(call: _Call) -> str:
  """The op's guard on the call's shapes, asked through pallas_kernels."""
  try:
    import jax
    import jax.numpy as jnp

    import pallas_kernels
  except ImportError:
    return UNAVAILABLE
  try:
    def spec(dt, dims):
      return jax.ShapeDtypeStruct(dims, jnp.dtype(dtypes.NUMPY_NAMES.get(dt, dt)))

    positional = [spec(dt, dims) for _, dt, dims, pos in call.arrays if pos]
    keywords = {name: spec(dt, dims) for name, dt, dims, pos in call.arrays if not pos}
    # Scales are stand-in values: the guard looks at shapes and dtypes.
    keywords.update((k, value) for k, _, value in call.options)
    check = pallas_kernels.check_guard(call.op, *positional, **keywords)
  except (TypeError, ValueError) as e:
    return f"guard not evaluated: {e}"
  mode = ", interpret mode" if check.interpret else ""
  if check.runs:
    return f"kernel runs (guard passes on {check.backend}{mode})"
  return f"falls back to XLA on {check.backend}{mode}: {check.reason}"
