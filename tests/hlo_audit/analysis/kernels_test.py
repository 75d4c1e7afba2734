"""Kernel classification on hand-written optimized HLO of each backend."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind, KernelKind

GPU = """
HloModule gpu_mlp, is_scheduled=true

%fused_gelu (p0: f32[64,128], p1: f32[128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %b = f32[64,128]{1,0} broadcast(%p1), dimensions={1}
  %a = f32[64,128]{1,0} add(%p0, %b), metadata={op_name="jit(f)/add" source_file="/src/model.py" source_line=7}
  ROOT %t = f32[64,128]{1,0} tanh(%a), metadata={op_name="jit(f)/tanh" source_file="/src/model.py" source_line=7}
}

%triton_gemm (p0: bf16[64,32], p1: bf16[32,128]) -> bf16[64,128] {
  %p0 = bf16[64,32]{1,0} parameter(0)
  %p1 = bf16[32,128]{1,0} parameter(1)
  %d = bf16[64,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = bf16[64,128]{1,0} maximum(%d, %d)
}

ENTRY %main (x: f32[64,32], w: f32[32,128], b: f32[128], xb: bf16[64,32], wb: bf16[32,128]) -> (f32[64,128], bf16[64,128], f32[64,128]) {
  %x = f32[64,32]{1,0} parameter(0)
  %w = f32[32,128]{1,0} parameter(1)
  %b = f32[128]{0} parameter(2)
  %xb = bf16[64,32]{1,0} parameter(3)
  %wb = bf16[32,128]{1,0} parameter(4)
  %gemm = (f32[64,128]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/dot_general" source_file="/src/model.py" source_line=7}, backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"epilogue":"DEFAULT"}}
  %gte = f32[64,128]{1,0} get-tuple-element(%gemm), index=0
  %fusion = f32[64,128]{1,0} fusion(%gte, %b), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(f)/tanh" source_file="/src/model.py" source_line=7}
  %lt = (f32[64,128]{1,0}, s8[1024]{0}) custom-call(%x, %w, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"epilogue":"BIAS_GELU"}}, metadata={op_name="jit(f)/dot_general" source_file="/src/model.py" source_line=9}
  %lt0 = f32[64,128]{1,0} get-tuple-element(%lt), index=0
  %tg = bf16[64,128]{1,0} fusion(%xb, %wb), kind=kCustom, calls=%triton_gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}, metadata={op_name="jit(f)/dot_general" source_file="/src/model.py" source_line=11}
  %ar = f32[64,128]{1,0} all-reduce(%lt0), replica_groups={}, to_apply=%fused_gelu
  %pk = f32[64,128]{1,0} custom-call(%ar), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(f)/pallas_kernels.matmul/pallas_call" source_file="/src/model.py" source_line=12}
  ROOT %out = (f32[64,128]{1,0}, bf16[64,128]{1,0}, f32[64,128]{1,0}) tuple(%fusion, %tg, %pk)
}
"""


def test_gpu_kernel_kinds():
  r = hlo_audit.audit_hlo(GPU)
  kinds = {k.name: k.kind for k in r.kernels}
  assert kinds == {
      "gemm": KernelKind.LIBRARY_CALL, "fusion": KernelKind.LOOP_FUSION,
      "lt": KernelKind.LIBRARY_CALL, "tg": KernelKind.TRITON_GEMM,
      "ar": KernelKind.COLLECTIVE, "pk": KernelKind.PALLAS}
  assert r.kernel("lt").detail == "__cublas$lt$matmul epilogue=BIAS_GELU"
  assert r.kernel("fusion").fused_ops == {"broadcast": 1, "add": 1, "tanh": 1}


def test_cublas_default_epilogue_is_unfused_and_lt_epilogue_already_fused():
  r = hlo_audit.audit_hlo(GPU)
  (epi,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.producer == "gemm" and epi.consumers == ("fusion",)
  assert epi.ops == ("bias", "activation:tanh")
  assert epi.bytes_saved == 2 * 64 * 128 * 4
  assert "epilogue is DEFAULT" in epi.evidence
  assert str(epi.source) == "/src/model.py:7"
  fused = {f.producer: f for f in r.findings_of(FindingKind.ALREADY_FUSED)}
  assert fused["lt"].ops == ("bias", "activation")
  assert "BIAS_GELU" in fused["lt"].evidence
  assert fused["tg"].ops == ("maximum",)
  # A record of what XLA did, nothing to change: no bytes, no layout, keep.
  lt = fused["lt"]
  assert (lt.bytes_saved, lt.launches_removed, lt.layout_effect, lt.verdict, lt.reasons) == (
      0, 0, "none", hlo_audit.Verdict.KEEP, ("XLA already fused this epilogue",))


def test_library_workspace_is_classed():
  r = hlo_audit.audit_hlo(GPU)
  ws = [b for b in r.buffers if b.lifetime is hlo_audit.Lifetime.WORKSPACE]
  assert sorted(b.name for b in ws) == ["gemm{1}", "lt{1}"]
  assert r.buffer("gemm{1}").bytes == 4194304


INTERPRETED_PALLAS = """
HloModule interp, is_scheduled=true

%body (s: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %s = (s32[], f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %one = s32[] constant(1), metadata={op_name="jit(f)/pallas_kernels.scale/while/body/add"}
  %n = s32[] add(%i, %one), metadata={op_name="jit(f)/pallas_kernels.scale/while/body/add"}
  %v = f32[8,128]{1,0} get-tuple-element(%s), index=1
  %m = f32[8,128]{1,0} multiply(%v, %v), metadata={op_name="jit(f)/pallas_kernels.scale/while/body/mul"}
  ROOT %t = (s32[], f32[8,128]{1,0}) tuple(%n, %m)
}

%cond (s: (s32[], f32[8,128])) -> pred[] {
  %s = (s32[], f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %c = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %c), direction=LT, metadata={op_name="jit(f)/pallas_kernels.scale/while/cond/lt"}
}

ENTRY %main (x: f32[8,128]) -> f32[8,128] {
  %x = f32[8,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %copy = f32[8,128]{1,0} copy(%x)
  %init = (s32[], f32[8,128]{1,0}) tuple(%zero, %copy)
  %w = (s32[], f32[8,128]{1,0}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(f)/pallas_kernels.scale/while"}, backend_config={"known_trip_count":{"n":"4"}}
  %r = f32[8,128]{1,0} get-tuple-element(%w), index=1
  ROOT %out = f32[8,128]{1,0} tanh(%r), metadata={op_name="jit(f)/tanh"}
}
"""


def test_interpreted_pallas_kernel_is_one_kernel_and_its_copy_not_a_finding():
  r = hlo_audit.audit_hlo(INTERPRETED_PALLAS)
  pallas = [k for k in r.kernels if k.kind is KernelKind.PALLAS]
  assert len(pallas) == 1
  k = pallas[0]
  assert k.name == "w" and k.detail == "pallas_kernels.scale (interpreted)"
  assert "copy" in k.members and "m" in k.members
  # Across the group's boundary: x in, the loop's state out (its counter too).
  assert (k.bytes_read, k.bytes_written) == (8 * 128 * 4, 8 * 128 * 4 + 4)
  assert not r.findings_of(FindingKind.STANDALONE_COPY)
  assert not r.findings_of(FindingKind.LAYOUT_CONFLICT)
  assert [x.name for x in r.kernels] == ["w", "out"]


SLICED = """
HloModule sliced, is_scheduled=true

%fused_slice (p0: f32[64,128]) -> f32[8,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %v = f32[8,8,128]{2,1,0} bitcast(%p0)
  %s = f32[1,8,128]{2,1,0} slice(%v), slice={[3:4], [0:8], [0:128]}
  %e = f32[1,8,128]{2,1,0} exponential(%s)
  ROOT %r = f32[8,128]{1,0} bitcast(%e)
}

%fused_whole (p0: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  %v = f32[8,8,128]{2,1,0} bitcast(%p0)
  %s = f32[1,8,128]{2,1,0} slice(%v), slice={[3:4], [0:8], [0:128]}
  %e = f32[8,8,128]{2,1,0} exponential(%v)
  %b = f32[64,128]{1,0} bitcast(%e)
  ROOT %r = f32[64,128]{1,0} add(%b, %p0)
}

ENTRY %main (x: f32[64,128]) -> (f32[8,128], f32[64,128]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} negate(%x)
  %part = f32[8,128]{1,0} fusion(%y), kind=kLoop, calls=%fused_slice
  %whole = f32[64,128]{1,0} fusion(%y), kind=kLoop, calls=%fused_whole
  ROOT %out = (f32[8,128]{1,0}, f32[64,128]{1,0}) tuple(%part, %whole)
}
"""


def test_a_slice_seen_through_a_bitcast_reads_only_the_slice():
  kernels = {k.name: k for k in hlo_audit.audit_hlo(SLICED).kernels}
  # One 8x128 row block of the 64x128 operand, through a bitcast view.
  assert kernels["part"].bytes_read == 8 * 128 * 4
  # Read whole beside its slice: the whole operand.
  assert kernels["whole"].bytes_read == 64 * 128 * 4


def test_an_input_of_an_interpreted_kernel_joins_it_through_the_loop_state():
  # A scoped instruction that feeds the launch only through the while's
  # init tuple (glue) is the kernel's input, not a kernel of its own.
  text = INTERPRETED_PALLAS.replace(
      "%copy = f32[8,128]{1,0} copy(%x)",
      '%copy = f32[8,128]{1,0} negate(%x), metadata={op_name="jit(f)/pallas_kernels.scale/neg"}')
  r = hlo_audit.audit_hlo(text)
  (k,) = [k for k in r.kernels if k.kind is KernelKind.PALLAS]
  assert k.name == "w" and "copy" in k.members
  assert [x.name for x in r.kernels] == ["w", "out"]


UPDATES = """
HloModule upd, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_scatter (p0: f32[1024,128], p1: s32[16,1], p2: f32[16,128]) -> f32[1024,128] {
  %p0 = f32[1024,128]{1,0} parameter(0)
  %p1 = s32[16,1]{1,0} parameter(1)
  %p2 = f32[16,128]{1,0} parameter(2)
  ROOT %s = f32[1024,128]{1,0} scatter(%p0, %p1, %p2), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

ENTRY %main (x: f32[1024,128], i: s32[16,1], u: f32[16,128], j: s32[], k: s32[]) -> (f32[1024,128], f32[1024,128], f32[1024,128]) {
  %x = f32[1024,128]{1,0} parameter(0)
  %i = s32[16,1]{1,0} parameter(1)
  %u = f32[16,128]{1,0} parameter(2)
  %j = s32[] parameter(3)
  %k = s32[] parameter(4)
  %y = f32[1024,128]{1,0} negate(%x)
  %z = f32[1024,128]{1,0} exponential(%x)
  %sc = f32[1024,128]{1,0} scatter(%y, %i, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %dus = f32[1024,128]{1,0} dynamic-update-slice(%z, %u, %j, %k)
  %q = f32[1024,128]{1,0} tanh(%x)
  %fsc = f32[1024,128]{1,0} fusion(%q, %i, %u), kind=kLoop, calls=%fused_scatter
  ROOT %out = (f32[1024,128]{1,0}, f32[1024,128]{1,0}, f32[1024,128]{1,0}) tuple(%sc, %dus, %fsc)
}
"""


def test_in_place_updates_touch_only_the_updated_rows():
  kernels = {k.name: k for k in hlo_audit.audit_hlo(UPDATES).kernels}
  rows = 16 * 128 * 4
  # A scatter-add reads the rows it combines into, its indices and updates.
  assert (kernels["sc"].bytes_read, kernels["sc"].bytes_written) == (rows + 16 * 4 + rows, rows)
  # The same scatter as a fusion's root.
  assert (kernels["fsc"].bytes_read, kernels["fsc"].bytes_written) == (rows + 16 * 4 + rows, rows)
  # A dynamic-update-slice reads nothing of the buffer it writes into.
  assert (kernels["dus"].bytes_read, kernels["dus"].bytes_written) == (rows + 2 * 4, rows)
