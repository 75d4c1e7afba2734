"""The work a kernel does, counted from the HLO: FLOPs by unit, and how it
touches memory."""

from __future__ import annotations

import gzip
import pathlib

import pytest

import hlo_audit
from hlo_audit._src.analysis.work import computation_work, kernel_work

H200 = pathlib.Path(__file__).parents[1] / "real_models" / "h200"


def work_of(text: str, kernel: str):
  module = hlo_audit.parse_hlo(text)
  comp = module.entry
  return kernel_work(module, comp, comp.instruction(kernel))


def test_a_batched_dot_counts_two_flops_per_multiply_add_of_its_contraction():
  # [4, 128, 64] x [4, 64, 256]: 4 batches of 128x256 outputs, each summing 64.
  w = work_of("""HloModule m
ENTRY %e (a: bf16[4,128,64], b: bf16[4,64,256]) -> bf16[4,128,256] {
  %a = bf16[4,128,64]{2,1,0} parameter(0)
  %b = bf16[4,64,256]{2,1,0} parameter(1)
  ROOT %d = bf16[4,128,256]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}""", "d")
  assert dict(w.matrix_flops) == {"bf16": 2 * 4 * 128 * 256 * 64}
  assert w.vector_flops == 0 and w.narrowest == 64
  assert w.orientation == "nn"


@pytest.mark.parametrize("lhs_layout, rhs_layout, expected", [
    ("{1,0}", "{1,0}", "nn"),   # a[M,K] row-major, b[K,N] row-major
    ("{1,0}", "{0,1}", "nt"),   # b stored as [N,K]: contracts its minor dimension
    ("{0,1}", "{1,0}", "tn"),   # a stored as [K,M]
])
def test_a_dot_says_how_it_reads_its_operands(lhs_layout, rhs_layout, expected):
  w = work_of(f"""HloModule m
ENTRY %e (a: f32[128,64], b: f32[64,32]) -> f32[128,32] {{
  %a = f32[128,64]{lhs_layout} parameter(0)
  %b = f32[64,32]{rhs_layout} parameter(1)
  ROOT %d = f32[128,32]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}""", "d")
  assert w.orientation == expected


def test_highest_precision_f32_runs_on_the_vector_unit():
  w = work_of("""HloModule m
ENTRY %e (a: f32[128,64], b: f32[64,32]) -> f32[128,32] {
  %a = f32[128,64]{1,0} parameter(0)
  %b = f32[64,32]{1,0} parameter(1)
  ROOT %d = f32[128,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
}""", "d")
  assert not w.matrix_flops and w.vector_flops == 2 * 128 * 32 * 64


def test_a_convolution_counts_its_window_and_input_features():
  # NHWC 3x3 convolution, 16 -> 32 features, 8x32x32 outputs: each output
  # sums 3 * 3 * 16 products, less those on the padding (as XLA's cost
  # analysis counts): per spatial dimension 32 * 3 positions, 2 on the pad.
  w = work_of("""HloModule m
ENTRY %e (x: f32[8,32,32,16], k: f32[3,3,16,32]) -> f32[8,32,32,32] {
  %x = f32[8,32,32,16]{3,2,1,0} parameter(0)
  %k = f32[3,3,16,32]{3,2,1,0} parameter(1)
  ROOT %c = f32[8,32,32,32]{3,2,1,0} convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}""", "c")
  real = (94 / 96) ** 2
  assert dict(w.matrix_flops) == {"f32": round(2 * (8 * 32 * 32 * 32) * (3 * 3 * 16) * real)}
  assert w.narrowest == round(3 * 3 * 16 * real)
  unpadded = work_of("""HloModule m
ENTRY %e (x: f32[8,34,34,16], k: f32[3,3,16,32]) -> f32[8,32,32,32] {
  %x = f32[8,34,34,16]{3,2,1,0} parameter(0)
  %k = f32[3,3,16,32]{3,2,1,0} parameter(1)
  ROOT %c = f32[8,32,32,32]{3,2,1,0} convolution(%x, %k), window={size=3x3}, dim_labels=b01f_01io->b01f
}""", "c")
  assert dict(unpadded.matrix_flops) == {"f32": 2 * (8 * 32 * 32 * 32) * (3 * 3 * 16)}


def test_a_tpu_batched_matmul_counts_one_window_position_in_its_batch():
  # XLA:TPU's attention scores: q [4,255,8,64] x k [4,255,8,64] -> [4,8,255,255]
  # as a convolution whose window over the batch (4) and heads (8) lands on
  # one real element of each dilated run: 2 * 4 * 8 * 255 * 255 * 64 FLOPs.
  w = work_of("""HloModule m
ENTRY %e (q: bf16[4,255,8,64], k: bf16[4,255,8,64]) -> f32[4,8,255,255] {
  %q = bf16[4,255,8,64]{1,3,2,0} parameter(0)
  %k = bf16[4,255,8,64]{1,3,2,0} parameter(1)
  ROOT %c = f32[4,8,255,255]{2,3,1,0} convolution(%q, %k), window={size=4x8 stride=3x7 lhs_dilate=4x8}, dim_labels=0b1f_0o1i->01bf
}""", "c")
  assert dict(w.matrix_flops) == {"bf16": 2 * 4 * 8 * 255 * 255 * 64}
  assert w.narrowest == 64


_FUSION = """HloModule m

%f (p: f32[64,256], q: f32[64,256]) -> f32[64] {
  %p = f32[64,256]{1,0} parameter(0)
  %q = f32[64,256]{1,0} parameter(1)
  %m = f32[64,256]{1,0} multiply(%p, %q)
  %e = f32[64,256]{1,0} exponential(%m)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%e, %z), dimensions={1}, to_apply=%add
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %e (x: f32[64,256], y: f32[64,256]) -> f32[64] {
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  ROOT %k = f32[64]{0} fusion(%x, %y), kind=kInput, calls=%f, backend_config={"outer_dimension_partitions":["2"]}
}"""


def test_a_fusion_counts_elementwise_transcendental_and_reduction_work():
  w = work_of(_FUSION, "k")
  n = 64 * 256
  assert w.transcendentals == n           # exp
  assert w.vector_flops == n + n          # the multiply, and the reduce's adds
  assert w.reduce_elements == n
  assert not w.matrix_flops and not w.strided  # a row reduction reads in order
  assert w.parallel                       # XLA:CPU split it over threads


def test_work_of_a_fused_computation_is_counted_once_per_computation():
  module = hlo_audit.parse_hlo(_FUSION)
  cache: dict = {}
  first = computation_work(module, "f", cache)
  assert cache["f"] is first and computation_work(module, "f", cache) is first


@pytest.mark.parametrize("dims, strided", [
    ("{2}", False),     # rows: the minor dimension
    ("{1}", False),     # columns of each [16,32] block: vectors summed in order
    ("{0}", False),     # columns: the major dimension
    ("{0,2}", True),    # the minor dimension and one beyond a kept one
])
def test_a_reduction_is_strided_when_it_reduces_across_a_kept_dimension(dims, strided):
  text = """HloModule m
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (x: f32[8,16,32]) -> f32[RESULT] {
  %x = f32[8,16,32]{2,1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[RESULT]{LAYOUT} reduce(%x, %z), dimensions=DIMS, to_apply=%add
}"""
  result = {"{2}": ("8,16", "1,0"), "{1}": ("8,32", "1,0"), "{0}": ("16,32", "1,0"),
            "{0,2}": ("16", "0")}[dims]
  text = text.replace("RESULT", result[0]).replace("LAYOUT", result[1]).replace("DIMS", dims)
  assert work_of(text, "r").strided is strided


def test_a_transpose_reading_its_operands_minor_dimension_along_rows_is_not_strided():
  # The operand's minor dimension is its dim 1 ({1,2,0}); the result's minor
  # dimension (its dim 2) is the operand's dim 1: rows copied whole.
  w = work_of("""HloModule m
ENTRY %e (x: f32[4,8,16]) -> f32[16,4,8] {
  %x = f32[4,8,16]{1,2,0} parameter(0)
  ROOT %t = f32[16,4,8]{2,1,0} transpose(%x), dimensions={2,0,1}
}""", "t")
  assert not w.strided


@pytest.mark.parametrize("shape, perm, layout, strided", [
    ("f32[64,32]", "{1,0}", "{1,0}", True),              # a 2D transpose
    ("f32[4,16,8,64]", "{0,2,1,3}", "{3,2,1,0}", False),  # heads swapped, rows kept
    ("f32[32,64]", "{1,0}", "{0,1}", False),              # only the layout changes
])
def test_a_transpose_is_strided_when_it_moves_the_minor_dimension(shape, perm, layout,
                                                                  strided):
  source = {"f32[64,32]": "f32[32,64]", "f32[4,16,8,64]": "f32[4,8,16,64]",
            "f32[32,64]": "f32[64,32]"}[shape]
  w = work_of(f"""HloModule m
ENTRY %e (x: {source}) -> {shape} {{
  %x = {source}{{{",".join(str(i) for i in reversed(range(shape.count(",") + 1)))}}} parameter(0)
  ROOT %t = {shape}{layout} transpose(%x), dimensions={perm}
}}""", "t")
  assert w.strided is strided
  assert w.flops == 0


def test_a_cublas_call_counts_its_gemm_and_not_its_workspace():
  # XLA:GPU's compile for an H200 of a flax MLP: [128,256] x [256,512] + bias
  # through cuBLASLt, whose second result is a 4 MiB workspace.
  module = hlo_audit.parse_hlo(gzip.decompress(
      (H200 / "cublas_mlp.hlo.gz").read_bytes()).decode())
  comp = module.entry
  inst = comp.instruction("cublas-lt-matmul.3")
  w = kernel_work(module, comp, inst)
  assert dict(w.matrix_flops) == {"f32": 2 * 128 * 512 * 256}
  assert w.scratch_bytes == 4194304


_SCATTER = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%scatter (x: f32[1000,2], i: s32[14031], u: f32[14031,2]) -> f32[1000,2] {
  %x = f32[1000,2]{1,0:T(8,128)} parameter(0)
  %i = s32[14031]{0:T(1024)} parameter(1)
  %u = f32[14031,2]{1,0:T(8,128)} parameter(2)
  ROOT %s = f32[1000,2]{1,0:T(8,128)} scatter(%x, %i, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
}

%fill (z: f32[]) -> f32[1000,2] {
  %z = f32[] parameter(0)
  ROOT %b = f32[1000,2]{1,0:T(8,128)} broadcast(%z), dimensions={}
}

%filled (z: f32[], i: s32[14031], u: f32[14031,2]) -> f32[1000,2] {
  %z = f32[] parameter(0)
  %i = s32[14031]{0:T(1024)} parameter(1)
  %u = f32[14031,2]{1,0:T(8,128)} parameter(2)
  %f = f32[1000,2]{1,0:T(8,128)} fusion(%z), kind=kLoop, calls=%fill
  ROOT %n = f32[1000,2]{1,0:T(8,128)} fusion(%f, %i, %u), kind=kCustom, calls=%scatter
}

%passed (x: f32[1000,2], i: s32[14031], u: f32[14031,2]) -> f32[1000,2] {
  %x = f32[1000,2]{1,0:T(8,128)} parameter(0)
  %i = s32[14031]{0:T(1024)} parameter(1)
  %u = f32[14031,2]{1,0:T(8,128)} parameter(2)
  ROOT %n = f32[1000,2]{1,0:T(8,128)} fusion(%x, %i, %u), kind=kCustom, calls=%scatter
}

%gather (x: f32[1000,256], i: s32[9000]) -> f32[9000,256] {
  %x = f32[1000,256]{1,0:T(8,128)} parameter(0)
  %i = s32[9000]{0:T(1024)} parameter(1)
  ROOT %g = f32[9000,256]{1,0:T(8,128)} gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,256}
}

ENTRY %e (x: f32[1000,2], i: s32[14031], u: f32[14031,2], z: f32[], t: f32[1000,256], j: s32[9000]) -> (f32[1000,2], f32[1000,2], f32[1000,2], f32[9000,256]) {
  %x = f32[1000,2]{1,0:T(8,128)} parameter(0)
  %i = s32[14031]{0:T(1024)} parameter(1)
  %u = f32[14031,2]{1,0:T(8,128)} parameter(2)
  %z = f32[] parameter(3)
  %t = f32[1000,256]{1,0:T(8,128)} parameter(4)
  %j = s32[9000]{0:T(1024)} parameter(5)
  %into_buffer = f32[1000,2]{1,0:T(8,128)} fusion(%x, %i, %u), kind=kCustom, calls=%scatter
  %into_fill = f32[1000,2]{1,0:T(8,128)} fusion(%z, %i, %u), kind=kCustom, calls=%filled
  %into_passed = f32[1000,2]{1,0:T(8,128)} fusion(%x, %i, %u), kind=kCustom, calls=%passed
  %rows = f32[9000,256]{1,0:T(8,128)} fusion(%t, %j), kind=kCustom, calls=%gather
  ROOT %r = (f32[1000,2]{1,0:T(8,128)}, f32[1000,2]{1,0:T(8,128)}, f32[1000,2]{1,0:T(8,128)}, f32[9000,256]{1,0:T(8,128)}) tuple(%into_buffer, %into_fill, %into_passed, %rows)
}
"""


def test_a_scatter_records_one_update_window_per_index():
  (a,) = work_of(_SCATTER, "into_buffer").indexed
  # 14031 updates, each a row of 2 along the operand's minor dimension.
  assert (a.indices, a.minor, a.second_minor, a.rest) == (14031, 2, 1, 1)
  assert a.element_bytes == 4 and a.writes


def test_a_gather_records_one_slice_per_index_and_only_reads():
  (a,) = work_of(_SCATTER, "rows").indexed
  assert (a.indices, a.minor, a.second_minor, a.rest) == (9000, 256, 1, 1)
  assert not a.writes


def test_a_scatter_into_a_fill_its_kernel_makes_has_no_per_index_writes():
  # XLA:TPU writes the updates where its kernel made the fill; a scatter
  # whose operand is a buffer the kernel reads (even through a nested
  # fusion) updates it index by index.
  assert work_of(_SCATTER, "into_fill").indexed == ()
  assert len(work_of(_SCATTER, "into_passed").indexed) == 1
