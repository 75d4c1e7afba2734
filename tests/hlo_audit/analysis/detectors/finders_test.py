"""One finder per finding class, each `find(program)` over the audit's program.

The detectors package holds a module per fusion class (and the shared
helpers and the merge); the memory and collective findings take the same
program. Each finder reports only its own classes, together they cover every
class once, and the modules import one way: a class module reads `common`,
never another class module.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib

import pytest

import hlo_audit
from hlo_audit import FindingKind, NumericalClass, Verdict
from hlo_audit._src import audit as audit_mod
from hlo_audit._src.analysis import collectives, detectors, memory_findings
from hlo_audit._src.analysis.detectors import (already_fused, broadcasts, copies, epilogues,
                                               in_place, keep_reuse, loop_invariant, merge,
                                               prologues, reductions, slices)
from tests.hlo_audit.real_models.h200_support import fixture

K = FindingKind
#: Each finder and the classes it reports.
CLASSES = {
    copies.find: {K.STANDALONE_COPY, K.LAYOUT_CONFLICT},
    broadcasts.find: {K.EXPANDED_BROADCAST},
    epilogues.find: {K.UNFUSED_EPILOGUE},
    already_fused.find: {K.ALREADY_FUSED},
    prologues.find: {K.UNFUSED_PROLOGUE},
    reductions.find: {K.SEPARATE_REDUCTION},
    slices.find: {K.MATERIALIZED_SLICE},
    loop_invariant.find: {K.LOOP_INVARIANT},
    keep_reuse.find: {K.KEEP_REUSE},
    in_place.find: {K.LOST_IN_PLACE},
    memory_findings.find: {K.UNDONATED_ARGUMENT, K.REMAT_CANDIDATE, K.COSTLY_REMAT},
    collectives.find: {K.EXPOSED_COLLECTIVE, K.RESHARD_AROUND_COLLECTIVE,
                       K.COLLECTIVE_MATMUL, K.REPLICATED_BUFFER},
}

# An async all-gather with nothing to hide it, read only by a dot, and a
# replicated parameter four partitions could split.
_SHARDED = """
HloModule sharded, is_scheduled=true, num_partitions=4

ENTRY %main {
  %x = f32[64,256]{1,0} parameter(0), sharding={replicated}
  %w = f32[256,256]{1,0} parameter(1), sharding={replicated}
  %ags = (f32[64,256]{1,0}, f32[256,256]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %agd = f32[256,256]{1,0} all-gather-done(%ags)
  ROOT %dot = f32[256,256]{1,0} dot(%agd, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

#: XLA:GPU's programs for an H200 (committed fixtures; kv_decode's donated
#: caches lose their in-place updates), and the program above.
PROGRAMS = ("bert_mlm", "lstm", "scan_remat", "dp_mlp", "kv_decode", "sharded")


@functools.cache
def report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(_SHARDED if name == "sharded" else fixture(name))


def test_every_class_has_exactly_one_finder():
  seen = [k for kinds in CLASSES.values() for k in kinds]
  assert sorted(seen, key=list(K).index) == list(K)


def test_the_audit_runs_the_detectors_then_memory_then_collectives():
  assert audit_mod.FINDERS == (detectors.find, memory_findings.find, collectives.find)
  assert detectors.DETECTORS == tuple(f for f in CLASSES if f.__module__.startswith(
      detectors.__name__ + "."))


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_finder_reports_its_own_classes_as_a_tuple(name):
  program = report(name).program
  for find, kinds in CLASSES.items():
    found = find(program)
    assert isinstance(found, tuple), find.__module__
    assert {f.kind for f in found} <= kinds, find.__module__


def test_across_the_programs_every_finder_finds_something():
  found = {find for name in PROGRAMS for find in CLASSES
           if find(report(name).program)}
  # No fixture writes a broadcast at full size for its readers.
  assert set(CLASSES) - found == {broadcasts.find}


def test_the_package_finds_what_the_report_holds():
  r = report("bert_mlm")
  fusion = {(f.kind, f.boundary, f.producer) for f in detectors.decisions(r.program)}
  reported = {(f.kind, f.boundary, f.producer) for f in r.findings
              if f.kind in set().union(*(CLASSES[d] for d in detectors.DETECTORS))}
  assert fusion == reported and fusion


def test_the_report_keeps_the_program_but_not_the_finders_tables():
  tables = hlo_audit.audit_hlo(fixture("lstm")).program.tables
  assert tables == type(tables)()


# ----------------------------------------------------------------- merge ----


def record(kind, boundary, producer="p", consumers=("c",), verdict=Verdict.SAFE,
           saved=100, **kwargs):
  return hlo_audit.FusionDecisionRecord(
      kind=kind, producer=producer, consumers=consumers, boundary=boundary,
      boundary_shape="f32[8]", bytes_saved=saved, launches_removed=1,
      extra_arithmetic="none", extra_resources="none",
      numerical_class=NumericalClass.EXACT, guard="none", layout_effect="none",
      evidence=f"{kind.slug} at {boundary}", verdict=verdict, reasons=(), risks=(),
      **kwargs)


def test_a_prologue_an_epilogue_reads_becomes_its_note():
  epilogue = record(K.UNFUSED_EPILOGUE, "dot.1", producer="dot.1", consumers=("cast.2",))
  prologue = record(K.UNFUSED_PROLOGUE, "cast.2", producer="cast.2",
                    consumers=("dot.3",), ops=("cast",))
  other = record(K.UNFUSED_PROLOGUE, "cast.4", producer="cast.4", consumers=("dot.5",))
  out = merge.epilogue_or_prologue([epilogue, prologue, other])
  assert [r.boundary for r in out] == ["dot.1", "cast.4"]
  assert out[0].notes == ("alternatively a prologue of dot.3: cast.2 writes f32[8] "
                          "(cast) only for matmuls",)
  assert merge.epilogue_or_prologue([other]) == [other]


def test_a_split_whose_readers_each_relay_a_block_out_becomes_their_note():
  # A fused QKV product cut into q, k and v, each transposed for the
  # attention gemms: writing the blocks in those layouts, or reading them in
  # place, takes the same traffic away; the total counts it once.
  split = record(K.UNFUSED_EPILOGUE, "dot.1", producer="dot.1",
                 consumers=("t.2", "t.3"), ops=("split:2",))
  relayouts = [record(K.LAYOUT_CONFLICT, t, producer=t, consumers=("dot.9",),
                      ops=("transpose",)) for t in ("t.2", "t.3")]
  out = merge.split_or_relayouts([split, *relayouts])
  assert [r.boundary for r in out] == ["t.2", "t.3"]
  assert out[0].notes[0].startswith("alternatively an epilogue of dot.1")
  # One reader that does not relay its block keeps the split a finding.
  assert merge.split_or_relayouts([split, relayouts[0]]) == [split, relayouts[0]]
  # Nor is an elementwise epilogue's reader folded.
  plain = dataclasses.replace(split, ops=("activation:gelu",))
  assert merge.split_or_relayouts([plain, *relayouts]) == [plain, *relayouts]


def test_one_record_per_boundary_the_strongest_actionable_first():
  keep = record(K.KEEP_REUSE, "b", verdict=Verdict.KEEP, saved=0)
  copy = record(K.STANDALONE_COPY, "b", saved=50)
  epilogue = record(K.UNFUSED_EPILOGUE, "b", verdict=Verdict.RISKY)
  elsewhere = dataclasses.replace(copy, computation="body")
  fused = record(K.ALREADY_FUSED, "")
  out = merge.one_per_boundary([keep, copy, epilogue, elsewhere, fused])
  assert [r.kind for r in out] == [K.ALREADY_FUSED, K.STANDALONE_COPY, K.STANDALONE_COPY]
  assert out[1].notes == (f"also unfused epilogue (risky): {epilogue.evidence}",
                          f"also multi-consumer buffer worth keeping (keep): "
                          f"{keep.evidence}")
  assert out[2] == elsewhere


# --------------------------------------------------------------- imports ----

PACKAGE = pathlib.Path(detectors.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
  """The modules of the detectors package `path` imports."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
      out |= {n for n in names if n.startswith(detectors.__name__)}
  return {n.removeprefix(detectors.__name__).lstrip(".").partition(".")[0] or "detectors"
          for n in out}


def test_class_modules_import_common_only():
  modules = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
  assert modules.pop("__init__") >= {f.__module__.rpartition(".")[2]
                                     for f in detectors.DETECTORS}
  assert modules.pop("common") == set() and modules.pop("merge") == set()
  assert all(imported <= {"common"} for imported in modules.values()), modules


def test_remat_candidates_are_ranked_by_the_peak_they_save(monkeypatch):
  # BERT's three candidates are buffers of one size, each saving as much.
  # Replays that make the last one found save the most must put it first
  # (the ranking the report and the full replays' budget follow).
  program = report("bert_mlm").program
  peak = program.liveness.peak_bytes
  found = [f.boundary for f in memory_findings.find(program)
           if f.kind is K.REMAT_CANDIDATE]
  assert len(found) == 3
  saving = {name: (1 + n) << 20 for n, name in enumerate(found)}
  monkeypatch.setattr(memory_findings, "replay",
                      lambda program, remat, quick: peak - saving.get(remat[0], 0))
  ranked = [f for f in memory_findings.find(program) if f.kind is K.REMAT_CANDIDATE]
  assert [f.boundary for f in ranked] == found[::-1]
  assert [f.peak_saved for f in ranked] == [3 << 20, 2 << 20, 1 << 20]


def test_a_boundary_to_keep_has_no_peak_after_a_change():
  # Keep-reuse names a buffer to leave as it is: no change is replayed.
  keep = report("bert_mlm").findings_of(K.KEEP_REUSE)
  assert keep and all(f.peak_after is None and f.peak_saved is None for f in keep), keep[:2]


def test_a_remat_saving_exactly_the_threshold_is_reported(monkeypatch):
  program = report("bert_mlm").program
  peak, least = program.liveness.peak_bytes, program.options.min_bytes_saved
  before = [f.boundary for f in memory_findings.find(program) if f.kind is K.REMAT_CANDIDATE]
  monkeypatch.setattr(memory_findings, "replay",
                      lambda program, remat, quick: peak - (least if remat[0] in before else 0))
  found = [f for f in memory_findings.find(program) if f.kind is K.REMAT_CANDIDATE]
  assert [f.boundary for f in found] == before and {f.peak_saved for f in found} == {least}


def test_a_record_copied_with_changes_is_the_record_replace_makes():
  from hlo_audit._src.analysis.records import with_changes
  r = record(K.UNFUSED_EPILOGUE, "dot.1", peak_after=5)
  changes = {"kernel": "matmul", "peak_after": 7, "evidence": "changed"}
  copied = with_changes(r, **changes)
  assert copied == dataclasses.replace(r, **changes)
  assert copied.peak_after == 7 and r.peak_after == 5
  assert with_changes(r) == r
  with pytest.raises(TypeError, match="no field"):
    with_changes(r, kernal="matmul")
