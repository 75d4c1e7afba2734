"""Epilogues after a matmul on hand-written optimized HLO: which readers a
matmul kernel could take in."""

from __future__ import annotations

import pytest

import hlo_audit
from hlo_audit import FindingKind

READER = """
HloModule rw, is_scheduled=true

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused_tanh (p0: f32[128,512], p1: f32[128,512]) -> (f32[128,512], f32[128,256]) {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[128,512]{1,0} parameter(1)
  %t = f32[128,512]{1,0} tanh(%p0)
  %z = f32[] constant(-inf)
  %w = f32[128,256]{1,0} reduce-window(%p1, %z), window={size=1x2 stride=1x2}, to_apply=%max
  ROOT %out = (f32[128,512]{1,0}, f32[128,256]{1,0}) tuple(%t, %w)
}

ENTRY %main (x: f32[128,256], w: f32[256,512], y: f32[128,512]) -> (f32[128,512], f32[128,256]) {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %y = f32[128,512]{1,0} parameter(2)
  %d = f32[128,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = (f32[128,512]{1,0}, f32[128,256]{1,0}) fusion(%d, %y), kind=kInput, calls=%fused_tanh
}
"""


_WINDOW = ("%w = f32[128,256]{1,0} reduce-window(%p1, %z), "
           "window={size=1x2 stride=1x2}, to_apply=%max")


@pytest.mark.parametrize("reducer", [
    _WINDOW,
    "%m = f32[128]{0} reduce(%p1, %z), dimensions={1}, to_apply=%max\n"
    "  %w = f32[128,256]{1,0} broadcast(%m), dimensions={0}",
])
def test_a_reader_that_reduces_is_no_epilogue_even_beside_elementwise_work(reducer):
  # An input fusion (XLA:GPU's transposing emitter runs elementwise work as
  # one too) is an epilogue only where it reduces and scatters nothing: this
  # one also reduces another operand (through a window, or a row reduction).
  report = hlo_audit.audit_hlo(READER.replace(_WINDOW, reducer))
  assert not report.findings_of(FindingKind.UNFUSED_EPILOGUE)
  plain = READER.replace(_WINDOW, "%w = f32[128,256]{1,0} slice(%p1), slice={[0:128], [0:256]}")
  (epi,) = hlo_audit.audit_hlo(plain).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.boundary, epi.ops) == ("d", ("activation:tanh",))


TWO_READERS = """
HloModule two, is_scheduled=true

%fused_mul (p0: f32[128,512], p1: f32[128,512]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[128,512]{1,0} parameter(1)
  ROOT %m = f32[128,512]{1,0} multiply(%p0, %p1), metadata={op_name="jit(step)/PASS(jvp(tanh))/mul"}
}

%fused_sub (p0: f32[128,512], p1: f32[128,512]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[128,512]{1,0} parameter(1)
  ROOT %s = f32[128,512]{1,0} subtract(%p1, %p0), metadata={op_name="jit(step)/PASS(jvp(tanh))/sub"}
}

ENTRY %main (x: f32[128,256], w: f32[256,512], g: f32[128,512]) -> (f32[128,512], f32[128,512]) {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %g = f32[128,512]{1,0} parameter(2)
  %d = f32[128,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp(dense)/dot_general"}
  %f1 = f32[128,512]{1,0} fusion(%d, %g), kind=kLoop, calls=%fused_mul, metadata={op_name="jit(step)/PASS(jvp(tanh))/mul"}
  %f2 = f32[128,512]{1,0} fusion(%d, %g), kind=kLoop, calls=%fused_sub, metadata={op_name="jit(step)/PASS(jvp(tanh))/sub"}
  ROOT %t = (f32[128,512]{1,0}, f32[128,512]{1,0}) tuple(%f1, %f2)
}
"""


def test_readers_that_all_need_the_gradients_leave_no_epilogue():
  # Two forward readers, each elementwise: one epilogue writes both results.
  forward = hlo_audit.audit_hlo(TWO_READERS.replace("PASS", "vmap"))
  (epi,) = forward.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.boundary, set(epi.consumers)) == ("d", {"f1", "f2"})
  # Backward readers of a forward result need the gradients, which come
  # later: no reader can move into the matmul's store. Not even a record of
  # no bytes (every finding kept): the stored result is reused, and says so.
  backward = hlo_audit.audit_hlo(TWO_READERS.replace("PASS", "transpose"),
                                 options=hlo_audit.AuditOptions(min_bytes_saved=0))
  assert not backward.findings_of(FindingKind.UNFUSED_EPILOGUE)
  (reuse,) = backward.findings_of(FindingKind.KEEP_REUSE)
  assert (reuse.boundary, set(reuse.consumers)) == ("d", {"f1", "f2"})


ONE_READER = """
HloModule one, is_scheduled=true

%fused_reader (p0: f32[128,512], p1: f32[512]) -> OUT {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[512]{0} parameter(1)
  BODY
}

ENTRY %main (x: f32[128,256], w: f32[256,512], b: f32[512]) -> OUT {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %b = f32[512]{0} parameter(2)
  %d = f32[128,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = OUT fusion(%d, %b), kind=kLoop, calls=%fused_reader
}
"""
WHOLE = "f32[128,512]{1,0}"


def _epilogue(body: str, out: str = WHOLE) -> hlo_audit.FusionDecisionRecord:
  text = ONE_READER.replace("BODY", body).replace("OUT", out)
  (epi,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.producer, epi.boundary, epi.consumers) == ("d", "d", ("f",))
  return epi


def test_an_epilogue_names_its_work_and_the_tiles_it_holds():
  bias = _epilogue("%bb = f32[128,512]{1,0} broadcast(%p1), dimensions={1}\n"
                   "  ROOT %r = f32[128,512]{1,0} add(%p0, %bb)")
  assert (bias.ops, bias.extra_resources) == (("bias",), "one bias vector tile")
  assert bias.risks[:2] == (
      "register count: the epilogue's live values add to the accumulator's",
      "store coalescing: the fused store must stay vectorized")
  act = _epilogue("ROOT %r = f32[128,512]{1,0} tanh(%p0)")
  assert (act.ops, act.extra_resources) == (("activation:tanh",),
                                            "activation temporaries per element")
  # Its result stored in bf16, or quantized to int8 (which needs per-row
  # scales across tiles: risky).
  cast = _epilogue("%t = f32[128,512]{1,0} tanh(%p0)\n"
                   "  ROOT %r = bf16[128,512]{1,0} convert(%t)", out="bf16[128,512]{1,0}")
  assert (cast.ops, cast.verdict) == (("activation:tanh", "cast:bf16"), hlo_audit.Verdict.SAFE)
  quant = _epilogue("ROOT %r = s8[128,512]{1,0} convert(%p0)", out="s8[128,512]{1,0}")
  assert (quant.ops, quant.verdict) == (("quantize:s8",), hlo_audit.Verdict.RISKY)
  # A reader keeping a column block: the matmul stores that part alone.
  part = _epilogue("ROOT %r = f32[128,256]{1,0} slice(%p0), slice={[0:128], [0:256]}",
                   out="f32[128,256]{1,0}")
  assert (part.ops, part.extra_resources) == (("slice",), "none expected")


def _const(name: str, value: str) -> str:
  return (f"%{name} = f32[] constant({value})\n"
          f"  %{name}b = {WHOLE} broadcast(%{name}), dimensions={{}}\n  ")


# GELU's tanh form as jax.nn.gelu(approximate=True) lowers it, the cube
# written as products (x * x * x) rather than a power.
GELU_TANH = (
    _const("k0", "0.044715") + _const("k1", "0.797884") + _const("half", "0.5")
    + _const("one", "1") +
    f"%sq = {WHOLE} multiply(%p0, %p0)\n  %cu = {WHOLE} multiply(%sq, %p0)\n"
    f"  %s = {WHOLE} multiply(%cu, %k0b)\n  %in = {WHOLE} add(%p0, %s)\n"
    f"  %k = {WHOLE} multiply(%in, %k1b)\n  %t = {WHOLE} tanh(%k)\n"
    f"  %u = {WHOLE} add(%t, %oneb)\n  %h = {WHOLE} multiply(%p0, %halfb)\n"
    f"  ROOT %r = {WHOLE} multiply(%h, %u)")
# 1 / (1 + exp(-x)): jax.nn.sigmoid after XLA expands the logistic.
SIGMOID = (_const("one", "1") +
           f"%n = {WHOLE} negate(%p0)\n  %e = {WHOLE} exponential(%n)\n"
           f"  %den = {WHOLE} add(%e, %oneb)\n  ROOT %r = {WHOLE} divide(%oneb, %den)")


def test_an_activation_is_named_by_the_function_its_ops_compute():
  assert _epilogue(GELU_TANH).ops == ("activation:gelu_tanh",)
  # x * (x * b) is no cube: a tanh of something else.
  not_cubed = GELU_TANH.replace(
      f"%sq = {WHOLE} multiply(%p0, %p0)",
      f"%bb = {WHOLE} broadcast(%p1), dimensions={{1}}\n  %sq = {WHOLE} multiply(%p0, %bb)")
  assert _epilogue(not_cubed).ops == ("activation:tanh",)
  assert _epilogue(SIGMOID).ops == ("activation:sigmoid",)
  # 1 / (1 + |-x|) has the shape of a sigmoid without its exponential.
  assert _epilogue(SIGMOID.replace("exponential(%n)", "abs(%n)")).ops == ("elementwise",)


# log_softmax(x @ w) written as XLA leaves it unfused: exp of the logits,
# their log-sum per row, and the logits minus it.
LOG_SOFTMAX = """
HloModule logsm, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_exp (p0: f32[128,512]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  ROOT %e = f32[128,512]{1,0} exponential(%p0)
}

%fused_sum (p0: f32[128,512]) -> f32[128] {
  %p0 = f32[128,512]{1,0} parameter(0)
  %z = f32[] constant(0)
  %r = f32[128]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add
  ROOT %l = f32[128]{0} log(%r)
}

%fused_sub (p0: f32[128,512], p1: f32[128]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %b = f32[128,512]{1,0} broadcast(%p1), dimensions={0}
  ROOT %s = f32[128,512]{1,0} subtract(%p0, %b)
}

ENTRY %main (x: f32[128,256], w: f32[256,512]) -> f32[128,512] {
  %x = f32[128,256]{1,0} parameter(0)
  %w = f32[256,512]{1,0} parameter(1)
  %d = f32[128,512]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ex = f32[128,512]{1,0} fusion(%d), kind=kLoop, calls=%fused_exp
  %lse = f32[128]{0} fusion(%ex), kind=kInput, calls=%fused_sum
  ROOT %out = f32[128,512]{1,0} fusion(%d, %lse), kind=kLoop, calls=%fused_sub
}
"""


def test_a_reader_that_needs_the_results_statistics_keeps_the_result_stored():
  # The exp can move into the matmul's store; the subtraction needs the
  # log-sum of every column first, so it reads the stored logits later.
  (epi,) = hlo_audit.audit_hlo(LOG_SOFTMAX).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.boundary, epi.consumers, epi.boundary_kept) == ("d", ("ex",), True)
  assert epi.bytes_saved == 128 * 512 * 4  # the exp's read, not the stored result
  assert "out also reads it with values computed from the whole result" in epi.evidence


def _split_into_accumulators(second: str = "%a = f32[64,64]{1,0} add(%acc, %s)") -> str:
  """A dW product f32[64,256] whose four column blocks four kernels add into
  four accumulators of their own (flax's LSTM: one per gate's weight)."""
  comps, calls = [], []
  for i in range(4):
    body = (second if i == 1 else "%a = f32[64,64]{1,0} add(%acc, %s)")
    comps.append(f"""
%fused_acc.{i} (acc: f32[64,64], p: f32[64,256]) -> f32[64,64] {{
  %acc = f32[64,64]{{1,0}} parameter(0)
  %p = f32[64,256]{{1,0}} parameter(1)
  %s = f32[64,64]{{1,0}} slice(%p), slice={{[0:64], [{64 * i}:{64 * i + 64}]}}
  ROOT {body}
}}""")
    calls.append(f"  %f{i} = f32[64,64]{{1,0}} fusion(%a{i}, %d), kind=kLoop, "
                 f"calls=%fused_acc.{i}")
  params = "\n".join(f"  %a{i} = f32[64,64]{{1,0}} parameter({i + 2})" for i in range(4))
  return f"""
HloModule acc, is_scheduled=true
{''.join(comps)}

ENTRY %main (x: f32[32,64], g: f32[32,256], a0: f32[64,64], a1: f32[64,64], a2: f32[64,64], a3: f32[64,64]) -> (f32[64,64], f32[64,64], f32[64,64], f32[64,64]) {{
  %x = f32[32,64]{{1,0}} parameter(0)
  %g = f32[32,256]{{1,0}} parameter(1)
{params}
  %d = f32[64,256]{{1,0}} dot(%x, %g), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
{chr(10).join(calls)}
  ROOT %t = (f32[64,64]{{1,0}}, f32[64,64]{{1,0}}, f32[64,64]{{1,0}}, f32[64,64]{{1,0}}) tuple(%f0, %f1, %f2, %f3)
}}
"""


def test_column_blocks_added_into_accumulators_of_their_own_are_a_program_change():
  # flax's LSTM under a scan: the dW product's four gate blocks each added
  # into its gate's gradient accumulator. One accumulator for the four (one
  # parameter) makes one add, which XLA:GPU fuses into the gemm: no kernel
  # writes four accumulators.
  text = _split_into_accumulators()
  (cpu,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (cpu.boundary, cpu.ops, cpu.need, cpu.kernel) == ("d", ("split:4",), None, None)
  assert cpu.guard.startswith("n/a: a change to the program: keep the 4 arrays")
  assert "residual epilogue" in cpu.guard
  # XLA:GPU's launches name their operation queue.
  gpu_text = text.replace("calls=%fused_acc.", 'backend_config={"operation_queue_id":"0"}, '
                          "calls=%fused_acc.")
  (gpu,) = hlo_audit.audit_hlo(gpu_text).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert gpu.guard.endswith("which XLA:GPU fuses into the gemm")
  assert gpu.bytes_saved == cpu.bytes_saved == 2 * 64 * 256 * 4


@pytest.mark.parametrize("second", [
    "%a = f32[64,64]{1,0} multiply(%acc, %s)",  # a gate's activation, not a sum
    "%a = f32[64,64]{1,0} add(%s, %s)",  # no accumulator
    "%a = f32[64,64]{1,0} add(%acc, %acc)",  # the slice is not what is added
])
def test_a_block_that_is_not_accumulated_keeps_the_split_a_kernels_business(second):
  text = _split_into_accumulators(second)
  found = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert all(not f.guard.startswith("n/a") for f in found), [f.guard for f in found]


# The block's f32 output (a bf16 matmul XLA:CPU ran in f32) read once by
# out.astype(f32) - y: rounded to bf16, widened back, y subtracted.
ROUNDED_RESIDUAL = """
HloModule rounded, is_scheduled=true

%fused_sub (p0: f32[4,128,128], p1: f32[512,128]) -> f32[4,128,128] {
  %p1 = f32[512,128]{1,0} parameter(1)
  %r = bf16[512,128]{1,0} convert(%p1)
  %rf = f32[512,128]{1,0} convert(%r)
  %b = f32[4,128,128]{2,1,0} bitcast(%rf)
  %p0 = f32[4,128,128]{2,1,0} parameter(0)
  ROOT %s = f32[4,128,128]{2,1,0} subtract(%b, %p0), metadata={op_name="jit(step)/sub"}
}

ENTRY %main (x: f32[512,128], w: f32[128,128], y: f32[4,128,128]) -> f32[4,128,128] {
  %x = f32[512,128]{1,0} parameter(0)
  %w = f32[128,128]{1,0} parameter(1)
  %y = f32[4,128,128]{2,1,0} parameter(2)
  %d = f32[512,128]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/dot_general"}
  ROOT %f = f32[4,128,128]{2,1,0} fusion(%y, %d), kind=kLoop, calls=%fused_sub
}
"""


def test_a_rounding_widened_back_is_no_output_cast():
  # The reader writes f32: a matmul writing bf16 would drop its precision.
  # The fused store skips the rounding: more precise than the reader.
  (epi,) = hlo_audit.audit_hlo(ROUNDED_RESIDUAL).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.ops == ("residual",)
  assert "round:bf16" in epi.evidence
  assert epi.numerical_class is hlo_audit.NumericalClass.MORE_PRECISE
  # Kept in bf16 (written so), the rounding is the output's cast.
  kept = ROUNDED_RESIDUAL.replace(
      "%rf = f32[512,128]{1,0} convert(%r)\n  %b = f32[4,128,128]{2,1,0} bitcast(%rf)",
      "%b = bf16[4,128,128]{2,1,0} bitcast(%r)").replace(
      "ROOT %s = f32[4,128,128]{2,1,0} subtract(%b, %p0)",
      "%yb = bf16[4,128,128]{2,1,0} convert(%p0)\n"
      "  ROOT %s = bf16[4,128,128]{2,1,0} subtract(%b, %yb)").replace(
      "-> f32[4,128,128] {", "-> bf16[4,128,128] {").replace(
      "-> f32[4,128,128] {", "-> bf16[4,128,128] {").replace(
      "ROOT %f = f32[4,128,128]{2,1,0}", "ROOT %f = bf16[4,128,128]{2,1,0}")
  (cast,) = hlo_audit.audit_hlo(kept).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert cast.ops == ("residual", "cast:bf16")


# A bf16 projection (the matmul writes bf16) read by two kernels: its
# transpose for the forward's batched dot, and its transposed f32 copy for
# a backward dot, which reads nothing else.
PROJECTION = """
HloModule proj, is_scheduled=true

%fused_fwd (p0: bf16[512,128]) -> bf16[4,4,32,128] {
  %p0 = bf16[512,128]{1,0} parameter(0)
  %b = bf16[4,128,4,32]{3,2,1,0} bitcast(%p0)
  ROOT %t = bf16[4,4,32,128]{3,2,1,0} transpose(%b), dimensions={0,2,3,1}
}

%fused_bwd (p0: bf16[512,128]) -> f32[4,4,128,32] {
  %p0 = bf16[512,128]{1,0} parameter(0)
  %c = f32[512,128]{1,0} convert(%p0)
  %b = f32[4,128,4,32]{3,2,1,0} bitcast(%c)
  ROOT %t = f32[4,4,128,32]{3,2,1,0} transpose(%b), dimensions={0,2,1,3}
}

ENTRY %main (x: bf16[512,128], w: bf16[128,128]) -> (bf16[4,4,32,128], f32[4,4,128,32]) {
  %x = bf16[512,128]{1,0} parameter(0)
  %w = bf16[128,128]{1,0} parameter(1)
  %d = bf16[512,128]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp()/dot_general"}
  %fwd = bf16[4,4,32,128]{3,2,1,0} fusion(%d), kind=kLoop, calls=%fused_fwd, metadata={op_name="jit(step)/jvp()/reshape"}
  %bwd = f32[4,4,128,32]{3,2,1,0} fusion(%d), kind=kLoop, calls=%fused_bwd, metadata={op_name="jit(step)/transpose(jvp(vmap(BTNH,BSNH->BNTS)))/dot_general"}
  ROOT %out = (bf16[4,4,32,128]{3,2,1,0}, f32[4,4,128,32]{3,2,1,0}) tuple(%fwd, %bwd)
}
"""


def test_a_backward_reader_of_the_forward_result_alone_needs_no_gradient():
  # Both readers can be the matmul's epilogue: the result is never stored.
  (epi,) = hlo_audit.audit_hlo(PROJECTION).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (set(epi.consumers), epi.ops, epi.boundary_kept) == (
      {"fwd", "bwd"}, ("outputs:2", "transpose", "cast:f32"), False)


def test_a_transpose_alone_writes_the_same_values_fused_or_not():
  # A bf16 result only transposed: the fused store rounds the accumulator
  # to the same bf16 values, no arithmetic moves onto it.
  fwd_only = PROJECTION.replace(
      "  %bwd = f32[4,4,128,32]{3,2,1,0} fusion(%d), kind=kLoop, calls=%fused_bwd, "
      'metadata={op_name="jit(step)/transpose(jvp(vmap(BTNH,BSNH->BNTS)))/dot_general"}\n',
      "").replace("tuple(%fwd, %bwd)", "tuple(%fwd, %w)").replace(
      "f32[4,4,128,32]{3,2,1,0}) tuple", "bf16[128,128]{1,0}) tuple").replace(
      "-> (bf16[4,4,32,128], f32[4,4,128,32])", "-> (bf16[4,4,32,128], bf16[128,128])")
  (epi,) = hlo_audit.audit_hlo(fwd_only).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert (epi.ops, epi.numerical_class) == (("transpose",),
                                            hlo_audit.NumericalClass.SAME_OPS)
  # With arithmetic on it, the fused work runs on the f32 accumulator.
  scaled = fwd_only.replace(
      "ROOT %t = bf16[4,4,32,128]{3,2,1,0} transpose(%b), dimensions={0,2,3,1}",
      "%two = bf16[] constant(2)\n"
      "  %twob = bf16[4,128,4,32]{3,2,1,0} broadcast(%two), dimensions={}\n"
      "  %s = bf16[4,128,4,32]{3,2,1,0} multiply(%b, %twob)\n"
      "  ROOT %t = bf16[4,4,32,128]{3,2,1,0} transpose(%s), dimensions={0,2,3,1}")
  (more,) = hlo_audit.audit_hlo(scaled).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert more.ops == ("scale", "transpose")
  assert more.numerical_class is hlo_audit.NumericalClass.MORE_PRECISE


# sgd's update on XLA:CPU (jax 0.10): the weight gradient (dx^T @ dy, a dot
# writing [in, out]) scaled by -lr, transposed to the weight's layout
# (transpose + copy in the fusion) and only then added to the weight.
TRANSPOSED_UPDATE = """
HloModule sgd, is_scheduled=true

%fused_update (p0: f32[128,64], p1: f32[64,128]) -> f32[64,128] {
  %p0 = f32[128,64]{1,0} parameter(0)
  %lr = f32[] constant(-0.01)
  %lrb = f32[128,64]{1,0} broadcast(%lr), dimensions={}
  %g = f32[128,64]{1,0} multiply(%p0, %lrb)
  %t = f32[64,128]{0,1} transpose(%g), dimensions={1,0}
  %c = f32[64,128]{1,0} copy(%t)
  %p1 = f32[64,128]{1,0} parameter(1)
  ROOT %u = f32[64,128]{1,0} add(%p1, %c), metadata={op_name="jit(step)/add"}
}

ENTRY %main (x: f32[256,128], dy: f32[256,64], w: f32[64,128]) -> f32[64,128] {
  %x = f32[256,128]{1,0} parameter(0)
  %dy = f32[256,64]{1,0} parameter(1)
  %w = f32[64,128]{1,0} parameter(2)
  %d = f32[128,64]{1,0} dot(%x, %dy), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/dot_general"}
  ROOT %f = f32[64,128]{1,0} fusion(%d, %w), kind=kLoop, calls=%fused_update
}
"""


def test_an_add_after_the_transpose_is_still_the_residual():
  # The store could write the tile transposed and add the weight's tile at
  # its place: the residual and the scale act on the moved value.
  (epi,) = hlo_audit.audit_hlo(TRANSPOSED_UPDATE).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.ops == ("residual", "scale", "transpose")
  # A scale applied after the move (a norm's gamma on the transposed
  # gradient) is the same scale.
  after = TRANSPOSED_UPDATE.replace(
      "%g = f32[128,64]{1,0} multiply(%p0, %lrb)\n"
      "  %t = f32[64,128]{0,1} transpose(%g)",
      "%t = f32[64,128]{0,1} transpose(%p0)").replace(
      "%c = f32[64,128]{1,0} copy(%t)",
      "%m = f32[64,128]{0,1} copy(%t)\n"
      "  %lrt = f32[64,128]{1,0} broadcast(%lr), dimensions={}\n"
      "  %c = f32[64,128]{1,0} multiply(%m, %lrt)")
  (epi,) = hlo_audit.audit_hlo(after).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.ops == ("residual", "scale", "transpose")


# A decode step's o_proj read once by the residual add with the gathered
# embedding rows ([b, 1, d], bitcast to [b, d]), both rounded to bf16 and
# widened back (a bf16 model XLA:CPU runs in f32).
RESHAPED_RESIDUAL = """
HloModule reshaped, is_scheduled=true

%fused_add (p0: f32[64,256], p1: f32[64,1,256]) -> f32[64,256] {
  %p1 = f32[64,1,256]{2,1,0} parameter(1)
  %b = f32[64,256]{1,0} bitcast(%p1)
  %rb = bf16[64,256]{1,0} convert(%b)
  %r = f32[64,256]{1,0} convert(%rb)
  %p0 = f32[64,256]{1,0} parameter(0)
  %db = bf16[64,256]{1,0} convert(%p0)
  %d = f32[64,256]{1,0} convert(%db)
  ROOT %s = f32[64,256]{1,0} add(%r, %d), metadata={op_name="jit(step)/add"}
}

ENTRY %main (x: f32[64,256], w: f32[256,256], e: f32[64,1,256]) -> f32[64,256] {
  %x = f32[64,256]{1,0} parameter(0)
  %w = f32[256,256]{1,0} parameter(1)
  %e = f32[64,1,256]{2,1,0} parameter(2)
  %o = f32[64,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/dot_general"}
  ROOT %f = f32[64,256]{1,0} fusion(%o, %e), kind=kLoop, calls=%fused_add
}
"""


@pytest.mark.parametrize("view", ["bitcast", "reshape"])
def test_a_residual_through_a_shape_change_is_the_residual(view):
  text = RESHAPED_RESIDUAL.replace("bitcast(%p1)", f"{view}(%p1)")
  (epi,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.ops == ("residual",)


def test_an_optimizer_update_is_adams_only_where_it_takes_a_square_root():
  # keras' MobileNetV3 step for an H200 (committed): each weight gradient's
  # gemm feeds Adam's update (the parameter and both moments, from g * g and
  # a square root). With the square roots gone, the same three-output
  # updates square the gradient but are no Adam step.
  import re  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.real_models import h200_support  # pylint: disable=import-outside-toplevel
  text = h200_support.fixture("keras_mobilenet")

  def updates(t):
    r = hlo_audit.audit_hlo(t, options=hlo_audit.AuditOptions(device="h200"))
    return [f.ops for f in r.findings if "outputs:3" in f.ops]

  adam = updates(text)
  assert adam and all("adam" in ops for ops in adam)
  plain = updates(re.sub(r" r?sqrt\(", " negate(", text))
  assert len(plain) == len(adam) and not any("adam" in ops for ops in plain)
