"""The audit against hand-read ground truth on flax, equinox and optax train
steps (see `truth.py` for how the truth was read and how it is scored)."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

from tests.hlo_audit.real_models import truth  # noqa: E402

pytestmark = pytest.mark.slow  # thirteen models, a few seconds of compiling each

MODELS = truth.MODELS


def _truth(name: str) -> truth.ModelTruth:
  missing = truth.missing_library(name)
  if missing:
    pytest.skip(f"not installed: pip install '{missing}'")
  unread = truth.cpu_truth_unread(name)
  if unread:
    pytest.skip(unread)
  return truth.model(name).TRUTH


@pytest.mark.parametrize("name", MODELS)
def test_markers_name_lines_of_the_model(name):
  t = _truth(name)
  marks = truth.markers(name)
  used = {e.marker for e in t.expect if e.marker} | {n.marker for n in t.not_flagged if n.marker}
  assert used <= marks.keys(), used - marks.keys()
  assert t.expect, "a model with nothing expected checks nothing"


@pytest.mark.parametrize("name", MODELS)
def test_named_non_findings_name_buffers_of_the_audit(name):
  # A stale XLA name would make its non-finding pass without checking.
  _truth(name)
  names = {b.name for b in truth.report(name).buffers}
  missing = {n.boundary for n in _truth(name).not_flagged if n.boundary} - names
  assert not missing, missing


@pytest.mark.parametrize("name", MODELS)
def test_expected_findings_are_reported(name):
  judged = _truth(name)  # (skips first where the model's library is missing)
  r = truth.report(name)
  out = truth.compare(name, r.findings, judged)
  missing = [f"{e.label} {e.shape} at " +
             (f"<{e.marker}> (line {truth.markers(name)[e.marker]})" if e.marker else "any line") +
             f": {n} of {e.count} missing; {e.why}" for e, n in out.missed]
  assert not missing, "\n".join(missing) + "\n\nreported:\n" + "\n".join(
      truth.describe(name, f) for f in r.findings if f.kind not in truth.UNSCORED)


@pytest.mark.parametrize("name", MODELS)
def test_no_finding_contradicts_the_hlo(name):
  judged = _truth(name)  # (skips first where the model's library is missing)
  r = truth.report(name)
  out = truth.compare(name, r.findings, judged)
  assert not out.false_positives, "\n".join(
      f"{truth.describe(name, f)}\n    -> {why}" for f, why in out.false_positives)


@pytest.mark.parametrize("name", MODELS)
def test_every_finding_is_judged(name):
  judged = _truth(name)  # (skips first where the model's library is missing)
  r = truth.report(name)
  out = truth.compare(name, r.findings, judged)
  assert not out.unjudged, "findings the truth neither expects nor rules out:\n" + \
      "\n".join(f"{truth.describe(name, f)}\n    {f.evidence[:300]}" for f in out.unjudged)


@pytest.mark.parametrize("name", MODELS)
def test_findings_cite_the_models_file_when_the_stack_holds_it(name):
  _truth(name)
  r = truth.report(name)
  here = truth.model_file(name).name
  checked = 0
  for f in r.findings:
    if any(pathlib.Path(loc.file).name == here for loc in f.source_stack):
      checked += 1
      assert f.source is not None and pathlib.Path(f.source.file).name == here, \
          truth.describe(name, f)
  assert checked, "no finding's stack reaches the model: attribution unchecked"


@pytest.mark.parametrize("name", MODELS)
def test_peak_within_one_percent_of_xla(name):
  _truth(name)
  r = truth.report(name)
  assert r.xla_peak_bytes, "no XLA footprint to compare with"
  assert abs(r.peak_bytes - r.xla_peak_bytes) <= 0.01 * r.xla_peak_bytes, \
      (r.peak_bytes, r.xla_peak_bytes)


@pytest.mark.parametrize("name", MODELS)
def test_one_actionable_record_per_boundary(name):
  _truth(name)
  r = truth.report(name)
  seen: dict[str, str] = {}
  dup = []
  for f in r.findings:
    if f.kind in truth.UNSCORED or not f.boundary:
      continue
    if f.boundary in seen:
      dup.append(f"{f.boundary}: {seen[f.boundary]} and {f.kind.slug}")
    seen.setdefault(f.boundary, f.kind.slug)
  assert not dup, "one buffer, several verdicts:\n" + "\n".join(dup)


def test_in_place_updates_in_loops_are_charged_their_slice():
  # The LSTM's forward body writes h, c and the cell input into [32,16,128]
  # stacks with dynamic-update-slice, in place: 16x128 f32 per step each.
  r = truth.report("lstm")
  m = truth.model("lstm")
  step = m.BATCH * m.HIDDEN * 4
  dus = [k for k in r.kernels if "dynamic-update-slice" in k.fused_ops and
         k.trip_count and k.trip_count > 1]
  assert dus, "no in-place update found in the LSTM's loops"
  over = [f"{k.name}: read {k.bytes_read} B, wrote {k.bytes_written} B per step"
          for k in dus if k.bytes_written > step or k.bytes_read > 2 * step]
  assert not over, f"slice is {step} B:\n" + "\n".join(over)
