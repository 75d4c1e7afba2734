"""XLA:TPU's HLO read right, on small modules written as XLA:TPU prints them:
the module is recognized as TPU's; memory-space assignment's moves between
HBM and VMEM are no copies; a buffer kept in VMEM is no boundary written to
HBM; an output copied out of VMEM is the output's one write; and an array
written whole for a gather of a few of its elements is found."""

from __future__ import annotations

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.analysis import backend_traits as bt
from hlo_audit._src.analysis.buffer_sharing import infer_platform

_CFG = ('backend_config={"flag_configs":[],"window_config":{"kernel_window_bounds":[],'
        '"estimated_cycles":"1824"}}')

#: An elementwise kernel writes a log-softmax-like f32 [256, 4096] to HBM;
#: a custom fusion gathers 256 of its elements (one per row). `{space}` is
#: where the array lives, `{rows}` how many elements the gather reads.
_GATHERED = """HloModule step, is_scheduled=true

%shift (p0: bf16[256,4096], p1: f32[256]) -> f32[256,4096] {
  %p0 = bf16[256,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %cv = f32[256,4096]{1,0:T(8,128)} convert(%p0)
  %p1 = f32[256]{0:T(256)} parameter(1)
  %b = f32[256,4096]{1,0:T(8,128)} broadcast(%p1), dimensions={0}
  ROOT %s = f32[256,4096]{1,0:T(8,128)} subtract(%cv, %b)
}

%pick (q0: f32[256,4096], q1: s32[ROWS,2]) -> f32[ROWS] {
  %q0 = f32[256,4096]{1,0:T(8,128)} parameter(0)
  %q1 = s32[ROWS,2]{1,0:T(8,128)} parameter(1)
  ROOT %g = f32[ROWS]{0:T(256)} gather(%q0, %q1), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
}

ENTRY %main (x: bf16[256,4096], m: f32[256], i: s32[ROWS,2]) -> f32[ROWS] {
  %x = bf16[256,4096]{1,0:T(8,128)(2,1)} parameter(0)
  %m = f32[256]{0:T(256)} parameter(1)
  %i = s32[ROWS,2]{1,0:T(8,128)} parameter(2)
  %logp = f32[256,4096]{1,0:T(8,128)SPACE} fusion(%x, %m), kind=kLoop, calls=%shift, CFG
  ROOT %gather_fusion = f32[ROWS]{0:T(256)} fusion(%logp, %i), kind=kCustom, calls=%pick, CFG
}
"""


def _gathered(space: str = "", rows: int = 256) -> str:
  return (_GATHERED.replace("SPACE", space).replace("ROWS", str(rows))
          .replace("CFG", _CFG))


def test_xla_tpu_hlo_is_recognized():
  assert infer_platform(hlo_audit.parse_hlo(_gathered())) == "tpu"
  assert hlo_audit.audit_hlo(_gathered()).program.platform == "tpu"
  # Without XLA:TPU's backend configs, the platform stays unknown.
  plain = _gathered().replace(", " + _CFG, "")
  assert infer_platform(hlo_audit.parse_hlo(plain)) == ""


def test_an_array_written_only_for_a_gather_of_its_rows_is_found():
  r = hlo_audit.audit_hlo(_gathered())
  (f,) = [f for f in r.findings if f.boundary == "logp"]
  assert f.kind is FindingKind.UNFUSED_PROLOGUE and f.ops == ("gather", "elementwise")
  assert f.consumers == ("gather_fusion",) and f.bytes_saved == 256 * 4096 * 4
  assert "gathering 256 of its 1048576 elements" in f.evidence


def test_a_gather_reading_much_of_the_array_is_no_finding():
  # 1/4 of the elements gathered: the array is worth writing.
  r = hlo_audit.audit_hlo(_gathered(rows=256 * 1024))
  assert not [f for f in r.findings if f.boundary == "logp"]


def test_an_array_kept_in_vmem_is_no_boundary():
  # The same array in S(1): never written to HBM, so nothing to save there.
  r = hlo_audit.audit_hlo(_gathered(space="S(1)"))
  assert not [f for f in r.findings if f.boundary == "logp"]


#: Memory-space assignment: a parameter prefetched into VMEM (copy-start /
#: copy-done), a kernel's VMEM result evicted to HBM and read back later,
#: and a VMEM result copied out to the (HBM) output with a relayout.
_STAGED = """HloModule step, is_scheduled=true

%twice (p: f32[512,512]) -> f32[512,512] {
  %p = f32[512,512]{1,0:T(8,128)} parameter(0)
  ROOT %a = f32[512,512]{1,0:T(8,128)} add(%p, %p)
}

ENTRY %main (w: f32[512,512]) -> (f32[512,512], f32[512,512]) {
  %w = f32[512,512]{1,0:T(8,128)} parameter(0)
  %copy-start = (f32[512,512]{1,0:T(8,128)S(1)}, f32[512,512]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%w)
  %copy-done = f32[512,512]{1,0:T(8,128)S(1)} copy-done(%copy-start)
  %y = f32[512,512]{1,0:T(8,128)S(1)} fusion(%copy-done), kind=kLoop, calls=%twice, CFG
  %copy-start.1 = (f32[512,512]{1,0:T(8,128)}, f32[512,512]{1,0:T(8,128)S(1)}, u32[]{:S(2)}) copy-start(%y)
  %copy-done.1 = f32[512,512]{1,0:T(8,128)} copy-done(%copy-start.1)
  %z = f32[512,512]{1,0:T(8,128)S(1)} fusion(%copy-done.1), kind=kLoop, calls=%twice, CFG
  %out = f32[512,512]{0,1:T(8,128)} copy(%z), CFG
  ROOT %t = (f32[512,512]{1,0:T(8,128)}, f32[512,512]{0,1:T(8,128)}) tuple(%copy-done.1, %out)
}
""".replace("CFG", _CFG)


def test_moves_between_memory_spaces_are_staging():
  m = hlo_audit.parse_hlo(_STAGED)
  entry = m.entry
  for name in ("copy-start", "copy-done", "copy-start.1", "copy-done.1"):
    assert bt.stages_memory_space(entry, entry.instruction(name)), name
  assert bt.moves_memory_space(entry, entry.instruction("out"))


def test_a_same_space_async_copy_is_a_copy():
  # XLA:GPU's async copies stay in device memory: a copy like any other.
  m = hlo_audit.parse_hlo(_STAGED.replace("S(1)", ""))
  entry = m.entry
  assert not bt.stages_memory_space(entry, entry.instruction("copy-start"))
  assert not bt.stages_memory_space(entry, entry.instruction("copy-done.1"))
  assert not bt.moves_memory_space(entry, entry.instruction("out"))


def test_prefetches_evictions_and_output_writes_are_no_copies():
  r = hlo_audit.audit_hlo(_STAGED)
  copies = r.findings_of(FindingKind.STANDALONE_COPY)
  assert not copies, [(f.boundary, f.ops) for f in copies]
  # In one memory space the relayout copy into the output is a finding again
  # (the check that the rule, not the module, silences it).
  same = hlo_audit.audit_hlo(_STAGED.replace("S(1)", ""))
  assert [f.boundary for f in same.findings_of(FindingKind.STANDALONE_COPY)]
