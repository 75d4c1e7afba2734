"""XLA:TPU's reported temp on hand-written scheduled HLO: twice the heap
aligned to 16 KiB less what is live at once, each tuple table held for the
whole program at its generation's size (liveness.tpu_reported_temp), the
heap packed by best fit in the order its values are defined
(heap_packing.PackingOrder.DEFINITION)."""

from __future__ import annotations

import hlo_audit
from hlo_audit._src import compat
from hlo_audit._src.analysis.dataflow import analyze_dataflow
from hlo_audit._src.analysis.liveness import analyze_liveness
from hlo_audit._src.analysis.schedule import flatten_schedule
from hlo_audit._src.target import tpus

KiB = 1024
T = "{1,0:T(8,128)}"  # f32[n,128]: n x 512 bytes

# %p is a two-output fusion (a tuple: one table); %p0 (128 KiB, steps 1-4),
# %q (64 KiB, 4-5) and %r (192 KiB, 5-6) make the heap; %p1 shares the
# output's allocation. In the order they are defined: the table in the
# first 16 KiB, %p0 above it, %q above %p0 (both live at step 4), and %r,
# live with %q, finds only %p0's 128 KiB below %q: on top, 400 KiB packed.
# (Largest first would put %r and %p0 at 0 and %q above them: 256.5 KiB.)
TWO_OUTPUTS = f"""
HloModule tpu_heap, is_scheduled=true

%fp (a: f32[128,128]) -> (f32[256,128], f32[128,128]) {{
  %a = f32[128,128]{T} parameter(0)
  %c = f32[256,128]{T} concatenate(%a, %a), dimensions={{0}}
  %n = f32[128,128]{T} negate(%a)
  ROOT %t = (f32[256,128]{T}, f32[128,128]{T}) tuple(%c, %n)
}}

%fq (a: f32[256,128]) -> f32[128,128] {{
  %a = f32[256,128]{T} parameter(0)
  ROOT %s = f32[128,128]{T} slice(%a), slice={{[0:128], [0:128]}}
}}

%fr (a: f32[128,128], b: f32[128,128]) -> f32[384,128] {{
  %a = f32[128,128]{T} parameter(0)
  %b = f32[128,128]{T} parameter(1)
  ROOT %c = f32[384,128]{T} concatenate(%a, %b, %a), dimensions={{0}}
}}

%fo (a: f32[384,128]) -> f32[128,128] {{
  %a = f32[384,128]{T} parameter(0)
  ROOT %s = f32[128,128]{T} slice(%a), slice={{[0:128], [0:128]}}
}}

ENTRY %main (x: f32[128,128]) -> f32[128,128] {{
  %x = f32[128,128]{T} parameter(0)
  %p = (f32[256,128]{T}, f32[128,128]{T}) fusion(%x), kind=kLoop, calls=%fp
  %p0 = f32[256,128]{T} get-tuple-element(%p), index=0
  %p1 = f32[128,128]{T} get-tuple-element(%p), index=1
  %q = f32[128,128]{T} fusion(%p0), kind=kLoop, calls=%fq
  %r = f32[384,128]{T} fusion(%p1, %q), kind=kLoop, calls=%fr
  ROOT %o = f32[128,128]{T} fusion(%r), kind=kLoop, calls=%fo
}}
"""

# The heap holds the fusion's table and a scalar an unfused op computes.
SCALAR_AND_TABLE = f"""
HloModule tpu_tables, is_scheduled=true

%fp (a: f32[128,128], k: f32[]) -> (f32[128,128], f32[128,128]) {{
  %a = f32[128,128]{T} parameter(0)
  %k = f32[]{{:T(128)}} parameter(1)
  %b = f32[128,128]{T} broadcast(%k), dimensions={{}}
  %m = f32[128,128]{T} multiply(%a, %b)
  %n = f32[128,128]{T} negate(%a)
  ROOT %t = (f32[128,128]{T}, f32[128,128]{T}) tuple(%m, %n)
}}

ENTRY %main (x: f32[128,128], s: f32[]) -> (f32[128,128], f32[128,128]) {{
  %x = f32[128,128]{T} parameter(0)
  %s = f32[]{{:T(128)}} parameter(1)
  %k = f32[]{{:T(128)}} subtract(%s, %s)
  %p = (f32[128,128]{T}, f32[128,128]{T}) fusion(%x, %k), kind=kLoop, calls=%fp
  %p0 = f32[128,128]{T} get-tuple-element(%p), index=0
  %p1 = f32[128,128]{T} get-tuple-element(%p), index=1
  ROOT %o = (f32[128,128]{T}, f32[128,128]{T}) tuple(%p0, %p1)
}}
"""


def _liveness(text: str, device: str = "", libtpu: str = ""):
  module = hlo_audit.parse_hlo(text)
  schedule = flatten_schedule(module)
  return analyze_liveness(module, schedule, analyze_dataflow(module, schedule),
                          platform="tpu", device=device, libtpu=libtpu)


def _ceil16k(n: int) -> int:
  return -(-n // (16 * KiB)) * 16 * KiB


def test_reported_temp_is_twice_the_aligned_heap_less_what_is_live():
  live = _liveness(TWO_OUTPUTS)
  assert live.allocation_sizes == (64 * KiB, 64 * KiB)  # %x; %o with %p1
  table = 512  # a v5e's, HLO text naming no generation
  packed = 16 * KiB + 128 * KiB + 64 * KiB + 192 * KiB
  most_live = 64 * KiB + 192 * KiB  # %q and %r
  assert live.peak_heap_bytes == 2 * _ceil16k(packed) - (most_live + table) == 556544
  assert live.fragmentation_bytes == live.peak_heap_bytes - most_live
  assert live.peak_bytes == 128 * KiB + 556544


def test_libtpu_0_0_50_keeps_temporaries_out_of_outputs_allocations():
  assert compat.libtpu_temporaries_share_outputs("0.0.42.1")
  assert compat.libtpu_temporaries_share_outputs("")  # HLO text: the fixtures' 0.0.42.1
  assert not compat.libtpu_temporaries_share_outputs("0.0.50.1")
  assert _liveness(TWO_OUTPUTS, libtpu="0.0.42.1").peak_heap_bytes == 556544
  live = _liveness(TWO_OUTPUTS, libtpu="0.0.50.1")
  # %p1 (64 KiB, steps 1-5) is a temporary of the heap, %o's allocation its own.
  assert live.allocation_sizes == (64 * KiB, 64 * KiB)
  assert ("p", (1,)) in live.heap_buffers
  table = 512
  most_live = 64 * KiB + 64 * KiB + 192 * KiB  # %p1, %q and %r at step 5
  assert live.peak_heap_bytes - live.fragmentation_bytes == most_live
  # The table, %p0, %p1 (defined with %p0, dying later), %q and %r stacked:
  # %r finds only %p0's 128 KiB free below them.
  packed = 16 * KiB + 128 * KiB + 64 * KiB + 64 * KiB + 192 * KiB
  assert live.peak_heap_bytes == 2 * _ceil16k(packed) - (most_live + table) == 622080


def test_tables_take_their_generations_size():
  assert tpus.tuple_table_bytes("v4", 106) == tpus.tuple_table_bytes("TPU v5 lite", 3) == 512
  assert tpus.tuple_table_bytes("v6e:2x2", 2) == 32
  assert tpus.tuple_table_bytes("TPU v5", 5) == 64  # a v5p: 40 bytes, rounded up to 32s
  assert tpus.tuple_table_bytes("", 2) == tpus.tuple_table_bytes("h200", 2) == 512
  table = 32  # two elements on a v6e
  assert _liveness(TWO_OUTPUTS, "v6e").peak_heap_bytes == \
      2 * 400 * KiB - (256 * KiB + table)


def test_a_heap_of_tables_and_unfused_scalars_reports_no_temp():
  live = _liveness(SCALAR_AND_TABLE)
  assert live.peak_heap_bytes - live.fragmentation_bytes == 512  # %k, in the heap
  assert live.peak_heap_bytes == 0
  # A fusion's scalar counts: the same heap then reports its packing.
  fused = SCALAR_AND_TABLE.replace(
      "%k = f32[]{:T(128)} subtract(%s, %s)",
      "%k = f32[]{:T(128)} fusion(%s), kind=kLoop, calls=%fk").replace(
      "ENTRY", "%fk (s: f32[]) -> f32[] {\n  %s = f32[]{:T(128)} parameter(0)\n"
      "  ROOT %k = f32[]{:T(128)} negate(%s)\n}\n\nENTRY")
  assert _liveness(fused).peak_heap_bytes == 2 * _ceil16k(16 * KiB + 512) - (512 + 512)


def test_gpu_and_cpu_heaps_are_not_tpus():
  module = hlo_audit.parse_hlo(TWO_OUTPUTS)
  schedule = flatten_schedule(module)
  dataflow = analyze_dataflow(module, schedule)
  assert analyze_liveness(module, schedule, dataflow, platform="cpu").peak_heap_bytes == \
      256 * KiB
