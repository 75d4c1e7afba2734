"""The epilogue XLA:GPU already fused into a Triton gemm fusion: the opcodes
applied to the dot's result before the root, conversions and data movement
left out; XLA's nested form (the dot in a fusion of its own) followed into."""

from __future__ import annotations

from hlo_audit import parse_hlo
from hlo_audit._src.analysis.custom_calls import gemm_fusion_epilogue

_FLAT = """HloModule m, is_scheduled=true

%gemm (p0: bf16[64,128], p1: bf16[128,256], p2: f32[256]) -> bf16[64,256] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  %p2 = f32[256]{0} parameter(2)
  %dot = f32[64,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %b = f32[64,256]{1,0} broadcast(%p2), dimensions={1}
  %add = f32[64,256]{1,0} add(%b, %dot)
  %t = f32[64,256]{1,0} tanh(%add)
  %side = f32[256]{0} negate(%p2)
  ROOT %c = bf16[64,256]{1,0} convert(%t)
}

ENTRY %e (x: bf16[64,128], w: bf16[128,256], bias: f32[256]) -> bf16[64,256] {
  %x = bf16[64,128]{1,0} parameter(0)
  %w = bf16[128,256]{1,0} parameter(1)
  %bias = f32[256]{0} parameter(2)
  ROOT %f = bf16[64,256]{1,0} fusion(%x, %w, %bias), kind=kCustom, calls=%gemm, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
}
"""

_NESTED = """HloModule m, is_scheduled=true

%inner (a: bf16[64,128], b: bf16[128,256]) -> f32[64,256] {
  %a = bf16[64,128]{1,0} parameter(0)
  %b = bf16[128,256]{1,0} parameter(1)
  ROOT %d = f32[64,256]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%gemm (p0: bf16[64,128], p1: bf16[128,256]) -> f32[64,256] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  %nested = f32[64,256]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%inner
  %r = f32[64,256]{1,0} bitcast(%nested)
  %m = f32[64,256]{1,0} multiply(%r, %r)
  ROOT %mx = f32[64,256]{1,0} maximum(%m, %nested)
}

ENTRY %e (x: bf16[64,128], w: bf16[128,256]) -> f32[64,256] {
  %x = bf16[64,128]{1,0} parameter(0)
  %w = bf16[128,256]{1,0} parameter(1)
  ROOT %f = f32[64,256]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm
}
"""


def _epilogue(text: str) -> tuple[str, ...]:
  module = parse_hlo(text)
  return gemm_fusion_epilogue(module, module.entry.root)


def test_the_dot_s_readers_up_to_the_root_without_movement_or_conversions():
  # The bias add and tanh; not the broadcast, the convert, nor the negate
  # that reads a parameter and not the dot.
  assert _epilogue(_FLAT) == ("add", "tanh")


def test_a_bare_dot_has_no_epilogue():
  bare = _FLAT.replace("  %add = f32[64,256]{1,0} add(%b, %dot)\n", "").replace(
      "  %t = f32[64,256]{1,0} tanh(%add)\n", "").replace("convert(%t)", "convert(%dot)")
  assert _epilogue(bare) == ()


def test_the_nested_form_is_followed_into_and_each_opcode_named_once():
  # Both readers of the nested dot's fusion, through a bitcast; sorted.
  assert _epilogue(_NESTED) == ("maximum", "multiply")


def test_a_fusion_calling_nothing_known_has_no_epilogue():
  module = parse_hlo(_FLAT)
  assert gemm_fusion_epilogue(module, module.entry.instruction("x")) == ()
