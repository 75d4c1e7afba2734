"""validate(): the real ops pass, and deliberately broken ops fail."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels._src import registry
from pallas_kernels._src.ops.softmax import reference as softmax_reference
from pallas_kernels._src.spec import Case, OpSpec
from pallas_kernels._src.tolerances import tolerance

OPS = ("layer_norm", "rms_norm", "softmax")


def test_ci_cases_of_the_row_wise_ops_pass():
  report = pk.validate(OPS, tags=("ci",))
  print(report)
  assert report.passed, "\n" + str(report)
  expected = sum(len(list(registry.get_spec(op).cases("ci", 0))) for op in OPS)
  assert len(report.rows) == expected
  assert {r.op for r in report.rows} == set(OPS)
  for row in report.rows:
    assert np.isfinite(row.kernel_err) and np.isfinite(row.xla_err)
    assert row.bound in (tolerance(row.dtype), tolerance("float32"), tolerance("int8"),
                         tolerance("float8_e4m3fn"))
  assert any(r.grad_err is not None for r in report.rows)
  # softmax with a bfloat16 output of a float32 input uses the reference's vjp.
  [fallback_row] = [r for r in report.rows if r.fallback]
  assert fallback_row.op == "softmax" and "backward" in fallback_row.fallback
  assert report.to_markdown().count("\n") == len(report.rows) + 3
  with pytest.raises(dataclasses.FrozenInstanceError):
    report.rows = ()


def test_dtype_filter_and_empty_selection():
  report = pk.validate("softmax", tags=("ci",), dtypes=["float16"], check_grads=False)
  assert [r.dtype for r in report.rows] == ["float16"]
  with pytest.raises(ValueError, match="no cases"):
    pk.validate("softmax", tags=("no-such-tag",))


# Deliberately broken ops. They wrap the XLA softmax (cheap to compile) and
# misbehave only as "pallas", so the XLA column stays clean.

def _small_case() -> Case:
  x = jax.random.normal(jax.random.key(0), (5, 37), jnp.float32)
  return Case(name="x=f32[5,37]", args=(x,), kwargs={}, tags=frozenset({"ci"}),
              grad_argnums=(0,))


def _broken_spec(name: str, corrupt) -> OpSpec:
  def fn(x, *, implementation, interpret=None):
    del interpret
    y = pk.softmax(x, implementation="xla")
    return corrupt(y) if implementation == "pallas" else y

  base = registry.get_spec("softmax")
  return dataclasses.replace(
      base, name=name, fn=fn,
      cases=lambda tag, seed: iter([_small_case()] if tag == "ci" else []))


def _row(spec):
  report = pk.validate(spec)
  assert not report.passed
  assert "FAIL" in str(report) and "FAILED" in report.to_markdown()
  [row] = report.rows
  return row


def test_an_offset_of_1e_2_fails():
  row = _row(_broken_spec("plus_1e-2", lambda y: y + 1e-2))
  assert row.kernel_err > row.bound and row.xla_err <= row.bound


def test_unwritten_output_fails():
  # What interpret mode leaves in an unwritten block: NaN.
  row = _row(_broken_spec("unwritten", lambda y: y.at[3:].set(jnp.nan)))
  assert not row.written and not row.nonfinite_ok


def test_finite_garbage_in_unwritten_output_fails_written():
  # What a compiled kernel may leave in an unwritten block: stale finite data.
  row = _row(_broken_spec("stale", lambda y: y.at[4, 10:].set(0.5)))
  assert not row.written


def test_nondeterministic_output_fails_repeat():
  counter = itertools.count()

  def corrupt(y):
    # A different last-bit perturbation on every call.
    return y * (1 + 1e-7 * next(counter))

  row = _row(_broken_spec("nondeterministic", corrupt))
  assert not row.repeat_exact and row.kernel_err <= row.bound


def test_wrong_gradient_fails():
  @jax.custom_vjp
  def scaled_grad(y):
    return y

  scaled_grad.defvjp(lambda y: (y, None), lambda _, g: (1.1 * g,))
  row = _row(_broken_spec("bad_grad", scaled_grad))
  assert row.kernel_err <= row.bound and row.grad_err > row.grad_bound


def test_check_grads_false_skips_the_gradient_check():
  # With gradients off, a case naming grad_argnums is checked on its values
  # only: a wrong gradient neither fails it nor shows a grad error.
  @jax.custom_vjp
  def scaled_grad(y):
    return y

  scaled_grad.defvjp(lambda y: (y, None), lambda _, g: (1.1 * g,))
  report = pk.validate(_broken_spec("bad_grad", scaled_grad), check_grads=False)
  [row] = report.rows
  assert row.grad_err is None and row.grad_bound is None
  assert row.passed and report.passed

def test_reference_of_the_broken_spec_is_the_real_one():
  # Guards the tests above: they must fail because of `fn`, not the reference.
  case = _small_case()
  spec = _broken_spec("plus_1e-2", lambda y: y + 1e-2)
  np.testing.assert_allclose(spec.reference_f32(*case.args),
                             softmax_reference.softmax_f32(*case.args))


def _falling_back_spec() -> OpSpec:
  """An op whose "pallas" path always falls back (recording why), exactly right."""
  from pallas_kernels._src import guard  # noqa: PLC0415

  def fn(x, *, implementation, interpret=None):
    del interpret
    if implementation == "pallas":
      guard.record_fallback("always_xla", "no kernel here", guard.signature(x=x))
    return pk.softmax(x, implementation="xla")

  base = registry.get_spec("softmax")
  return dataclasses.replace(
      base, name="always_xla", fn=fn,
      cases=lambda tag, seed: iter([_small_case()] if tag == "ci" else []))


def test_a_fallback_never_passes_when_kernels_are_required(clean_fallbacks):
  spec = _falling_back_spec()
  required = pk.validate(spec, require_kernel=True)
  [row] = required.rows
  assert row.fallback == "no kernel here" and row.kernel_err <= row.bound
  assert not required.passed and "REQUIRED KERNEL FELL BACK" in str(required)
  assert "1 fell back to XLA" in str(required) and "FALLBACK" in required.to_markdown()
  # Not required (the default where kernels are interpreted): it passes, flagged.
  lenient = pk.validate(spec, require_kernel=False)
  assert lenient.passed and "1 fell back to XLA" in str(lenient)
  assert pk.validate(spec, interpret=True).require_kernel is False


def test_a_designed_fallback_passes_only_as_designed(clean_fallbacks):
  # softmax f32 -> bf16 runs its backward through the reference by design.
  report = pk.validate("softmax", tags=("ci",), require_kernel=True, check_grads=True)
  [row] = [r for r in report.rows if r.expected_fallback]
  assert row.fallback_as_designed and row.passed and "as designed" in str(report)
  assert all(r.passed for r in report.rows), str(report)
  spec = _falling_back_spec()
  wrong = dataclasses.replace(_small_case(), expect_fallback="backward:")
  report = pk.validate(dataclasses.replace(spec, cases=lambda t, s: iter([wrong])),
                       require_kernel=True)
  assert not report.passed  # a fallback, but not the designed one


def test_the_guard_s_records_are_read_per_op_or_all_and_a_sink_keeps_its_own():
  from pallas_kernels._src import guard  # pylint: disable=import-outside-toplevel
  guard.clear_fallbacks()
  try:
    guard.record_choice("softmax", "triton", "", "x=f32[8]")
    guard.record_choice("rms_norm", "mosaic_gpu", "not on this GPU", "x=f32[8]")
    guard.record_fallback("softmax", "rows too long", "x=f32[9]")
    guard.record_fallback("rms_norm", "an int8 input", "x=s8[8]")
    assert [c.backend for c in guard.choices("rms_norm")] == ["mosaic_gpu"]
    assert [c.op for c in guard.choices()] == ["softmax", "rms_norm"]
    assert [f.reason for f in guard.fallbacks("softmax")] == ["rows too long"]
    assert [f.op for f in guard.fallbacks()] == ["softmax", "rms_norm"]
    with guard.collect_fallbacks() as sink:
      guard.record_choice("softmax", "xla", "dry run", "x=f32[8]")
      guard.record_fallback("softmax", "dry run", "x=f32[8]")
    assert [c.why for c in sink.choices] == ["dry run"] and len(sink) == 1
    assert len(guard.choices()) == 2 and len(guard.fallbacks()) == 2
  finally:
    guard.clear_fallbacks()
  assert guard.choices() == () and guard.fallbacks() == ()


def test_one_nondeterministic_output_of_two_fails_repeat():
  counter = itertools.count()
  base = _broken_spec("two_outputs", lambda y: y)

  def fn(x, *, implementation, interpret=None):
    y = base.fn(x, implementation=implementation, interpret=interpret)
    if implementation != "pallas":
      return y, y
    return y, y * (1 + 1e-7 * next(counter))  # the first repeats, the second not

  def reference(x, **kwargs):
    y = base.reference_f32(x, **kwargs)
    return y, y

  spec = dataclasses.replace(base, fn=fn, reference_f32=reference)
  report = pk.validate(spec, check_grads=False)
  [row] = report.rows
  assert not row.repeat_exact and not report.passed
  assert row.kernel_err <= row.bound and row.written
