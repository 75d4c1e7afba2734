"""Detectors: find the boundaries XLA left, as fusion decision records.

One detector per finding class; each reads the IR and earlier analyses and
returns records (no printing, no state). `find_findings` runs them all.

What the epilogue and prologue detectors recognise is read from the fused
computations: the JAX primitive names XLA keeps in `op_name` metadata (add,
mul, erf, tanh, logistic, convert_element_type, ...) where present, the
opcodes otherwise.
"""

from __future__ import annotations

import collections

import dataclasses
from collections.abc import Mapping

from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis import source as source_mod
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.buffers import (Buffer, Lifetime,
                                             expanded_broadcast_ratio,
                                             fused_root, is_layout_conversion)
from hlo_audit._src.analysis.dataflow import Dataflow
from hlo_audit._src.analysis.kernel_registry import kernel_for
from hlo_audit._src.analysis.kernels import Kernel
from hlo_audit._src.analysis.records import (FindingKind, FusionDecisionRecord,
                                             NumericalClass, Verdict)
from hlo_audit._src.analysis.schedule import Schedule
from hlo_audit._src.hlo import dtypes, opcodes
from hlo_audit._src.hlo.ir import Computation, HloModule, Instruction


@dataclasses.dataclass(frozen=True, slots=True)
class AuditOptions:
  """Thresholds of the audit; one frozen value instead of module constants."""

  #: Buffers at least this fraction of peak memory make the intermediate-
  #: tensor table (the method says 1%).
  intermediate_fraction: float = 0.01
  #: Findings saving fewer bytes than this are dropped (noise).
  min_bytes_saved: int = 4096
  #: A buffer read by at least this many kernels is "worth keeping".
  keep_min_consumers: int = 2
  #: Keep-reuse records only for buffers at least this fraction of peak.
  keep_fraction: float = 0.01
  #: Regexes of source paths that are not the user's code (searched in the
  #: '/'-separated path): a finding cites the innermost frame outside them.
  library_paths: tuple[str, ...] = source_mod.DEFAULT_LIBRARY_PATHS
  #: Regexes of source paths that are the user's even where `library_paths`
  #: match (e.g. your own package installed in site-packages).
  user_paths: tuple[str, ...] = source_mod.DEFAULT_USER_PATHS


@dataclasses.dataclass(frozen=True, slots=True)
class _Context:
  module: HloModule
  schedule: Schedule
  dataflow: Dataflow
  kernels: Mapping[str, Kernel]
  buffers: Mapping[str, Buffer]
  #: kernel name -> buffers it writes.
  writes: Mapping[str, tuple[Buffer, ...]]
  comps: Mapping[str, Computation]
  options: AuditOptions
  peak_bytes: int
  has_backward: bool
  #: kernel name -> primitives it runs (filled on first use).
  _primitives: dict = dataclasses.field(default_factory=dict)
  #: computation -> instruction name -> its users (filled on first use).
  _users: dict = dataclasses.field(default_factory=dict)

  def users(self, comp: Computation, name: str) -> list[Instruction]:
    """Instructions of `comp` that read `name`, in text order."""
    table = self._users.get(comp.name)
    if table is None:
      table = self._users[comp.name] = {}
      for i in comp.instructions:
        for o in dict.fromkeys(i.operands):
          table.setdefault(o, []).append(i)
    return table.get(name, [])

  def inst(self, kernel: Kernel) -> Instruction:
    return self.comps[kernel.computation].instruction(kernel.name)

  def primitives(self, kernel: Kernel) -> frozenset[str]:
    """JAX primitives (or opcodes) a kernel runs, fused ones included."""
    found = self._primitives.get(kernel.name)
    if found is None:
      fused = _fused(self, kernel)
      insts = fused.instructions if fused is not None else (self.inst(kernel),)
      found = self._primitives[kernel.name] = frozenset(_primitive(i) for i in insts)
    return found


def find_findings(module: HloModule, schedule: Schedule, dataflow: Dataflow,
                  kernels: tuple[Kernel, ...], buffers: tuple[Buffer, ...],
                  peak_bytes: int, options: AuditOptions = AuditOptions()
                  ) -> tuple[FusionDecisionRecord, ...]:
  """All findings, largest saving first within each class."""
  by_kernel: dict[str, list[Buffer]] = {}
  for b in buffers:
    if b.producer:
      by_kernel.setdefault(b.producer, []).append(b)
  ctx = _Context(
      module=module, schedule=schedule, dataflow=dataflow,
      kernels={k.name: k for k in kernels},
      buffers={b.name: b for b in buffers},
      writes={k: tuple(v) for k, v in by_kernel.items()},
      comps={n: module.computation(n) for n in schedule.span},
      options=options, peak_bytes=peak_bytes,
      has_backward=any("transpose(" in k.op_name for k in kernels))
  found: list[FusionDecisionRecord] = []
  layout = _layout_conflicts(ctx)
  layout_boundaries = {r.boundary for r in layout}
  found += [r for r in _standalone_copies(ctx) if r.boundary not in layout_boundaries]
  found += layout
  found += _expanded_broadcasts(ctx)
  epilogues, fused = _epilogues(ctx)
  found += epilogues
  found += [r for r in _prologues(ctx) if r.boundary not in layout_boundaries]
  found += _separate_reductions(ctx)
  found += _keep_reuse(ctx)
  found += fused
  order = list(FindingKind)
  found = [r for r in found if r.bytes_saved >= options.min_bytes_saved or
           r.kind in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED)]
  found.sort(key=lambda r: (order.index(r.kind), -r.bytes_saved, r.boundary))
  return tuple(found)


# ------------------------------------------------------------- helpers ----


def _trip(k: Kernel) -> int | None:
  return k.trip_count


def _times(n: int, trip: int | None) -> int:
  return n * (trip if trip is not None else 1)


def _consumer_kernels(ctx: _Context, buf: Buffer) -> list[Kernel]:
  return [ctx.kernels[c] for c in buf.consumers if c in ctx.kernels]


def _anchor(ctx: _Context, k: Kernel) -> str | None:
  """"dot" or "convolution" when the kernel is a matrix-multiply anchor."""
  inst = ctx.inst(k)
  if k.kind is KernelKind.PALLAS:
    return None
  if inst.opcode in ("dot", "ragged-dot", "scaled-dot") or bt.is_gemm_call(inst):
    return "dot"
  if inst.opcode == "convolution" or bt.is_conv_call(inst):
    return "convolution"
  if inst.opcode == "fusion":
    ops = k.fused_ops
    if "dot" in ops or "scaled-dot" in ops:
      return "dot"
    if "convolution" in ops:
      return "convolution"
  return None


def _anchor_fused_epilogue(ctx: _Context, k: Kernel) -> tuple[str, ...]:
  """Elementwise work XLA already fused after the anchor inside the kernel."""
  inst = ctx.inst(k)
  epilogue = bt.gemm_epilogue(inst) if inst.opcode == "custom-call" else None
  if epilogue:
    return bt.GEMM_EPILOGUES.get(epilogue, (epilogue.lower(),))
  if inst.opcode != "fusion":
    return ()
  found = fused_root(ctx.module, inst)
  if found is None:
    return ()
  comp, root = found
  if root.opcode in ("dot", "convolution", "bitcast", "copy", "tuple"):
    return ()
  return tuple(sorted({_primitive(i) for i in _path_to_anchor(comp, root)} - {""}))


def _path_to_anchor(comp: Computation, root: Instruction) -> list[Instruction]:
  out = []
  stack = [root]
  seen = set()
  while stack:
    i = stack.pop()
    if i.name in seen or i.opcode in ("dot", "convolution", "parameter", "constant"):
      continue
    seen.add(i.name)
    out.append(i)
    stack.extend(comp.instruction(o) for o in i.operands)
  return out


def _primitive(inst: Instruction) -> str:
  """The JAX primitive behind an instruction (from op_name), else opcode."""
  name = inst.op_name
  if name:
    leaf = name.rsplit("/", 1)[-1]
    if leaf:
      return leaf
  return inst.opcode


def _fused(ctx: _Context, k: Kernel) -> Computation | None:
  inst = ctx.inst(k)
  calls = inst.called_computations.get("calls", ())
  if inst.opcode != "fusion" or not calls or calls[0] not in ctx.module:
    return None
  return ctx.module.computation(calls[0])


def _operand_number(ctx: _Context, consumer: Kernel, buf: Buffer) -> int | None:
  inst = ctx.inst(consumer)
  for k, operand in enumerate(inst.operands):
    for idx, vid in ctx.dataflow.holds.get(operand, ()):
      if vid == (buf.instruction, buf.index):
        return k
  return None


def _layouts(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, str]:
  """(operand layout, result layout) of a copy-like kernel."""
  src = _layout_of(ctx, inst.operands[0], k.computation) if inst.operands else "{}"
  dst = str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else "{}"
  return src, dst


def _layout_of(ctx: _Context, name: str, computation: str | None = None) -> str:
  if computation is not None and name in ctx.comps[computation]:
    shape = ctx.comps[computation].instruction(name).shape
    return str(shape.layout) if shape is not None and shape.layout is not None else "{}"
  for comp in ctx.comps.values():
    if name in comp:
      shape = comp.instruction(name).shape
      if shape is not None and shape.layout is not None:
        return str(shape.layout)
  return "{}"


def _kernel_desc(k: Kernel) -> str:
  return f"{k.kind.value} {k.name}" + (f" ({k.detail})" if k.detail and k.detail != k.opcode else "")


_COMMON_RISKS = ("compile time: a larger kernel compiles slower",
                 "debuggability: one fused kernel is harder to inspect")


# ------------------------------------------------------ class 1: copies ----


def _standalone_copies(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  for k in ctx.kernels.values():
    if k.kind is KernelKind.PALLAS:
      continue
    inst = ctx.inst(k)
    if not (k.kind is KernelKind.COPY or is_layout_conversion(ctx.module, inst)):
      continue
    for buf in ctx.writes.get(k.name, ()):
      if buf.internal:
        continue
      consumers = _consumer_kernels(ctx, buf)
      op_layout, out_layout = _layouts(ctx, k, inst)
      converts = "convert" in k.fused_ops or inst.opcode == "convert"
      what = "dtype conversion" if converts and op_layout == out_layout else "layout change"
      consumer_desc = ", ".join(c.name for c in consumers) or "the program's output"
      elementwise_users = consumers and all(
          c.kind in (KernelKind.LOOP_FUSION, KernelKind.INPUT_FUSION) for c in consumers)
      out.append(FusionDecisionRecord(
          kind=FindingKind.STANDALONE_COPY, producer=k.name,
          consumers=tuple(c.name for c in consumers), boundary=buf.name,
          boundary_shape=buf.shape, bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="index arithmetic in the consumers' loads",
          extra_resources="none expected",
          numerical_class=NumericalClass.EXACT,
          guard="none needed: consumers keep their XLA fusions",
          layout_effect=(f"consumers read {op_layout} directly instead of the "
                         f"{out_layout} copy"),
          evidence=(f"XLA runs {_kernel_desc(k)} as its own kernel: a {what} "
                    f"{op_layout} -> {out_layout} of {buf.shape} written to memory "
                    f"and read by {consumer_desc}"),
          verdict=Verdict.SAFE if elementwise_users else Verdict.RISKY,
          reasons=(("layout interpretation in the consumer's loads "
                    "(same-index elements, permuted)",) if elementwise_users else
                   ("a data layout the next major operation may not use efficiently",)),
          risks=("memory coalescing: permuted loads in the consumer may break "
                 "vectorized access",
                 "cache reuse: several consumers would each re-permute") + _COMMON_RISKS,
          ops=(what,), kernel=None, trip_count=_trip(k), source=buf.source,
          computation=k.computation))
  return out


# ---------------------------------------------- class 2: layout conflicts ----


def _layout_conflicts(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  for k in ctx.kernels.values():
    if k.kind is KernelKind.PALLAS:
      continue
    inst = ctx.inst(k)
    conversion = k.kind is KernelKind.COPY or is_layout_conversion(ctx.module, inst)
    if not conversion:
      continue
    for buf in ctx.writes.get(k.name, ()):
      if buf.internal:
        continue
      consumers = _consumer_kernels(ctx, buf)
      src_layout, dst_layout = _layouts(ctx, k, inst)
      transposes = src_layout != dst_layout or "transpose" in k.fused_ops or \
          inst.opcode == "transpose"
      # (a) converted and converted back.
      back = [c for c in consumers if _converts_back(ctx, k, c)]
      # (b) a copy on a loop boundary.
      on_loop = _on_loop_boundary(ctx, k, buf)
      # (c) a transpose feeding a dot that dimension numbers could absorb.
      anchors = [c for c in consumers if _anchor(ctx, c)] if transposes else []
      if not (anchors or back or on_loop):
        continue
      if back:
        detail = (f"{buf.shape} is converted by {k.name} and converted back by "
                  f"{', '.join(c.name for c in back)}")
        reasons = ("a value converted and converted back: both kernels can go",)
        kernel = None
      elif on_loop:
        detail = f"{k.name} copies {buf.shape} on a while-loop boundary ({on_loop})"
        reasons = ("a copy on a loop boundary: loop state could keep one buffer",)
        kernel = None
      else:
        detail = (f"{k.name} changes the layout of {buf.shape} only for "
                  f"{', '.join(a.name for a in anchors)} "
                  f"({_anchor(ctx, anchors[0])}), whose dimension numbers could "
                  "read the original layout")
        reasons = ("layout interpretation: the matmul reads the operand transposed in place",)
        kernel = "pallas_kernels.matmul"
      out.append(FusionDecisionRecord(
          kind=FindingKind.LAYOUT_CONFLICT, producer=k.name,
          consumers=tuple(c.name for c in consumers), boundary=buf.name,
          boundary_shape=buf.shape, bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="none: the reader indexes the original layout",
          extra_resources="none expected",
          numerical_class=NumericalClass.EXACT,
          guard=("pallas_kernels.matmul falls back to XLA's dot outside its guard"
                 if kernel else "none needed"),
          layout_effect=f"the consumer reads {src_layout} instead of {dst_layout}",
          evidence=f"XLA materialized a layout conversion: {detail}",
          verdict=Verdict.SAFE, reasons=reasons,
          risks=("layout reverse impact: check the backward pass for new transposes",
                 "memory coalescing of the transposed read") + _COMMON_RISKS,
          ops=("transpose",) if transposes else ("copy",), kernel=kernel,
          trip_count=_trip(k), source=buf.source, computation=k.computation))
  return out


def _converts_back(ctx: _Context, first: Kernel, second: Kernel) -> bool:
  """`first` converts dtype a -> b and `second` converts its result back to a."""
  a, b = ctx.inst(first), ctx.inst(second)
  if not (is_layout_conversion(ctx.module, a) and is_layout_conversion(ctx.module, b)):
    return False
  if not a.operands or a.shape is None or b.shape is None or not a.shape.is_array:
    return False
  src = ctx.comps[first.computation].instruction(a.operands[0]).shape
  return (src is not None and src.is_array and
          src.element_type == b.shape.element_type != a.shape.element_type and
          src.dims == b.shape.dims)


def _on_loop_boundary(ctx: _Context, k: Kernel, buf: Buffer) -> str:
  """"init" if the copy feeds a while's init, "state" if it feeds a body root."""
  comp = ctx.comps[k.computation]
  for u in ctx.users(comp, k.name):
    if u.opcode == "tuple":
      tuple_users = ctx.users(comp, u.name)
      if any(t.opcode == "while" for t in tuple_users):
        return "copied into the loop's initial state"
      if u.name == comp.root_name and _is_loop_body(ctx, comp.name):
        return "copied into the loop state each iteration"
    if u.opcode == "while":
      return "copied into the loop's initial state"
  if comp.root_name == k.name and _is_loop_body(ctx, comp.name):
    return "copied into the loop state each iteration"
  del buf
  return ""


def _is_loop_body(ctx: _Context, comp_name: str) -> bool:
  for comp in ctx.comps.values():
    for i in comp.instructions:
      if i.opcode == "while" and comp_name in i.called_computations.get("body", ()):
        return True
  return False


# ------------------------------------------- class 3: expanded broadcasts ----


def _expanded_broadcasts(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  for buf in ctx.buffers.values():
    if buf.lifetime is not Lifetime.EXPANDED_BROADCAST or buf.internal:
      continue
    k = ctx.kernels.get(buf.producer)
    if k is None:
      continue
    inst = ctx.inst(k)
    ratio = expanded_broadcast_ratio(ctx.module, inst, buf.index)
    compact = int(buf.bytes / ratio)
    consumers = _consumer_kernels(ctx, buf)
    out.append(FusionDecisionRecord(
        kind=FindingKind.EXPANDED_BROADCAST, producer=k.name,
        consumers=tuple(c.name for c in consumers), boundary=buf.name,
        boundary_shape=buf.shape,
        bytes_saved=_times(2 * (buf.bytes - compact), _trip(k)),
        launches_removed=_times(1, _trip(k)),
        extra_arithmetic="broadcast index math in each consumer's loads",
        extra_resources=f"the compact value ({compact} bytes) per tile",
        numerical_class=NumericalClass.EXACT,
        guard="none needed: consumers broadcast on load",
        layout_effect="none: consumers read the compact value",
        evidence=(f"{_kernel_desc(k)} writes {buf.shape} ({buf.bytes} bytes), an "
                  f"{ratio:.0f}x expansion of a {compact}-byte value, read by "
                  f"{', '.join(c.name for c in consumers) or 'nothing'}"),
        verdict=Verdict.SAFE, reasons=("broadcast scalars or vectors",),
        risks=("cache reuse: each consumer re-broadcasts",) + _COMMON_RISKS,
        ops=("broadcast",), kernel=None, trip_count=_trip(k), source=buf.source,
        computation=k.computation))
  return out


# ------------------------------------------------ class 4: epilogues ----


def _epilogue_work(ctx: _Context, consumer: Kernel, operand: int,
                   anchor_buf: Buffer) -> tuple[str, ...] | None:
  """What `consumer` does to its operand `operand` (the anchor's output), as
  epilogue items ("bias", "activation:gelu", "residual", "cast:bf16", ...);
  None when it does more than elementwise work on it."""
  inst = ctx.inst(consumer)
  if inst.opcode in opcodes.ELEMENTWISE and inst.opcode != "copy":
    comp = ctx.comps[consumer.computation]
    return _classify_elementwise(comp, [inst], {}, anchor_buf)
  fused = _fused(ctx, consumer)
  if fused is None or consumer.kind not in (KernelKind.LOOP_FUSION,):
    return None
  params = {p.parameter_number: p for p in fused.parameters}
  if operand not in params:
    return None
  # Everything reachable from the anchor's parameter must be elementwise (or
  # shape-only: bitcast/reshape/broadcast of other operands is fine).
  users: dict[str, list[Instruction]] = {}
  for i in fused.instructions:
    for o in i.operands:
      users.setdefault(o, []).append(i)
  chain: list[Instruction] = []
  stack = [params[operand].name]
  seen = set()
  while stack:
    name = stack.pop()
    for u in users.get(name, ()):
      if u.name in seen:
        continue
      seen.add(u.name)
      if u.opcode in opcodes.ELEMENTWISE or u.opcode in (
          "bitcast", "reshape", "tuple", "transpose"):
        chain.append(u)
        stack.append(u.name)
      else:
        return None
  return _classify_elementwise(fused, chain, params, anchor_buf,
                               anchor_param=params[operand].name)


def _classify_elementwise(comp: Computation, chain: list[Instruction],
                          params: Mapping[int, Instruction],
                          anchor_buf: Buffer, anchor_param: str = "") -> tuple[str, ...]:
  names = {_primitive(i) for i in chain}
  opcodes_ = {i.opcode for i in chain}
  items: list[str] = []
  # The anchor's own value and everything computed from it are not "other"
  # operands (a bias or residual comes from elsewhere).
  chain_names = {i.name for i in chain} | {anchor_param}
  out_dims = anchor_buf.dims
  # Bias, residual and scale act on the anchor's value itself (or on a bias
  # or scale of it) as that value's only use, with an operand from outside
  # the chain. Ops past a value used twice belong to the activation: GELU's
  # x * 0.7071 and 0.5 * x * erf(..) are not scales.
  chain_uses: dict[str, int] = collections.Counter(
      o for i in chain for o in set(i.operands))
  direct = {anchor_param}
  changed = True
  while changed:
    changed = False
    for i in chain:
      if i.name in direct or i.opcode not in (
          "add", "subtract", "multiply", "bitcast", "reshape", "convert"):
        continue
      inputs = [o for o in i.operands if o in chain_names]
      if len(inputs) == 1 and inputs[0] in direct and chain_uses[inputs[0]] == 1:
        direct.add(i.name)
        changed = True
  # Bias / residual: an add whose other operand does not come from the chain.
  for i in chain:
    if i.opcode not in ("add", "subtract") or i.name not in direct:
      continue
    for o in i.operands:
      if o in chain_names or o not in comp:
        continue
      other = comp.instruction(o)
      if other.opcode == "broadcast" and other.operands:
        src = comp.instruction(other.operands[0]) if other.operands[0] in comp else None
        if src is not None and src.opcode in ("parameter", "constant") and \
            src.shape is not None and src.shape.num_elements < max(1, _prod(out_dims)):
          items.append("bias")
      elif other.opcode == "constant":
        items.append("bias")
      elif other.opcode == "parameter" and other.shape is not None and \
          other.shape.num_elements == _prod(out_dims):
        items.append("residual")
  # Scale: a multiply by a non-constant scalar or vector operand; a product
  # with another full-size tensor is not an epilogue a matmul kernel takes.
  for i in chain:
    if i.opcode != "multiply" or i.name not in direct:
      continue
    for o in i.operands:
      if o in chain_names or o not in comp:
        continue
      other = comp.instruction(o)
      base = other
      while base.opcode in ("broadcast", "bitcast", "reshape") and base.operands:
        base = comp.instruction(base.operands[0])
      if base.opcode == "constant":
        items.append("scale")
      elif base.opcode == "parameter" and base.shape is not None:
        if base.shape.num_elements < _prod(out_dims):
          items.append("scale")
        else:
          items.append("product")
  activation = _activation(names, opcodes_, comp, chain)
  if activation:
    items.append(f"activation:{activation}")
  if "clamp" in opcodes_ or ("maximum" in opcodes_ and "minimum" in opcodes_):
    items.append("clamp")
  if "transpose" in opcodes_:
    items.append("transpose")
  converts = [i for i in chain if i.opcode == "convert" and i.shape is not None]
  for c in converts:
    t = c.shape.element_type
    if dtypes.is_integral(t) or t.startswith("f8"):
      items.append(f"quantize:{t}")
    elif t != anchor_buf.dtype:
      items.append(f"cast:{t}")
  return tuple(dict.fromkeys(items)) or ("elementwise",)


def _activation(names: set[str], ops: set[str], comp: Computation,
                chain: list[Instruction]) -> str | None:
  if names & {"erf", "erfc"} or "erf" in ops:
    return "gelu"
  if "tanh" in names or "tanh" in ops:
    if names & {"integer_pow", "pow"} or sum(i.opcode == "multiply" for i in chain) >= 3:
      return "gelu_tanh"
    return "tanh"
  sigmoid = _sigmoid_input(comp, chain)
  if sigmoid is not None:
    by_name = {i.name: i for i in chain}
    gated = any(i.opcode == "multiply" and sigmoid[0] in i.operands
                and sigmoid[1] in i.operands for i in by_name.values())
    return "silu" if gated else "sigmoid"
  for i in chain:
    if i.opcode == "maximum":
      for o in i.operands:
        if o in comp and _is_zero(comp, comp.instruction(o)):
          return "relu"
  return None


def _sigmoid_input(comp: Computation,
                   chain: list[Instruction]) -> tuple[str, str] | None:
  """(x, sigmoid(x)) when the chain computes a sigmoid: `logistic(x)`, or
  JAX's `1 / (1 + exp(-x))` as jax.nn.silu lowers it."""
  def base(name: str) -> Instruction | None:
    inst = comp.instruction(name) if name in comp else None
    while inst is not None and inst.opcode in ("bitcast", "reshape") and inst.operands:
      inst = comp.instruction(inst.operands[0]) if inst.operands[0] in comp else None
    return inst

  for i in chain:
    if i.opcode == "logistic" and i.operands:
      return i.operands[0], i.name
    if i.opcode != "divide" or len(i.operands) != 2:
      continue
    den = base(i.operands[1])
    if den is None or den.opcode != "add":
      continue
    for o in den.operands:
      e = base(o)
      if e is not None and e.opcode == "exponential" and e.operands:
        n = base(e.operands[0])
        if n is not None and n.opcode == "negate" and n.operands:
          return n.operands[0], i.name
  return None


def _is_zero(comp: Computation, inst: Instruction) -> bool:
  while inst.opcode in ("broadcast", "bitcast") and inst.operands:
    inst = comp.instruction(inst.operands[0])
  return inst.opcode == "constant" and (inst.literal or "").strip() in ("0", "-0", "0.0")


def _prod(dims) -> int:
  n = 1
  for d in dims:
    n *= max(d, 0)
  return n


def _epilogues(ctx: _Context) -> tuple[list[FusionDecisionRecord], list[FusionDecisionRecord]]:
  out: list[FusionDecisionRecord] = []
  already: list[FusionDecisionRecord] = []
  for k in ctx.kernels.values():
    anchor = _anchor(ctx, k)
    if anchor is None:
      continue
    inst = ctx.inst(k)
    fused_work = _anchor_fused_epilogue(ctx, k)
    if fused_work:
      already.append(_already_fused(ctx, k, anchor, fused_work))
    for buf in ctx.writes.get(k.name, ()):
      if buf.lifetime in (Lifetime.EXTERNAL_OUTPUT, Lifetime.WORKSPACE) or buf.internal:
        continue
      consumers = _consumer_kernels(ctx, buf)
      if len(consumers) != 1:
        continue
      consumer = consumers[0]
      operand = _operand_number(ctx, consumer, buf)
      if operand is None:
        continue
      work = _epilogue_work(ctx, consumer, operand, buf)
      if work is None:
        continue
      kernel_ops = tuple(w.split(":")[0] if w.startswith(("cast", "quantize")) else w
                         for w in work)
      kernel = kernel_for(FindingKind.UNFUSED_EPILOGUE, anchor, kernel_ops)
      low_precision = buf.dtype in ("bf16", "f16") or buf.dtype.startswith("f8")
      epilogue = bt.gemm_epilogue(inst)
      evidence = (f"{_kernel_desc(k)} writes its {anchor} result {buf.shape} to memory; "
                  f"{_kernel_desc(consumer)} reads it once to apply "
                  f"{', '.join(work)}")
      if epilogue is not None:
        evidence += f"; the library call's epilogue is {epilogue}"
      elif k.kind is KernelKind.CPU_LIBRARY_FUSION:
        evidence += "; the CPU library fusion (XNNPACK/oneDNN) takes the matmul alone"
      reasons = ["current element only (elementwise epilogue)"]
      if "bias" in work or "scale" in work:
        reasons.append("broadcast scalars or vectors (row/column parameters)")
      if "residual" in work:
        reasons.append("same-index tensors (the residual)")
      verdict = Verdict.SAFE
      if any(w.startswith("quantize") for w in work):
        reasons.append("per-row quantization scales need a full-row reduction "
                       "across output tiles (cross-tile communication)")
        verdict = Verdict.RISKY
      risks = ["register count: the epilogue's live values add to the accumulator's"]
      if any(w.startswith("activation") for w in work):
        risks.append("register spills: erf/tanh polynomials are long; check SASS")
      risks.append("store coalescing: the fused store must stay vectorized")
      if ctx.has_backward:
        risks.append("backward complexity: the fused op needs a custom VJP "
                     "(dAct fused with the bias gradient)")
      risks += list(_COMMON_RISKS)
      out.append(FusionDecisionRecord(
          kind=FindingKind.UNFUSED_EPILOGUE, producer=k.name,
          consumers=(consumer.name,), boundary=buf.name, boundary_shape=buf.shape,
          bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="none: the epilogue's elementwise ops move into the "
                           "matmul's store",
          extra_resources=_resources(work),
          numerical_class=(NumericalClass.MORE_PRECISE if low_precision
                           else NumericalClass.SAME_OPS),
          guard=(f"{kernel} runs XLA's reference outside its shape/dtype rules"
                 if kernel else "no kernel covers all of this epilogue"),
          layout_effect=f"none: the result keeps layout {str(inst.shape.layout) if inst.shape is not None and inst.shape.layout else '{}'}",
          evidence=evidence, verdict=verdict, reasons=tuple(reasons),
          risks=tuple(risks), ops=work, kernel=kernel, trip_count=_trip(k),
          source=buf.source, computation=k.computation))
  return out, already


def _resources(work: tuple[str, ...]) -> str:
  parts = []
  if "bias" in work:
    parts.append("one bias vector tile")
  if "scale" in work:
    parts.append("the scale tile")
  if "residual" in work:
    parts.append("one residual tile read in the epilogue")
  if any(w.startswith("activation") for w in work):
    parts.append("activation temporaries per element")
  return ", ".join(parts) or "none expected"


def _already_fused(ctx: _Context, k: Kernel, anchor: str,
                   work: tuple[str, ...]) -> FusionDecisionRecord:
  inst = ctx.inst(k)
  epilogue = bt.gemm_epilogue(inst)
  if epilogue:
    evidence = f"{inst.custom_call_target} with epilogue={epilogue} fuses {', '.join(work)}"
  else:
    evidence = f"{_kernel_desc(k)} computes the {anchor} and {', '.join(work)} in one kernel"
  shape = inst.shape.dtype_str if inst.shape is not None else ""
  return FusionDecisionRecord(
      kind=FindingKind.ALREADY_FUSED, producer=k.name, consumers=(),
      boundary="", boundary_shape=shape, bytes_saved=0, launches_removed=0,
      extra_arithmetic="none", extra_resources="none",
      numerical_class=NumericalClass.SAME_OPS, guard="n/a",
      layout_effect="none", evidence=evidence, verdict=Verdict.KEEP,
      reasons=("XLA already fused this epilogue",), risks=(), ops=work,
      kernel=None, trip_count=_trip(k), source=k.source, computation=k.computation)


# ------------------------------------------------ class 5: prologues ----


def _prologues(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  for k in ctx.kernels.values():
    if k.kind not in (KernelKind.LOOP_FUSION, KernelKind.UNFUSED_OP, KernelKind.COPY):
      continue
    inst = ctx.inst(k)
    for buf in ctx.writes.get(k.name, ()):
      if buf.lifetime in (Lifetime.EXTERNAL_OUTPUT, Lifetime.EXPANDED_BROADCAST) \
          or buf.internal:
        continue
      consumers = _consumer_kernels(ctx, buf)
      if len(consumers) != 1:
        continue
      anchor_k = consumers[0]
      anchor = _anchor(ctx, anchor_k)
      if anchor is None:
        continue
      work = _prologue_work(ctx, k, inst)
      if work is None:
        continue
      kernel = kernel_for(FindingKind.UNFUSED_PROLOGUE, anchor,
                          tuple(w.split(":")[0] for w in work))
      out.append(FusionDecisionRecord(
          kind=FindingKind.UNFUSED_PROLOGUE, producer=k.name,
          consumers=(anchor_k.name,), boundary=buf.name, boundary_shape=buf.shape,
          bytes_saved=_times(2 * buf.bytes, _trip(k)),
          launches_removed=_times(1, _trip(k)),
          extra_arithmetic="the conversion runs on each loaded tile (once per "
                           "reuse of the tile in the matmul)",
          extra_resources="converted operand tile in registers/shared memory",
          numerical_class=NumericalClass.SAME_OPS,
          guard=(f"{kernel} runs XLA's reference outside its shape/dtype rules"
                 if kernel else "no kernel covers this prologue"),
          layout_effect="none: the matmul reads the original operand",
          evidence=(f"{_kernel_desc(k)} writes {buf.shape} ({', '.join(work)}) "
                    f"that only {_kernel_desc(anchor_k)} reads"),
          verdict=Verdict.SAFE,
          reasons=("type conversion/dequantization of the current element",
                   "broadcast scalars or vectors (scales)"),
          risks=("load coalescing of the narrower input",
                 "reuse within tile: the conversion repeats per reuse") + _COMMON_RISKS,
          ops=work, kernel=kernel, trip_count=_trip(k), source=buf.source,
          computation=k.computation))
  return out


def _prologue_work(ctx: _Context, k: Kernel, inst: Instruction) -> tuple[str, ...] | None:
  ops = dict(k.fused_ops) if inst.opcode == "fusion" else {inst.opcode: 1}
  allowed = {"convert", "multiply", "bitcast", "reshape", "broadcast", "transpose",
             "copy", "constant", "subtract", "bitcast-convert"}
  if not ops or not set(ops) <= allowed:
    return None
  if "convert" not in ops and "multiply" not in ops and "transpose" not in ops:
    return None
  src_types = set()
  for o in inst.operands:
    shape = ctx.comps[k.computation].instruction(o).shape
    if shape is not None and shape.is_array:
      src_types.add(shape.element_type)
  items = []
  narrow = {t for t in src_types if dtypes.is_integral(t) or t.startswith("f8")}
  if narrow and "multiply" in ops:
    items.append(f"dequantize:{sorted(narrow)[0]}")
  elif "convert" in ops:
    items.append("cast")
  elif "multiply" in ops:
    items.append("scale")
  if "transpose" in ops:
    items.append("transpose")
  return tuple(items) or None


# ------------------------------------------ class 6: separate reductions ----


def _separate_reductions(ctx: _Context) -> list[FusionDecisionRecord]:
  """Buffers a separate reduction kernel re-reads: one record per buffer,
  naming every reduction that reads it."""
  readers: dict[str, list[Kernel]] = {}
  for r in ctx.kernels.values():
    inst = ctx.inst(r)
    is_reduction = inst.opcode == "reduce" or (
        "reduce" in r.fused_ops and not {"dot", "convolution"} & set(r.fused_ops)
        and r.kind is not KernelKind.PALLAS)
    if not is_reduction:
      continue
    for operand in inst.operands:
      for _, vid in ctx.dataflow.holds.get(operand, ()):
        name = vid[0] + ("{" + ",".join(map(str, vid[1])) + "}" if vid[1] else "")
        lst = readers.setdefault(name, [])
        if r not in lst:
          lst.append(r)
  out = []
  for name, reductions in readers.items():
    buf = ctx.buffers.get(name)
    if buf is None or not buf.producer or buf.internal or buf.lifetime is Lifetime.INPUT:
      continue
    producer = ctx.kernels.get(buf.producer)
    if producer is None or producer in reductions:
      continue
    names = {r.name for r in reductions}
    others = [c for c in buf.consumers if c not in names]
    only = not others and len(reductions) == 1
    pattern = None
    for r in reductions:
      pattern = pattern or _reduction_pattern(ctx, r, producer)
    kernel = kernel_for(FindingKind.SEPARATE_REDUCTION, pattern, ()) if pattern else None
    trip = producer.trip_count
    saved = 2 * buf.bytes if only else buf.bytes * len(reductions)
    out.append(FusionDecisionRecord(
        kind=FindingKind.SEPARATE_REDUCTION, producer=producer.name,
        consumers=tuple(r.name for r in reductions) + tuple(others),
        boundary=buf.name, boundary_shape=buf.shape,
        bytes_saved=_times(saved, trip),
        launches_removed=_times(1 if only else 0, trip),
        extra_arithmetic="per-tile partial reductions in the producer, and a "
                         "small final combine",
        extra_resources="one partial-accumulator row per tile",
        numerical_class=NumericalClass.REASSOCIATED,
        guard=(f"{kernel} runs XLA's reference outside its guard"
               if kernel else "keep XLA's reduction when tiles cannot span the axis"),
        layout_effect="none",
        evidence=(f"{', '.join(_kernel_desc(r) for r in reductions)} re-read"
                  f"{'s' if len(reductions) == 1 else ''} {buf.shape} written by "
                  f"{_kernel_desc(producer)}" +
                  (f"; {len(others)} other kernel(s) read it too" if others else
                   "; no other kernel reads it")),
        verdict=Verdict.SAFE if only else Verdict.RISKY,
        reasons=(("tile-local partial reductions",) if only else
                 ("tile-local partial reductions",
                  "other readers keep the buffer: only the re-reads go")),
        risks=("numerical: reassociated sums change the last bits",
               "shared/local memory for partials may lower occupancy") + _COMMON_RISKS,
        ops=(pattern or "reduce",), kernel=kernel, trip_count=trip,
        source=buf.source, computation=producer.computation))
  return out


def _reduction_pattern(ctx: _Context, r: Kernel, producer: Kernel) -> str | None:
  """"layer_norm", "rms_norm" or "softmax" when the reduction belongs to one."""
  names = set(ctx.primitives(r)) | ctx.primitives(producer)
  for b in ctx.writes.get(r.name, ()):
    for c in b.consumers:
      if c in ctx.kernels:
        names |= ctx.primitives(ctx.kernels[c])
  if "rsqrt" in names:
    return "layer_norm" if names & {"sub", "subtract"} else "rms_norm"
  if names & {"exp", "exponential"} and names & {"reduce_max", "max"}:
    return "softmax"
  return None


# ------------------------------------------------ class 7: keep reuse ----


def _keep_reuse(ctx: _Context) -> list[FusionDecisionRecord]:
  out = []
  threshold = ctx.options.keep_fraction * ctx.peak_bytes
  for buf in ctx.buffers.values():
    if buf.internal or not buf.producer or buf.bytes < threshold:
      continue
    if buf.lifetime in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT):
      continue
    if len(buf.consumers) < ctx.options.keep_min_consumers:
      continue
    k = ctx.kernels.get(buf.producer)
    if k is None:
      continue
    out.append(FusionDecisionRecord(
        kind=FindingKind.KEEP_REUSE, producer=k.name, consumers=buf.consumers,
        boundary=buf.name, boundary_shape=buf.shape, bytes_saved=0,
        launches_removed=0,
        extra_arithmetic=(f"fusing would recompute {k.name} in "
                          f"{len(buf.consumers)} consumers"),
        extra_resources="n/a", numerical_class=NumericalClass.EXACT, guard="n/a",
        layout_effect="none",
        evidence=(f"{buf.shape} written by {_kernel_desc(k)} is read by "
                  f"{len(buf.consumers)} kernels: {', '.join(buf.consumers)}"),
        verdict=Verdict.KEEP,
        reasons=("reuse exists: several consumers exploit the materialization",),
        risks=("cache reuse: fusing the producer duplicates its loads and work",),
        ops=(f"{len(buf.consumers)} readers",), kernel=None, trip_count=_trip(k),
        source=buf.source, computation=k.computation))
  return out
