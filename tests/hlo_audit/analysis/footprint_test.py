"""What an audit keeps: no reference cycles (a report's tables must go when
the report goes, not at the next full collection), no attribution tables in
the report, and attribute runs split only where something reads them."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp

import hlo_audit
from tests.hlo_audit.analysis.replay_budget_test import mlp_capture


def test_an_audit_leaves_no_reference_cycles():
  cap = mlp_capture(2)
  hlo_audit.audit_capture(cap)  # warm-up: caches of jax and of the guards
  gc.collect()
  gc.disable()
  try:
    report = hlo_audit.audit_capture(cap)
    assert report.kernels and report.findings
    del report
    assert gc.collect() == 0
  finally:
    gc.enable()


def test_the_report_does_not_keep_the_attribution_tables():
  cap = mlp_capture(2)
  report = hlo_audit.audit_capture(cap)
  assert any(f.source is not None for f in report.findings)
  assert not {"source_tables", "source_memo"} & set(cap.module._cache or {})


def test_callers_split_only_the_runs_that_call():
  text = jax.jit(lambda x: jnp.sum(jnp.tanh(x) * 2.0)).lower(
      jax.ShapeDtypeStruct((64, 64), jnp.float32)).compile().as_text()
  module = hlo_audit.parse_hlo(text)
  assert module.callers()  # fusions, reductions: something calls
  insts = [i for c in module.computations for i in c.instructions]
  calling = [i for i in insts if i.called_computations]
  plain = [i for i in insts if not i.called_computations and i.opcode != "parameter"]
  assert calling and plain
  # Asked of every instruction, yet no run was split: the plain ones name no
  # computation, and the others' `calls=%c` is read where it stands.
  assert all(isinstance(i.attribute_source, str) or not i.attribute_source for i in plain)
  assert all(isinstance(i.attribute_source, str) for i in calling)
