"""What a finding's anchor looks like in the HLO: the facts a kernel library
needs to write a call with the user's shapes.

Pure functions over the parsed module. The matmul a boundary is written or
read by (its operands, dimension numbers and result), the arrays an
instruction reads, and the epsilon of a module's norms; kernel libraries read
these through `hlo_audit.plugins` instead of walking the IR themselves.
"""

from __future__ import annotations

import dataclasses

from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction


@dataclasses.dataclass(frozen=True, slots=True)
class ArraySpec:
  """An array as HLO types it: element type and dimensions."""

  #: XLA's element type, e.g. "f32", "bf16", "s8".
  dtype: str
  dims: tuple[int, ...]

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass(frozen=True, slots=True)
class MatmulAnchor:
  """A dot (or a library GEMM call) as the HLO holds it."""

  lhs: ArraySpec
  rhs: ArraySpec
  #: The result's dimensions (() when the HLO does not say).
  result: tuple[int, ...]
  #: Dimension numbers; None for a library call (operands 0 and 1 are then
  #: [M,K] and [K,N]).
  lhs_contracting: tuple[int, ...] | None = None
  rhs_contracting: tuple[int, ...] | None = None
  lhs_batch: tuple[int, ...] = ()
  rhs_batch: tuple[int, ...] = ()


def parse_array(text: str) -> ArraySpec:
  """"f32[64,128]" -> ArraySpec("f32", (64, 128)); layouts are ignored."""
  dt, _, rest = text.partition("[")
  rest = rest.split("]", 1)[0]
  return ArraySpec(dt, tuple(int(d) for d in rest.split(",") if d.strip()))


def _find_dot(module: HloModule, comp: Computation, inst: Instruction
              ) -> tuple[Computation, Instruction] | None:
  if inst.opcode == "dot":
    return comp, inst
  if inst.opcode == "fusion":
    return _fused(module, inst, "dot")
  if inst.opcode == "custom-call" and len(inst.operands) >= 2:
    return comp, inst  # A library GEMM: operands 0 and 1, [M,K] x [K,N].
  return None


def _fused(module: HloModule, fusion: Instruction, opcode: str
           ) -> tuple[Computation, Instruction] | None:
  """The first `opcode` instruction a fusion runs (nested fusions too)."""
  stack = list(fusion.called_computations.get("calls", ()))
  while stack:
    name = stack.pop()
    if name not in module:
      continue
    fused = module.computation(name)
    for i in fused.instructions:
      if i.opcode == opcode:
        return fused, i
      if i.opcode == "fusion":
        stack.extend(i.called_computations.get("calls", ()))
  return None


def _spec(comp: Computation, name: str) -> ArraySpec:
  shape = comp.instruction(name).shape
  return ArraySpec(shape.element_type, tuple(shape.dims))


def matmul_anchor(module: HloModule, computation: str,
                  kernel: str) -> MatmulAnchor | None:
  """The matmul inside kernel `kernel` of `computation` (a dot, a fusion
  holding one, or a library GEMM call), or None when it holds none.

  Raises:
    KeyError: if the computation or the kernel is not in the module.
  """
  comp = module.computation(computation)
  found = _find_dot(module, comp, comp.instruction(kernel))
  if found is None:
    return None
  dcomp, dot = found
  lhs, rhs = (_spec(dcomp, o) for o in dot.operands[:2])
  out = dot.shape
  if out is not None and out.is_tuple and out.tuple_shapes:
    out = out.tuple_shapes[0]  # A library call's result beside its workspace.
  result = tuple(out.dims) if out is not None and out.is_array else ()
  if dot.opcode != "dot":
    # A cuBLAS call holds its dot's dimension numbers in its backend config
    # (dy @ w^T contracts both operands' dimension 1).
    gemm = (dot.backend_config_json() or {}).get("gemm_backend_config")
    numbers = gemm.get("dot_dimension_numbers") if isinstance(gemm, dict) else None
    if not isinstance(numbers, dict):
      return MatmulAnchor(lhs, rhs, result)
    try:
      dims = [tuple(int(d) for d in numbers.get(f"{side}_{kind}_dimensions", ()))
              for side, kind in (("lhs", "contracting"), ("rhs", "contracting"),
                                 ("lhs", "batch"), ("rhs", "batch"))]
    except (TypeError, ValueError):
      return MatmulAnchor(lhs, rhs, result)
    return MatmulAnchor(lhs, rhs, result, *dims)
  dn = dot.dot_dimension_numbers
  if dn is None:
    return MatmulAnchor(lhs, rhs, result)
  return MatmulAnchor(lhs, rhs, result, tuple(dn.lhs_contracting), tuple(dn.rhs_contracting),
                      tuple(dn.lhs_batch), tuple(dn.rhs_batch))


@dataclasses.dataclass(frozen=True, slots=True)
class ConvolutionAnchor:
  """A 2-D (or N-D) convolution as its forward computes it, x (*) w -> y,
  whichever of the three the instruction reads and writes: XLA's
  `convolution`, or a cuDNN call (a forward call reads x and w; a backward
  input call reads dy and w and writes dx; a backward filter call reads x and
  dy and writes dw, all in the forward's `dim_labels` and window)."""

  #: "forward", "backward_input" or "backward_filter": what the call writes.
  role: str
  #: x as [N, spatial..., C] (NHWC for 2-D).
  input: ArraySpec
  #: w as [spatial..., C / groups, F] (HWIO for 2-D).
  kernel: ArraySpec
  #: y as [N, spatial..., F].
  output: ArraySpec
  stride: tuple[int, ...]
  #: (low, high) zeros the window reads beyond x, per spatial dimension.
  padding: tuple[tuple[int, int], ...]
  #: The window's dilation (`rhs_dilate`), per spatial dimension.
  dilation: tuple[int, ...]
  #: Holes between x's elements (`lhs_dilate`: a transposed convolution).
  input_dilation: tuple[int, ...]
  #: `feature_group_count` (C for a depthwise convolution).
  groups: int


#: cuDNN's convolution calls by what they write (operands in the forward's
#: labels: forward (x, w[, bias, side]); backward input (dy, w); filter (x, dy)).
_CUDNN_ROLES = (("__cudnn$convBackwardInput", "backward_input"),
                ("__cudnn$convBackwardFilter", "backward_filter"),
                ("__cudnn$conv", "forward"))


def convolution_anchor(module: HloModule, computation: str,
                       kernel: str) -> ConvolutionAnchor | None:
  """The convolution inside kernel `kernel` of `computation` (XLA's
  `convolution`, a fusion holding one, or a cuDNN call), or None when it
  holds none or one this reading does not cover (a batch group count, a
  window reversed).

  Raises:
    KeyError: if the computation or the kernel is not in the module.
  """
  comp = module.computation(computation)
  found = _find_convolution(module, comp, comp.instruction(kernel))
  if found is None:
    return None
  ccomp, conv, role = found
  dn, window = conv.convolution_dimension_numbers, conv.window
  if dn is None or len(conv.operands) < 2 or (conv.attribute("batch_group_count") or "1") != "1":
    return None
  shape = conv.shape
  if shape is not None and shape.is_tuple:
    shape = shape.tuple_shapes[0] if shape.tuple_shapes else None
  if shape is None or not shape.is_array:
    return None
  a, b = (ccomp.instruction(o).shape for o in conv.operands[:2])
  if a is None or b is None or not a.is_array or not b.is_array:
    return None
  written = ArraySpec(shape.element_type, tuple(shape.dims))
  first, second = ArraySpec(a.element_type, tuple(a.dims)), ArraySpec(b.element_type, tuple(b.dims))
  x, w, y = {"forward": (first, second, written),
             "backward_input": (written, second, first),
             "backward_filter": (first, written, second)}[role]
  spatial = len(dn.input_spatial)
  window = tuple(window or ())
  if len(window) != spatial or any(d.window_reversal for d in window):
    return None
  try:
    groups = int(conv.attribute("feature_group_count") or "1")
  except ValueError:
    return None

  def order(spec: ArraySpec, axes) -> ArraySpec:
    return ArraySpec(spec.dtype, tuple(spec.dims[i] for i in axes))

  return ConvolutionAnchor(
      role=role,
      input=order(x, (dn.input_batch, *dn.input_spatial, dn.input_feature)),
      kernel=order(w, (*dn.kernel_spatial, dn.kernel_input_feature, dn.kernel_output_feature)),
      output=order(y, (dn.output_batch, *dn.output_spatial, dn.output_feature)),
      stride=tuple(d.stride for d in window),
      padding=tuple((d.padding_low, d.padding_high) for d in window),
      dilation=tuple(d.window_dilation for d in window),
      input_dilation=tuple(d.base_dilation for d in window),
      groups=groups)


def _find_convolution(module: HloModule, comp: Computation, inst: Instruction
                      ) -> tuple[Computation, Instruction, str] | None:
  if inst.opcode == "convolution":
    return comp, inst, "forward"
  if inst.opcode == "custom-call":
    target = inst.custom_call_target or ""
    role = next((r for prefix, r in _CUDNN_ROLES if target.startswith(prefix)), None)
    return (comp, inst, role) if role is not None else None
  found = _fused(module, inst, "convolution") if inst.opcode == "fusion" else None
  return (*found, "forward") if found is not None else None


def pad_widths(module: HloModule, computation: str,
               kernel: str) -> tuple[ArraySpec, tuple[tuple[int, int], ...]] | None:
  """The one `pad` kernel `kernel` runs (itself or fused): its operand and
  the (low, high) zeros it adds per dimension; None when it runs none, more
  than one, or one with interior padding.

  Raises:
    KeyError: if the computation or the kernel is not in the module.
  """
  comp = module.computation(computation)
  inst = comp.instruction(kernel)
  where, pads = comp, [inst] if inst.opcode == "pad" else []
  if inst.opcode == "fusion":
    calls = inst.called_computations.get("calls", ())
    if calls and calls[0] in module:
      where = module.computation(calls[0])
      pads = [i for i in where.instructions if i.opcode == "pad"]
  if len(pads) != 1 or not pads[0].operands:
    return None
  config = pads[0].padding
  src = where.instruction(pads[0].operands[0]).shape
  if config is None or src is None or not src.is_array or any(d.interior for d in config):
    return None
  return (ArraySpec(src.element_type, tuple(src.dims)),
          tuple((d.low, d.high) for d in config))


def operand_arrays(module: HloModule, computation: str, name: str) -> tuple[ArraySpec, ...]:
  """The arrays instruction `name` of `computation` reads, in operand order
  (tuples and tokens left out).

  Raises:
    KeyError: if the computation or the instruction is not in the module.
  """
  comp = module.computation(computation)
  out = []
  for o in comp.instruction(name).operands:
    s = comp.instruction(o).shape
    if s is not None and s.is_array:
      out.append(ArraySpec(s.element_type, tuple(s.dims)))
  return tuple(out)


#: Ops that carry a value unchanged in meaning between a norm's epsilon
#: and its rsqrt (XLA leaves copies and bitcasts between them, e.g.
#: `rsqrt(copy(bitcast(add(var, broadcast(constant(1e-05))))))`).
_CARRIERS = ("bitcast", "copy", "convert", "reshape", "broadcast")


def _skip_carriers(comp: Computation, inst: Instruction) -> Instruction:
  while inst.opcode in _CARRIERS and inst.operands and inst.operands[0] in comp:
    inst = comp.instruction(inst.operands[0])
  return inst


#: The last module `norm_epsilon` scanned, and its answer (a library asks
#: once per finding of one audit).
_last_eps: tuple[HloModule | None, float | None] = (None, None)


def norm_epsilon(module: HloModule) -> float | None:
  """The epsilon of the module's norms: the constant added before an rsqrt,
  when the module has exactly one such value (XLA puts the rsqrt in another
  fusion than the reduction, so the module is searched); None when it has
  none or several (never a guess printed as a fact)."""
  global _last_eps
  if _last_eps[0] is module:
    return _last_eps[1]
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
  eps = found.pop() if len(found) == 1 else None
  _last_eps = (module, eps)
  return eps


def forget(module: HloModule) -> None:
  """Drops what `norm_epsilon` keeps of `module` (the audit calls this when
  its suggestions are written, so no module outlives its audit here)."""
  global _last_eps
  if _last_eps[0] is module:
    _last_eps = (None, None)
