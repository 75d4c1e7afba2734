"""Custom-call classification: library gemms with epilogues, user kernels, unknowns."""

from __future__ import annotations

import hlo_audit
from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis import custom_calls
from hlo_audit._src.analysis.custom_calls import CallFamily
from hlo_audit._src.analysis.records import FindingKind

_HLO = r"""
HloModule m, is_scheduled=true

ENTRY e {
  a = f16[64,128]{1,0} parameter(0)
  b = f16[128,256]{1,0} parameter(1)
  bias = f16[256]{0} parameter(2)
  lt = (f16[64,256]{1,0}, s8[4194304]{0}) custom-call(a, b, bias), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"alpha_imag":0,"precision_config":{"operand_precision":["DEFAULT","DEFAULT"]},"epilogue":"BIAS_GELU"}}
  y = f16[64,256]{1,0} get-tuple-element(lt), index=0
  k = f16[64,256]{1,0} custom-call(y), custom_call_target="__gpu$xla.gpu.triton", api_version=API_VERSION_TYPED_FFI
  ROOT z = f16[64,256]{1,0} custom-call(k), custom_call_target="my_vendor$mystery"
}
"""


def test_targets_are_classified_and_the_epilogue_read():
  module = hlo_audit.parse_hlo(_HLO)
  calls = {name: c for _, name, c in custom_calls.custom_calls(module)}
  assert calls["lt"].family is CallFamily.GEMM and calls["lt"].provider == "cuBLASLt"
  assert calls["lt"].epilogue == "BIAS_GELU" and calls["lt"].fused == ("bias", "activation")
  assert calls["k"].family is CallFamily.USER_KERNEL
  assert calls["z"].family is CallFamily.UNKNOWN and not calls["z"].known
  assert custom_calls.classify_target("mosaic_gpu_v2")[0] is CallFamily.USER_KERNEL
  assert custom_calls.classify_target("__cudnn$fmhaSoftmax")[0] is CallFamily.ATTENTION
  assert custom_calls.classify_target("MoveToHost")[0] is CallFamily.MARKER
  # An unknown target names no provider (the report does not invent one).
  assert custom_calls.classify_target("my_vendor$mystery") == (CallFamily.UNKNOWN, "")


def test_report_lists_unknown_targets_and_the_fused_epilogue():
  report = hlo_audit.audit_hlo(_HLO)
  [note] = [n for n in report.notes if "unknown custom-call targets" in n]
  assert "'my_vendor$mystery'" in note and "triton" not in note
  already = [f for f in report.findings if f.kind is FindingKind.ALREADY_FUSED]
  assert [f.producer for f in already] == ["lt"]
  assert "epilogue=BIAS_GELU" in already[0].evidence


_CONV = r"""
HloModule c, is_scheduled=true

ENTRY e {
  x = f32[16,16,16,16]{3,2,1,0} parameter(0)
  w = f32[16,3,3,16]{3,2,1,0} parameter(1)
  b = f32[16]{0} parameter(2)
  r = f32[16,16,16,16]{3,2,1,0} parameter(3)
  ROOT c = (f32[16,16,16,16]{3,2,1,0}, u8[0]{0}) custom-call(x, w, b, r), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBiasActivationForward", backend_config={"operation_queue_id":"0","cudnn_conv_backend_config":{"activation_mode":"MODE","conv_result_scale":1,"side_input_scale":SIDE,"leakyrelu_alpha":0}}
}
"""


def test_cudnns_fused_convolution_names_the_work_it_runs_after_the_convolution():
  def work(mode: str, side: str) -> tuple[str, ...]:
    module = hlo_audit.parse_hlo(_CONV.replace("MODE", mode).replace("SIDE", side))
    return bt.conv_epilogue(module.entry.instruction("c"))
  assert work("kNone", "0") == ("bias",)
  # A side input scaled in (a residual added before the activation).
  assert work("kRelu", "1") == ("bias", "residual", "activation:relu")
  assert work("kRelu", "0") == ("bias", "activation:relu")
