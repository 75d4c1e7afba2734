"""Buffers XLA keeps on chip (a TPU's VMEM, memory space 1) are not in the
device's footprint, tiles pad what is, and the time model prices on-chip
traffic at the device's on-chip rate."""

from __future__ import annotations

import dataclasses

import pytest

import hlo_audit
from hlo_audit._src.analysis.options import AuditOptions
from hlo_audit._src.hlo.parser import parse_shape

# A v5e-style module: the weight is prefetched into VMEM (S(1)) by a
# copy-start/copy-done pair, the gemm's output stays in VMEM, and only the
# final sum is written to HBM.
_TPU = """HloModule m, is_scheduled=true, entry_computation_layout={(f32[512,256]{1,0:T(8,128)}, f32[256,256]{1,0:T(8,128)})->f32[512,256]{1,0:T(8,128)}}

%fused (a: f32[512,256], b: f32[256,256]) -> f32[512,256] {
  %a = f32[512,256]{1,0:T(8,128)} parameter(0)
  %b = f32[256,256]{1,0:T(8,128)S(1)} parameter(1)
  ROOT %d = f32[512,256]{1,0:T(8,128)S(1)} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused.1 (x: f32[512,256]) -> f32[512,256] {
  %x = f32[512,256]{1,0:T(8,128)S(1)} parameter(0)
  ROOT %y = f32[512,256]{1,0:T(8,128)} add(%x, %x)
}

ENTRY %main (p0: f32[512,256], p1: f32[256,256]) -> f32[512,256] {
  %p0 = f32[512,256]{1,0:T(8,128)} parameter(0)
  %p1 = f32[256,256]{1,0:T(8,128)} parameter(1)
  %cs = (f32[256,256]{1,0:T(8,128)S(1)}, f32[256,256]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%p1)
  %cd = f32[256,256]{1,0:T(8,128)S(1)} copy-done(%cs)
  %g = f32[512,256]{1,0:T(8,128)S(1)} fusion(%p0, %cd), kind=kOutput, calls=%fused
  ROOT %r = f32[512,256]{1,0:T(8,128)} fusion(%g), kind=kLoop, calls=%fused.1
}
"""

MIB_HALF = 512 * 256 * 4


def test_on_chip_and_host_leaves_take_no_device_memory():
  assert parse_shape("f32[512,256]{1,0:T(8,128)S(1)}").device_byte_size == 0
  assert parse_shape("f32[512,256]{1,0:S(5)}").device_byte_size == 0
  assert parse_shape("f32[512,256]{1,0:T(8,128)}").device_byte_size == MIB_HALF
  tup = parse_shape("(f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0:T(8,128)}, u32[]{:S(2)})")
  assert tup.device_byte_size == 8 * 128 * 4


def test_tiles_pad_what_the_device_holds():
  # 7 x 100 floats tile to 8 x 128; a bf16 vector of 7 to a tile of 1024.
  assert parse_shape("f32[7,100]{1,0:T(8,128)}").device_byte_size == 8 * 128 * 4
  assert parse_shape("bf16[7]{0:T(1024)(128)(2,1)}").device_byte_size == 1024 * 2
  assert parse_shape("f32[7,100]{1,0}").device_byte_size == 7 * 100 * 4


def test_the_peak_holds_the_hbm_buffers_only():
  r = hlo_audit.audit_hlo(_TPU)
  # Both parameters and the output in HBM; the prefetched weight and the
  # gemm's output are in VMEM.
  assert r.peak_bytes == 2 * MIB_HALF + 256 * 256 * 4
  assert all("%g" not in name and name != "g" for name in r.live_at_peak)


def test_on_chip_bytes_are_priced_at_the_on_chip_rate():
  v5e = hlo_audit.device_facts("v5e")
  timed = hlo_audit.audit_hlo(_TPU, options=AuditOptions(device=v5e))
  g = {k.name: k for k in timed.timing.kernels}["g"]
  # Reads p0 from HBM; reads the prefetched weight and writes its output on chip.
  assert g.bytes == MIB_HALF
  assert g.on_chip_bytes == 256 * 256 * 4 + MIB_HALF
  assert g.memory_time == pytest.approx(
      MIB_HALF / v5e.memory_bandwidth + g.on_chip_bytes / v5e.on_chip_bandwidth)
  free = dataclasses.replace(v5e, on_chip_bandwidth=0.0)
  g0 = {k.name: k for k in hlo_audit.audit_hlo(
      _TPU, options=AuditOptions(device=free)).timing.kernels}["g"]
  assert g0.memory_time == pytest.approx(MIB_HALF / v5e.memory_bandwidth)


def test_a_tiled_scalar_takes_its_tile():
  # XLA:TPU's footprint counts f32[]{:T(128)} and bf16[]{:T(256)} as 512 bytes.
  assert parse_shape("f32[]{:T(128)}").device_byte_size == 512
  assert parse_shape("bf16[]{:T(256)}").device_byte_size == 512
  assert parse_shape("f32[]").device_byte_size == 4


_CONSTANTS = """HloModule m, is_scheduled=true

%fused (p: f32[8,128], c: f32[]) -> f32[8,128] {
  %p = f32[8,128]{1,0:T(8,128)} parameter(0)
  %c = f32[]{:T(128)} parameter(1)
  %b = f32[8,128]{1,0:T(8,128)} broadcast(%c), dimensions={}
  ROOT %m = f32[8,128]{1,0:T(8,128)} multiply(%p, %b)
}

ENTRY %main (x: f32[8,128]) -> f32[8,128] {
  %x = f32[8,128]{1,0:T(8,128)} parameter(0)
  %k = f32[]{:T(128)} constant(2)
  ROOT %y = f32[8,128]{1,0:T(8,128)} fusion(%x, %k), kind=kLoop, calls=%fused, backend_config={"window_config":{"estimated_cycles":"1828"}}
}
"""


def test_xla_tpus_constants_are_in_the_program_not_the_footprint():
  r = hlo_audit.audit_hlo(_CONSTANTS)  # read as XLA:TPU's (its backend config)
  assert r.peak_bytes == 2 * 8 * 128 * 4
  cpu = hlo_audit.audit_hlo(_CONSTANTS.replace(
      ', backend_config={"window_config":{"estimated_cycles":"1828"}}', ""))
  assert cpu.peak_bytes == 2 * 8 * 128 * 4 + 512  # elsewhere a constant is an allocation


_ASYNC_SLICE = """HloModule m, is_scheduled=true

%wrapped (w: f32[1024,256]) -> f32[256,256] {
  %w = f32[1024,256]{1,0:T(8,128)} parameter(0)
  ROOT %s = f32[256,256]{1,0:T(8,128)S(1)} slice(%w), slice={[0:256], [0:256]}
}

ENTRY %main (p: f32[1024,256]) -> f32[256,256] {
  %p = f32[1024,256]{1,0:T(8,128)} parameter(0)
  %ss = ((f32[1024,256]{1,0:T(8,128)}), f32[256,256]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) async-start(%p), calls=%wrapped
  %sd = f32[256,256]{1,0:T(8,128)S(1)} async-done(%ss)
  ROOT %c = f32[256,256]{1,0:T(8,128)} copy(%sd)
}
"""


def test_an_async_slice_reads_its_slice_and_writes_it_on_chip():
  r = hlo_audit.audit_hlo(_ASYNC_SLICE)
  ss = {k.name: k for k in r.kernels}["ss"]
  assert ss.bytes_read == 256 * 256 * 4  # not the whole operand
  assert ss.bytes_written == 0           # its operand's slot is the operand; the slice is in VMEM


def test_a_kernels_scoped_vmem_is_its_on_chip_scratch():
  from hlo_audit._src.report import text
  scoped = _CONSTANTS.replace(
      '{"window_config":{"estimated_cycles":"1828"}}',
      '{"window_config":{"estimated_cycles":"1828"},"used_scoped_memory_configs":'
      '[{"memory_space":"1","offset":"0","size":"1048576"},'
      '{"memory_space":"0","offset":"0","size":"4096"}]}')
  r = hlo_audit.audit_hlo(scoped, options=AuditOptions(device="v5e"))
  y = {k.name: k for k in r.kernels}["y"]
  assert y.on_chip_scratch == 1 << 20  # VMEM only: space 0 is HBM
  assert "Scratch" in text.kernel_columns(r)
  row = dict(zip(text.kernel_columns(r), text.kernel_rows(r)[0]))
  assert row["Scratch"] == "1.00 MiB"
  cpu = hlo_audit.audit_hlo(_TPU.replace("S(1)", ""))
  assert text.kernel_columns(cpu) == text.KERNEL_COLUMNS  # nothing on chip
