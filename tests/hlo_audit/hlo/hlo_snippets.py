"""Small hand-written HLO modules, each accepted by XLA's own parser.

Unit tests read expected values off these by hand; `parser_test` checks
that XLA (jaxlib) accepts every one and agrees on names and opcodes, and that
the fast and slow parser paths agree on each; the fuzz test mutates them when
the corpus is absent.
"""

from __future__ import annotations

from hlo_audit._src import compat

#: As XLA's GPU backend prints a scheduled module: header attributes, async
#: collectives, a generic async pair, a custom-call-start that XLA wraps in a
#: computation of its own, control predecessors, `/*index=N*/` comments.
SCHEDULED_ASYNC = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8]{0}, f32[8]{0})->(f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[8]{0}, /*index=5*/f32[8]{0})}, num_partitions=2

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%async_comp (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %neg = f32[8]{0} negate(f32[8]{0} %p)
}

ENTRY %main (a: f32[8], b: f32[8]) -> (f32[8], f32[8], f32[8], f32[8], f32[8], /*index=5*/f32[8]) {
  %a = f32[8]{0} parameter(0), metadata={op_name="jit(step)/a"}
  %b = f32[8]{0} parameter(1)
  %ars = f32[8]{0} all-reduce-start(f32[8]{0} %a), channel_id=1, replica_groups={{0,1}}, to_apply=%add, backend_config={"operation_queue_id":"0","wait_on_operation_queues":[]}
  %ard = f32[8]{0} all-reduce-done(f32[8]{0} %ars)
  %as = ((f32[8]{0}), f32[8]{0}, s32[]) async-start(f32[8]{0} %b), calls=%async_comp
  %ad = f32[8]{0} async-done(((f32[8]{0}), f32[8]{0}, s32[]) %as), calls=%async_comp
  %ccs = ((f32[8]{0}), f32[8]{0}, u32[]) custom-call-start(f32[8]{0} %a), custom_call_target="my_kernel", backend_config="opaque"
  %ccd = f32[8]{0} custom-call-done(((f32[8]{0}), f32[8]{0}, u32[]) %ccs)
  %m = f32[8]{0} multiply(f32[8]{0} %a, f32[8]{0} %b), control-predecessors={%ard, %ad}
  ROOT %t = (f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[8]{0}, /*index=5*/f32[8]{0}) tuple(%ard, %ad, %ccd, %m, %a, /*index=5*/%b)
}
"""

#: Constants with literal data and elided literals.
CONSTANTS = """\
HloModule constants

ENTRY main {
  s = f32[] constant(1.5)
  v = s32[3] constant({1, -2, 3})
  m = f32[2,2]{1,0} constant({ { 1, 2 }, { 3, 4 } })
  big = bf16[1024,1024]{1,0} constant({...})
  b = pred[2] constant({true, false})
  ninf = f32[] constant(-inf)
  ROOT r = (f32[], s32[3], f32[2,2], bf16[1024,1024], pred[2], f32[]) tuple(s, v, m, big, b, ninf)
}
"""

#: Stack frame tables. XLA prints parent_frame_id one higher than it stores
#: it: frame 1 (printed 1) has no caller, frame 2 (printed 2) is called by 1.
STACK_FRAMES = """\
HloModule frames

FileNames
1 "model.py"
2 "layers.py"

FunctionNames
1 "forward"
2 "dense"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=4 end_column=20}
2 {file_name_id=2 function_name_id=2 line=42 end_line=43 column=8 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}

ENTRY main {
  p = f32[4] parameter(0)
  e = f32[4] exponential(p), metadata={op_type="exp" op_name="jit(f)/exp" stack_frame_id=2}
  ROOT n = f32[4] negate(e), metadata={op_name="jit(f)/neg" source_file="/src/f.py" source_line=7}
}
"""

#: What hand-written tests use: nested instructions, an inline computation,
#: omitted shapes, bare names and comments.
NESTED = """\
HloModule nested

// A comment line.
ENTRY main {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  d = add(f32[] maximum(a, b), c)  /* inferred shape */
  v = f32[4] parameter(3)
  zero = f32[] constant(0)
  ROOT r = f32[] reduce(v, zero), dimensions={0}, to_apply={
    x = f32[] parameter(0)
    y = f32[] parameter(1)
    ROOT s = f32[] add(x, y)
  }
}
"""

#: TPU-style layouts: tiles, element size, memory space; sub-byte types.
TPU_LAYOUTS = """\
HloModule tpu, entry_computation_layout={(bf16[8,128]{1,0:T(8,128)(2,1)S(1)}, s4[64]{0:E(4)})->s4[64]{0:E(4)}}

ENTRY main {
  a = bf16[8,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  q = s4[64]{0:E(4)} parameter(1)
  c = bf16[8,128]{1,0:T(8,128)(2,1)} copy(a)
  ROOT n = s4[64]{0:E(4)} negate(q)
}
"""

#: Attributes of all kinds.
ATTRIBUTES = """\
HloModule attrs, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {1}, must-alias) }, entry_computation_layout={(f32[2,2]{1,0}, (f32[2]{0}, f32[2]{0}))->(f32[2,2]{1,0}, f32[2]{0})}

ENTRY main {
  p0 = f32[2,2]{1,0} parameter(0), parameter_replication={true}
  p1 = (f32[2]{0}, f32[2]{0}) parameter(1), parameter_replication={false,true}
  g = f32[2]{0} get-tuple-element(p1), index=1
  cc = f32[2,2]{1,0} custom-call(p0), custom_call_target="Sharding", sharding={devices=[2,1]<=[2]}, schedule=SCHEDULE_LATEST, output_to_operand_aliasing={{}: (0, {})}, frontend_attributes={_xla_compute_type="host", xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}, backend_config={"k": [1, 2], "nested": {"a": "b"}}
  ROOT t = (f32[2,2]{1,0}, f32[2]{0}) tuple(cc, g)
}
"""

#: Convolution, pad, slice and dot attributes.
WINDOWS = """\
HloModule windows

ENTRY main {
  x = f32[1,10,10,3]{3,2,1,0} parameter(0)
  k = f32[3,3,3,8]{3,2,1,0} parameter(1)
  conv = f32[1,5,5,8]{3,2,1,0} convolution(x, k), window={size=3x3 stride=2x2 pad=1_1x1_1 rhs_dilate=1x1}, dim_labels=b01f_01io->b01f
  zero = f32[] constant(0)
  padded = f32[1,7,12,8]{3,2,1,0} pad(conv, zero), padding=0_0x1_1_0x0_3_1x0_0
  sl = f32[1,3,6,8]{3,2,1,0} slice(padded), slice={[0:1], [1:7:2], [0:12:2], [0:8]}
  l = f32[4,16]{1,0} parameter(2)
  r = f32[16,32]{1,0} parameter(3)
  dot = f32[4,32]{1,0} dot(l, r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  tr = f32[32,4]{0,1} transpose(dot), dimensions={1,0}
  ROOT t = (f32[1,3,6,8]{3,2,1,0}, f32[32,4]{0,1}) tuple(sl, tr)
}
"""

#: Control flow: while, conditional (by index and by predicate), call, fusion.
CONTROL_FLOW = """\
HloModule control

cond {
  cp = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(cp), index=0
  n = s32[] constant(10)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  bp = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(bp), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  v = f32[4] get-tuple-element(bp), index=1
  ROOT out = (s32[], f32[4]) tuple(next, v)
}

branch0 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] negate(p)
}

branch1 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] exponential(p)
}

fused {
  fp = f32[4] parameter(0)
  ROOT fr = f32[4] sqrt(fp)
}

ENTRY main {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  idx = s32[] parameter(1)
  c1 = f32[4] conditional(idx, x, x), branch_computations={branch0, branch1}
  pr = pred[] parameter(2)
  c2 = f32[4] conditional(pr, x, x), true_computation=branch1, false_computation=branch0
  call = f32[4] call(x), to_apply=branch0
  f = f32[4] fusion(c1), kind=kLoop, calls=fused
  ROOT t = ((s32[], f32[4]), f32[4], f32[4], f32[4]) tuple(w, c2, call, f)
}
"""

#: Dynamic dimensions: bounded (`<=N`) and unbounded (`?`).
DYNAMIC = """\
HloModule dynamic

ENTRY main {
  p = f32[<=4,?] parameter(0)
  n = s32[] get-dimension-size(p), dimensions={0}
  ROOT c = f32[<=4,?] copy(p)
}
"""

#: As XLA:GPU's dumps print a tuple's elements (jax 0.11 and newer): `%t#0`
#: for a get-tuple-element they leave out, nested `%t#1#1`; a name the parser
#: would give one (`t_1`) already taken.
TUPLE_ELEMENTS = """\
HloModule m, is_scheduled=true

%fused (p0: f32[4]) -> (f32[4], f32[4]) {
  %p0 = f32[4]{0} parameter(0)
  %e = f32[4]{0} exponential(%p0)
  %n = f32[4]{0} negate(%p0)
  ROOT %r = (f32[4]{0}, f32[4]{0}) tuple(%e, %n)
}

ENTRY %main (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %y = f32[4]{0} parameter(1)
  %f = (f32[4]{0}, f32[4]{0}) fusion(%x), kind=kLoop, calls=%fused
  %t = (f32[4]{0}, (f32[4]{0}, f32[4]{0})) tuple(%y, %f)
  %t_1 = f32[4]{0} negate(%f#1)
  %a = f32[4]{0} add(%t#0, %t_1)
  %b = f32[4]{0} add(%t#1#1, %a)
  ROOT %c = f32[4]{0} add(%b, %t#0)
}
"""

#: One instruction, no module around it: XLA makes its operands parameters.
SINGLE_INSTRUCTION = "ROOT r = f32[2] add(f32[2] x, f32[2] y)\n"

#: An operand that is neither a named instruction (`negate` names none) nor a
#: nested one (no operand list): XLA's parser drops it and goes on, the tuple
#: holding `p` alone.
DROPPED_OPERAND = """HloModule m

ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = (f32[4]) tuple(p, f32[4] negate)
}
"""

ALL = {
    "scheduled_async": SCHEDULED_ASYNC,
    "dropped_operand": DROPPED_OPERAND,
    "constants": CONSTANTS,
    "stack_frames": STACK_FRAMES,
    "nested": NESTED,
    "tpu_layouts": TPU_LAYOUTS,
    "attributes": ATTRIBUTES,
    "windows": WINDOWS,
    "control_flow": CONTROL_FLOW,
    "dynamic": DYNAMIC,
    "single_instruction": SINGLE_INSTRUCTION,
    "crlf": CONTROL_FLOW.replace("\n", "\r\n"),
    "cr_only": CONTROL_FLOW.replace("\n", "\r"),
}
if compat.XLA_PARSES_TUPLE_ELEMENT_OPERANDS:
  ALL["tuple_elements"] = TUPLE_ELEMENTS
