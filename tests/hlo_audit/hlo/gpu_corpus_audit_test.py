"""The GPU side of the audit, on the corpus's optimized GPU modules (546 tagged).

Every module XLA accepts and INDEX.tsv tags `gpu_optimized` is audited: no
crash; every custom call classified (library gemm, convolution, attention,
user kernel, host transfer, runtime helper, marker), the unclassified ones
named in the report's notes; every library or triton-gemm epilogue XLA already
fused reported as "already fused", with the evidence.
"""

from __future__ import annotations

import collections

import pytest
from hlo_corpus import Corpus

import hlo_audit
from hlo_audit._src.analysis import custom_calls
from hlo_audit._src.analysis.backend_traits import KernelKind
from hlo_audit._src.analysis.records import FindingKind

pytestmark = pytest.mark.corpus

#: Targets only XLA's own tests define (fake kernels of runtime and parser
#: tests); anything else unknown must be added to custom_calls' table.
TEST_ONLY_TARGETS = frozenset({
    "__xla_test$$scaled_memset", "__xla_test$$memset_const", "__xla_test$$subbuffers",
    "xla.gpu.test_write_value_thunk_folded", "my_custom_call", "unknown", "unknown_tie",
    ""})


@pytest.fixture(scope="module")
def gpu_audits(corpus: Corpus):
  """(file, parsed module, report or the exception) for every GPU module."""
  out = []
  for m in corpus.accepted:
    if "gpu_optimized" not in m.tags:
      continue
    text = m.read()
    try:
      out.append((m.file, hlo_audit.parse_hlo(text), hlo_audit.audit_hlo(text)))
    except Exception as e:  # noqa: BLE001 - listed by the test below
      out.append((m.file, None, e))
  return out


def test_every_gpu_module_audits(gpu_audits):
  assert len(gpu_audits) >= 540
  crashed = [(f, f"{type(r).__name__}: {r}") for f, _, r in gpu_audits
             if isinstance(r, Exception)]
  assert not crashed, f"{len(crashed)} crashed, e.g. {crashed[:10]}"


def test_every_custom_call_is_classified_or_reported(gpu_audits):
  families = collections.Counter()
  unknown = set()
  unreported = []
  for f, module, report in gpu_audits:
    for _, _, c in custom_calls.custom_calls(module):
      families[c.family] += 1
      if not c.known:
        unknown.add(c.target)
    targets = custom_calls.unknown_targets(module)
    if targets and not any(
        "unknown custom-call targets" in n and all(repr(t) in n for t in targets)
        for n in report.notes):
      unreported.append(f)
  assert not unreported, f"unknown targets missing from the notes of {unreported[:10]}"
  assert unknown <= TEST_ONLY_TARGETS, (
      f"unclassified targets: {sorted(unknown - TEST_ONLY_TARGETS)}")
  # The corpus exercises every family the GPU pipeline emits.
  for family in (custom_calls.CallFamily.GEMM, custom_calls.CallFamily.CONVOLUTION,
                 custom_calls.CallFamily.ATTENTION, custom_calls.CallFamily.USER_KERNEL,
                 custom_calls.CallFamily.SORT_SCAN, custom_calls.CallFamily.HOST,
                 custom_calls.CallFamily.RUNTIME):
    assert families[family] > 0, family


def test_already_fused_epilogues_are_reported_with_evidence(gpu_audits):
  library = gemm = 0
  missed = []
  for f, module, report in gpu_audits:
    already = {a.producer: a for a in report.findings
               if a.kind is FindingKind.ALREADY_FUSED}
    for _, name, c in custom_calls.custom_calls(module):
      if c.already_fused:
        library += 1
        a = already.get(name)
        if a is None or f"epilogue={c.epilogue}" not in a.evidence:
          missed.append((f, name, c.epilogue))
    for k in report.kernels:
      if k.kind is not KernelKind.TRITON_GEMM:
        continue
      work = custom_calls.gemm_fusion_epilogue(
          module, module.computation(k.computation).instruction(k.name))
      if work:
        gemm += 1
        if k.name not in already or not already[k.name].evidence:
          missed.append((f, k.name, work))
  assert library >= 1 and gemm >= 3, (library, gemm)
  assert not missed, f"already-fused epilogues not reported: {missed}"
