"""A saved report that is not what the schema says is refused in one line
that names where: the section, the row, the field."""

from __future__ import annotations

import copy
import functools
import json

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.report.json_report import SCHEMA_VERSION, report_from_dict

S = jax.ShapeDtypeStruct


@functools.cache
def saved() -> dict:
  r = hlo_audit.audit(lambda x, w: jax.nn.relu(x @ w), S((16, 32), jnp.float32),
                      S((32, 8), jnp.float32))
  return json.loads(r.to_json())


def _broken(edit) -> dict:
  d = copy.deepcopy(saved())
  edit(d)
  return d


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema_version=99),
     f"schema_version 99; this hlo-audit reads 1 to {SCHEMA_VERSION}"),
    (lambda d: d.pop("schema_version"), "schema_version None; this hlo-audit reads 1 to"),
    (lambda d: d.update(module=[1]), "'module': expected an object, got a JSON array"),
    (lambda d: d.update(kernels={"a": 1}), "'kernels': expected an array, got a JSON object"),
    (lambda d: d["kernels"].insert(1, "k"), "kernels[1]: expected an object, got a JSON string"),
    (lambda d: d["kernels"][0].pop("opcode"), "kernels[0]: missing field 'opcode'"),
    (lambda d: d["kernels"][0].update(kind="warp drive"),
     "kernels[0]: a field has the wrong type or value"),
    (lambda d: d["buffers"][0].update(bytes="many"),
     "buffers[0]: a field has the wrong type or value"),
    (lambda d: d["buffers"].__setitem__(0, None), "buffers[0]: expected an object, got a JSON null"),
    # A null where the schema has a value.
    (lambda d: d["kernels"][0].update(name=None),
     "kernels[0]: a field has the wrong type or value"),
    # A pair's items checked one by one against theirs.
    (lambda d: d["buffers"][0].update(live_range=["start", 3]),
     "buffers[0]: a field has the wrong type or value"),
    (lambda d: d["buffers"][0].update(live_range=[0, 1, 2]),
     "buffers[0]: a field has the wrong type or value"),
    # A tuple of any length: each item against the one type.
    (lambda d: d["buffers"][0].update(dims=[16, "32"]),
     "buffers[0]: a field has the wrong type or value (field 'dims': expected tuple[int, ...]"),
    (lambda d: d["buffers"][0].update(consumers=[3]),
     "buffers[0]: a field has the wrong type or value (field 'consumers'"),
])
def test_a_broken_report_names_where(edit, message):
  with pytest.raises(ValueError) as e:
    report_from_dict(_broken(edit))
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("value, kind", [([], "array"), ("r", "string"), (3, "number"),
                                         (True, "boolean"), (None, "null")])
def test_what_is_not_an_object_is_not_a_report(value, kind):
  with pytest.raises(ValueError, match=f"^a JSON {kind}, not a report"):
    report_from_dict(value)


def test_a_report_saved_in_schema_1_reads_its_rows_with_no_source_stack():
  # Schema 1 had no stacks and no frame table; its rows read as stackless.
  def schema_1(d):
    d.update(schema_version=1)
    for row in d["kernels"] + d["buffers"] + d["findings"]:
      row.pop("source_stack")
  r = report_from_dict(_broken(schema_1))
  assert r.kernels and r.buffers
  assert all(row.source_stack == () for row in r.kernels + r.buffers + r.findings)


def test_the_unbroken_report_reads_back():
  assert len(report_from_dict(saved()).kernels) == len(saved()["kernels"])


def test_a_report_saved_before_collectives_were_recorded_reads_with_none():
  older = _broken(lambda d: d.pop("collectives"))
  assert report_from_dict(older).collectives == ()


def test_a_finding_saved_before_peaks_were_estimated_reads_as_exact():
  from tests.hlo_audit.report.report_test import rep  # pylint: disable=import-outside-toplevel
  d = json.loads(rep().to_json())  # relu(x @ w + b): an unfused epilogue
  for f in d["findings"]:
    f.pop("peak_exact", None)
  older = report_from_dict(d)
  assert older.findings and all(f.peak_exact for f in older.findings)


def test_xla_s_own_estimate_and_its_spread_read_back_apart():
  import dataclasses  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.analysis.xla_estimate import CyclesSpread, XlaEstimate  # pylint: disable=import-outside-toplevel
  from tests.hlo_audit.report.report_test import rep  # pylint: disable=import-outside-toplevel
  estimate = XlaEstimate(seconds=1.4e-4, reported=-1.99986, uncosted=2)
  spread = CyclesSpread(kernels=3, seconds_per_cycle=1e-9, low=0.8, high=1.3)
  r = dataclasses.replace(rep(), xla_estimate=estimate, cycles_spread=spread)
  again = report_from_dict(json.loads(r.to_json()))
  assert (again.xla_estimate, again.cycles_spread) == (estimate, spread)
  assert report_from_dict(json.loads(rep().to_json())).cycles_spread is None


def test_a_report_saved_before_on_chip_scratch_reads_zero_bytes_of_it():
  older = _broken(lambda d: [k.pop("on_chip_scratch") for k in d["kernels"]])
  assert [k.on_chip_scratch for k in report_from_dict(older).kernels] == \
      [0] * len(saved()["kernels"])


def test_a_report_saved_before_its_optional_fields_reads_them_as_their_defaults():
  # Every key a later schema added, dropped at once: each reads as the value
  # an audit that had nothing to say of it would hold.
  from tests.hlo_audit.report.report_test import rep  # pylint: disable=import-outside-toplevel
  d = json.loads(rep().to_json())
  for f in d["findings"]:
    for key in ("boundary_kept", "guard_verdict", "layer", "notes", "peak_exact",
                "suggestion"):
      f.pop(key)
  for key in ("optimized", "xla_peak_source"):
    d["module"].pop(key)
  for frame in d["frames"]:
    frame.pop("column"), frame.pop("function")
  d.pop("collectives")
  older = report_from_dict(d)
  assert older.findings
  for f in older.findings:
    assert (f.boundary_kept, f.guard_verdict, f.layer, f.notes, f.peak_exact,
            f.suggestion) == (False, "", "", (), True, ""), f
  m = older.module
  assert (m.optimized, m.xla_peak_source) == (True, "")
  frames = [loc for k in older.kernels for loc in k.source_stack]
  assert frames and all((loc.column, loc.function) == (0, "") for loc in frames)
  assert older.collectives == ()
