"""validate() with a case that exercises a designed fallback: it passes only
when every recorded fallback is the designed one."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import guard, registry
from pallas_kernels._src.spec import Case

DESIGNED = "backward: out_dtype differs from the input's"
UNEXPECTED = "no kernel for this shape"


def _spec(reasons: tuple[str, ...]):
  """softmax run through XLA (exactly right), recording `reasons` as
  fallbacks on its "pallas" path; one case expecting the designed one."""

  def fn(x, *, implementation, interpret=None):
    del interpret
    if implementation == "pallas":
      for reason in reasons:
        guard.record_fallback("designed", reason, guard.signature(x=x))
    return pk.softmax(x, implementation="xla")

  x = jax.random.normal(jax.random.key(0), (5, 37), jnp.float32)
  case = Case(name="x=f32[5,37]", args=(x,), kwargs={}, tags=frozenset({"ci"}),
              expect_fallback="backward:")
  return dataclasses.replace(registry.get_spec("softmax"), name="designed", fn=fn,
                             cases=lambda tag, seed: iter([case] if tag == "ci" else []))


def _row(reasons):
  report = pk.validate(_spec(reasons), require_kernel=True, check_grads=False)
  [row] = report.rows
  assert row.kernel_err <= row.bound  # the numbers are right in every case
  return report, row


def test_the_designed_fallback_alone_passes(clean_fallbacks):
  report, row = _row((DESIGNED,))
  assert row.fallback_reasons == (DESIGNED,)
  assert row.fallback_as_designed and row.passed and report.passed
  assert f"as designed: {DESIGNED}" in str(report)


def test_the_designed_fallback_beside_an_unexpected_one_fails(clean_fallbacks):
  report, row = _row((DESIGNED, UNEXPECTED))
  assert row.fallback_reasons == (DESIGNED, UNEXPECTED)
  assert not row.fallback_as_designed
  assert not row.passed and not report.passed
  assert "REQUIRED KERNEL FELL BACK" in str(report)


@pytest.mark.parametrize("reasons", [(UNEXPECTED, DESIGNED), (UNEXPECTED,), ()])
def test_anything_but_the_designed_fallback_fails(clean_fallbacks, reasons):
  report, row = _row(reasons)
  assert not row.fallback_as_designed and not report.passed
  if not reasons:
    assert "MISSING DESIGNED FALLBACK" in str(report)


def test_a_rows_error_is_its_worst_outputs_not_its_first():
  # Two outputs: the first exact, the second 1e-3 off; the row must say 1e-3.
  def reference(x):
    return x, 2.0 * x

  def fn(x, *, implementation, interpret=None):
    del interpret
    return (x, 2.0 * x * (1.0 + 1e-3)) if implementation == "pallas" else reference(x)

  x = jax.random.normal(jax.random.key(1), (4, 16), jnp.float32)
  case = Case(name="x=f32[4,16]", args=(x,), kwargs={}, tags=frozenset({"ci"}))
  spec = dataclasses.replace(registry.get_spec("softmax"), name="two_outputs", fn=fn,
                             reference_f32=reference,
                             cases=lambda tag, seed: iter([case] if tag == "ci" else []))
  [row] = pk.validate(spec, require_kernel=False, check_grads=False).rows
  assert row.kernel_err == pytest.approx(1e-3, rel=0.05)
  assert not row.passed


def test_every_finite_element_is_checked_where_some_are_not_finite():
  from pallas_kernels._src import validate

  ref = jnp.array([-jnp.inf, 1.0, 2.0, 3.0], jnp.float32)   # a masked row's -inf
  written = jnp.array([-jnp.inf, 1.0, 2.0, 3.0], jnp.float32)
  unwritten = jnp.array([-jnp.inf, 1.0, 2.0, 9.0e6], jnp.float32)  # garbage left behind
  assert validate._written(written, ref, 1e-5)
  assert not validate._written(unwritten, ref, 1e-5)


def _bare_row(**changes):
  from pallas_kernels._src.validate import ValidationRow
  base = ValidationRow(op="softmax", case="x=f32[5,37]", dtype="float32", kernel_err=1e-6,
                       xla_err=1e-6, bound=1e-5, grad_err=None, grad_bound=None, written=True,
                       nonfinite_ok=True, repeat_exact=True, fallback=None)
  return dataclasses.replace(base, **changes)


def test_a_report_passes_only_when_every_row_does():
  from pallas_kernels._src.validate import ValidationReport
  good, bad = _bare_row(), _bare_row(kernel_err=1e-3)
  assert good.passed and not bad.passed
  assert ValidationReport((good, good), interpret=True, device="cpu").passed
  for rows in ((good, bad), (bad, good), ()):
    assert not ValidationReport(rows, interpret=True, device="cpu").passed, rows
  # The bound is inclusive: an error exactly at it passes, as the table's
  # "kernel_err <= bound" says.
  assert _bare_row(kernel_err=1e-5).passed


def test_a_missing_designed_fallback_is_flagged_only_where_kernels_are_required(
    clean_fallbacks):
  # Interpreted on a CPU (kernels not required) the designed fallback may not
  # happen; the row passes, and its FALLBACK cell must not cry "missing".
  report = pk.validate(_spec(()), require_kernel=False, check_grads=False)
  [row] = report.rows
  assert row.expected_fallback and not row.fallback and not row.kernel_required
  assert row.passed and report.passed
  assert "MISSING DESIGNED FALLBACK" not in str(report)
  assert "MISSING DESIGNED FALLBACK" not in report.to_markdown()


def test_a_gradient_error_exactly_at_its_bound_passes():
  # The bound is inclusive, as the table's "grad_err (<= bound)" says.
  assert _bare_row(grad_err=1e-3, grad_bound=1e-3).passed
  assert not _bare_row(grad_err=1.01e-3, grad_bound=1e-3).passed


def test_the_fallback_cell_says_what_each_row_s_fallback_is():
  from pallas_kernels._src.validate import _fallback_cell  # pylint: disable=import-outside-toplevel
  # A kernel that ran, required or not: nothing to say.
  assert _fallback_cell(_bare_row()) == "-"
  assert _fallback_cell(_bare_row(kernel_required=True)) == "-"
  # The designed fallback missing where kernels are required.
  assert _fallback_cell(_bare_row(kernel_required=True, expected_fallback="rows")) == (
      "MISSING DESIGNED FALLBACK")
  designed = dict(fallback="rows too long", fallback_reasons=("rows too long",))
  assert _fallback_cell(_bare_row(expected_fallback="rows", **designed)) == (
      "as designed: rows too long")
  # A fallback no case designed: said as it is, and loudly where kernels are required.
  assert _fallback_cell(_bare_row(**designed)) == "rows too long"
  assert _fallback_cell(_bare_row(kernel_required=True, **designed)) == (
      "REQUIRED KERNEL FELL BACK: rows too long")


def test_an_integer_output_left_at_the_poison_value_is_not_written():
  from pallas_kernels._src import validate  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.tolerances import tolerance  # pylint: disable=import-outside-toplevel
  bound = tolerance("int8")
  ref = np.array([-121, 120, -119, 118], np.int8)
  assert validate._written(ref.copy(), ref, bound)
  # One element left at int8's minimum, as interpret mode fills an unwritten
  # integer block: 7 from its reference, within the tolerance, yet not written.
  assert not validate._written(np.array([-128, 120, -119, 118], np.int8), ref, bound)
  # Where the reference itself holds the value, it was written.
  at_min = np.array([-128, 1, 2, 3], np.int8)
  assert validate._written(at_min.copy(), at_min, bound)


def test_non_finite_values_must_match_in_place_and_sign():
  from pallas_kernels._src import validate  # pylint: disable=import-outside-toplevel
  ref = np.array([-np.inf, 1.0, np.nan, np.inf, 2.0], np.float32)
  assert validate._nonfinite_match(ref.copy(), ref)
  assert validate._nonfinite_match(np.array([-np.inf, 1.5, np.nan, np.inf, 2.5], np.float32), ref)
  for bad in ([np.inf, 1.0, np.nan, np.inf, 2.0],     # a -inf turned +inf
              [-np.inf, 1.0, 0.0, np.inf, 2.0],       # a NaN lost
              [-np.inf, np.inf, np.nan, np.inf, 2.0]):  # an inf where ref is finite
    assert not validate._nonfinite_match(np.array(bad, np.float32), ref), bad
