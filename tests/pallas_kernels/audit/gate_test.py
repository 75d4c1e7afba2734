"""`verify`'s gates on small functions: the numbers each gate judges by, the
float32 truth a low-precision program is held to, and the swap's report
that narrows what the removal gate targets."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
import pallas_kernels
from hlo_audit import FindingKind
from hlo_audit import plugins
from pallas_kernels._src import registry
from pallas_kernels._src.audit import sweep
from pallas_kernels._src.audit import verify as verify_mod


def _running_sum(x, s):
  """A sequential sum in the input's dtype: in bf16 each step's carry is
  rounded, and the sum drifts past bf16's bound."""
  def step(c, xi):
    c = c + xi * s.astype(xi.dtype)
    return c, c
  return jax.lax.scan(step, jnp.zeros((), x.dtype), x)[1]


def _running_sum_f32(x, s):
  """The same sum accumulated in float32, as a kernel would, stored in x's dtype."""
  return _running_sum(x.astype(jnp.float32), s).astype(x.dtype)


def test_a_bf16_input_beside_a_float32_one_is_judged_against_float32():
  # XLA's bf16 carry errs ~1.5% from the float32 truth, past the 1% bound; a
  # candidate accumulating in float32 is 0.15% from it. One low-precision
  # input is enough for the truth to be computed, whatever the others are.
  x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, 512), jnp.bfloat16)
  s = jnp.float32(0.5)
  r = pallas_kernels.verify(_running_sum, _running_sum_f32, x, s)
  numerics = r.gate("numerics")
  assert numerics.status == "pass", str(r)
  assert "against float32" in numerics.details[0] and "(no worse: pass)" in numerics.details[0]
  # Past the bound (the ratio is capped at it: no worse than the baseline).
  assert numerics.figures == "outputs within 1x of the bound"


def test_a_candidate_further_from_the_truth_than_the_baseline_fails_on_its_own_ratio():
  # 5% off the float32 truth, against the baseline's bf16 1.5%: not excused,
  # and its figure is its error over the bound, not capped at 1x.
  x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.5, 512), jnp.bfloat16)
  s = jnp.float32(0.5)
  r = pallas_kernels.verify(_running_sum, lambda x, s: _running_sum_f32(x, s) * 1.05, x, s)
  numerics = r.gate("numerics")
  assert numerics.status == "fail", str(r)
  assert "against float32" in numerics.details[0] and "no worse" not in numerics.details[0]
  within = float(numerics.figures.removeprefix("outputs within ").split("x")[0])
  assert within > 2, numerics.figures


def test_a_float32_scalar_past_the_bound_fails_on_the_bound_alone():
  # A float32 loss off by 0.1%: no float32 truth is computed (the inputs are
  # float32), so nothing can excuse it.
  x = jnp.linspace(0.5, 1.5, 256, dtype=jnp.float32)
  loss = lambda x: jnp.sum(x ** 2)
  r = pallas_kernels.verify(loss, lambda x: loss(x) * 1.001, x)
  numerics = r.gate("numerics")
  assert numerics.status == "fail" and "numerics" in r.verdict, str(r)
  assert numerics.details[0].startswith("worst output: leaf 0 float32[] rel. error 1.00e-03")
  assert "against float32" not in numerics.details[0]


def test_the_worst_leaf_is_the_one_the_figures_and_first_line_name():
  # Leaf 0 errs ~1e-6 (0.1x the float32 bound), leaf 1 ~1e-7: the gate's
  # figure is leaf 0's, and a smaller error after it does not take its line.
  x = jnp.linspace(1.0, 2.0, 256, dtype=jnp.float32)
  f = lambda x: (x, 2 * x)
  g = lambda x: (x * (1 + 2.0 ** -20), 2 * x * (1 + 2.0 ** -23))
  r = pallas_kernels.verify(f, g, x)
  numerics = r.gate("numerics")
  assert numerics.status == "pass", str(r)
  within = float(numerics.figures.removeprefix("outputs within ").removesuffix("x of the bound"))
  assert 0.05 < within < 0.15, numerics.figures
  assert numerics.details[0].startswith("worst output: leaf 0 float32[256]"), numerics.details


def test_where_kernels_compile_the_faster_candidate_passes_the_timing_gate():
  w = jnp.eye(256, dtype=jnp.float32) * 0.5

  def slow(x):
    for _ in range(24):
      x = jnp.tanh(x @ w)
    return x

  fast = lambda x: x
  x = jnp.ones((256, 256), jnp.float32)
  timing = functools.partial(verify_mod._timing_gate, args=(x,), kwargs={}, repeats=3,  # noqa: SLF001
                             interpreted=False)
  gate = timing(jax.jit(slow), jax.jit(fast))
  assert gate.status == "pass" and gate.figures.startswith("median of 3: "), gate
  gate = timing(jax.jit(fast), jax.jit(slow))
  assert gate.status == "fail", gate
  gate = timing(jax.jit(slow), jax.jit(fast), interpreted=True)
  assert gate.status == "not measured"


def _mlp(x, w, b):
  return jax.nn.gelu(x @ w + b, approximate=False)


def test_a_swap_that_replaced_nothing_is_not_judged_on_other_findings():
  # The MLP's bias + GELU is an unfused epilogue on the CPU; a swap told to
  # replace only layer norms leaves it. The gate targets the swapped lines
  # only: nothing was targeted, so nothing was to be removed.
  k = jax.random.split(jax.random.PRNGKey(0), 3)
  args = (jax.random.normal(k[0], (16, 32)), jax.random.normal(k[1], (32, 64)) / 6,
          jax.random.normal(k[2], (64,)))
  r = pallas_kernels.verify(_mlp, pallas_kernels.swap(_mlp, ops=("layer_norm",)), *args)
  assert r.swap_report is not None and not r.swap_report.replaced
  assert r.before.findings_of(FindingKind.UNFUSED_EPILOGUE)
  removed = r.gate("intermediates removed")
  assert removed.status == "not measured" and removed.figures.startswith("0/0 targeted"), removed
  # The same program: no launch grew, so no kernel is listed as added.
  assert r.diff.launches_delta == 0
  assert not any(d.startswith("launches grew") for d in removed.details), removed.details
  # (Not `r.passed`: where kernels compile, the timing gate times two equal
  # programs.)
  assert r.gate("numerics").status == "pass" and r.gate("kernels ran").status == "pass"
  if jax.default_backend() == "cpu":
    # A swap left to choose interprets its kernels here: no time is judged.
    assert r.gate("end-to-end time").status == "not measured"


def _dense(xs, ws, b):
  return [jax.nn.gelu(x @ w + b, approximate=False) for x, w in zip(xs, ws)]


def _dense_without_epilogue(xs, ws, b):
  return [x @ w for x, w in zip(xs, ws)]


@pytest.mark.parametrize("layers", [6, 7])
def test_the_removal_gate_lists_six_gone_findings_then_counts_the_rest(layers):
  # One unfused bias + GELU epilogue per layer on the CPU, each gone from a
  # candidate without the epilogue: six are listed, the rest counted.
  k = jax.random.split(jax.random.PRNGKey(0), 2 * layers + 1)
  xs = [jax.random.normal(k[i], (16, 32)) for i in range(layers)]
  ws = [jax.random.normal(k[layers + i], (32, 64)) for i in range(layers)]
  b = jax.random.normal(k[-1], (64,))
  removed = pallas_kernels.verify(_dense, _dense_without_epilogue, xs, ws, b).gate(
      "intermediates removed")
  assert removed.status == "pass" and removed.figures.startswith(
      f"{layers}/{layers} targeted findings gone"), removed
  gone = [d for d in removed.details if d.startswith("gone: unfused epilogue f32[16,64]")]
  assert len(gone) == 6
  more = [d for d in removed.details if d.startswith("... and")]
  assert more == ([] if layers == 6 else ["... and 1 more gone"]), removed.details


@pytest.mark.usefixtures("clean_fallbacks")
def test_a_validated_sweep_point_keeps_its_cost_model_beside_its_validation():
  spec = registry.get_spec("softmax")
  p = {"rows": 8, "cols": 16, "grad": False}
  out = sweep.OpSweep(spec).run(p, plugins.Measure(validate=True),
                                lambda fn, args: {"seconds": {}})
  assert out["kernel"]["bytes_moved"] > 0 and out["kernel"]["flops"] > 0
  assert out["validation"]["passed"] is True and "kernel_err" in out["validation"]
  assert out["seconds"]["validate"] > 0


def test_a_swap_report_passed_in_is_the_one_the_gate_reads():
  # A candidate built around a swapped function names its replaced lines
  # through `swap_report=`; a swapped candidate's own report does not
  # replace one given.
  k = jax.random.split(jax.random.PRNGKey(1), 3)
  args = (jax.random.normal(k[0], (16, 32)), jax.random.normal(k[1], (32, 64)) / 6,
          jax.random.normal(k[2], (64,)))
  given = pallas_kernels.swap(_mlp, ops=("layer_norm",)).report(*args)
  r = pallas_kernels.verify(_mlp, pallas_kernels.swap(_mlp), *args, swap_report=given)
  assert r.swap_report is given


def test_jaxs_library_verifies_the_candidate_against_the_baseline(monkeypatch):
  from pallas_kernels._src.audit import jax_calls
  seen = []
  monkeypatch.setattr(verify_mod, "verify", lambda f, g, *a, **o: seen.append((f, g, a, o)))
  base, cand = object(), object()
  jax_calls.LIBRARY.verify(base, cand, 1, 2, repeats=3)
  assert seen == [(base, cand, (1, 2), {"repeats": 3})]


def test_one_failing_gate_among_passing_ones_fails_the_report():
  # The verdict is the conjunction of the gates: a single failure (here the
  # numerics) sinks the report, whatever the others say; "not measured" is
  # no failure.
  ok = verify_mod.Gate("intermediates removed", verify_mod.PASS, "1/1 targeted findings gone")
  unmeasured = verify_mod.Gate("end-to-end time", verify_mod.NOT_MEASURED, "interpret mode")
  bad = verify_mod.Gate("numerics", verify_mod.FAIL, "outputs within 3x of the bound")
  r = verify_mod.VerificationReport(gates=(ok, bad, unmeasured))
  assert r.passed is False and r.to_dict()["passed"] is False
  assert r.verdict == "FAIL (numerics)"
  assert verify_mod.VerificationReport(gates=(ok, unmeasured)).passed is True


def test_removing_the_targeted_finding_without_changing_the_launch_count_passes_removal():
  # The MLP's bias + GELU epilogue is a separate fusion after the dot on the
  # CPU; a candidate with a dot and one other fusion has no unfused
  # epilogue and the same launches per run. Nothing kept, no launch added:
  # the removal gate passes (it asks launches not to grow, not to shrink).
  k = jax.random.split(jax.random.PRNGKey(0), 3)
  args = (jax.random.normal(k[0], (16, 32)), jax.random.normal(k[1], (32, 64)) / 6,
          jax.random.normal(k[2], (64,)))
  before = hlo_audit.audit(jax.jit(_mlp), *args)
  after = hlo_audit.audit(jax.jit(lambda x, w, b: (x @ w, jnp.tanh(x))), *args)
  diff = before.diff(after)
  assert before.findings_of(FindingKind.UNFUSED_EPILOGUE) and not after.findings
  assert diff.launches_delta == 0
  removed = verify_mod._removal_gate(before, after, diff, None)  # noqa: SLF001
  assert removed.status == "pass", removed
  assert removed.figures.startswith("1/1 targeted findings gone"), removed.figures
  assert "(launches per run +0)" in removed.figures
  # A candidate of fewer launches (the dot alone) passes, and is not said
  # to have grown.
  fewer = hlo_audit.audit(jax.jit(lambda x, w, b: x @ w), *args)
  shrunk = verify_mod._removal_gate(before, fewer, before.diff(fewer), None)  # noqa: SLF001
  assert before.diff(fewer).launches_delta < 0
  assert shrunk.status == "pass" and not any("grew" in d for d in shrunk.details), shrunk
  # Nothing targeted: no removal to measure, unless launches grew (a failure).
  assert verify_mod._removal_gate(fewer, fewer, fewer.diff(fewer), None).status == (  # noqa: SLF001
      verify_mod.NOT_MEASURED)
  more = verify_mod._removal_gate(fewer, after, fewer.diff(after), None)  # noqa: SLF001
  assert fewer.diff(after).launches_delta > 0 and more.status == "fail", more
  # A swap judged on the lines it replaced: the finding's line, or another
  # line of its file (nothing targeted there).
  import types  # pylint: disable=import-outside-toplevel
  (f,) = before.findings_of(FindingKind.UNFUSED_EPILOGUE)

  def replaced(line, file=f.source.file):
    return types.SimpleNamespace(replaced=[types.SimpleNamespace(locations=[(file, line)])])

  at = verify_mod._removal_gate(before, after, diff, replaced(f.source.line))  # noqa: SLF001
  assert at.status == "pass" and at.figures.startswith("1/1 targeted"), at
  off = verify_mod._removal_gate(before, after, diff, replaced(f.source.line + 1))  # noqa: SLF001
  assert off.status == verify_mod.NOT_MEASURED and off.figures.startswith("0/0 targeted"), off
  elsewhere = verify_mod._removal_gate(  # noqa: SLF001
      before, after, diff, replaced(f.source.line, "/elsewhere/model.py"))
  assert elsewhere.status == verify_mod.NOT_MEASURED, elsewhere


def _sin_times(x, w):
  return jnp.sin(x) * w


@jax.custom_vjp
def _sin_times_bad_dx(x, w):
  return jnp.sin(x) * w


_sin_times_bad_dx.defvjp(
    lambda x, w: (jnp.sin(x) * w, (x, w)),
    # The gradient in x is 1% off; the one in w is right.
    lambda res, ct: (ct * jnp.cos(res[0]) * res[1] * 1.01, ct * jnp.sin(res[0])))


def test_a_single_int_grad_argnum_compares_that_arguments_gradient():
  # `grad_argnums=0` (an int, as with `jax.grad`) means argument 0: its
  # gradient is compared and the candidate's wrong one fails the numerics
  # gate, though the outputs agree.
  x = jnp.linspace(0.1, 1.0, 64, dtype=jnp.float32)
  w = jnp.linspace(1.0, 2.0, 64, dtype=jnp.float32)
  r = pallas_kernels.verify(_sin_times, _sin_times_bad_dx, x, w, grad_argnums=0)
  numerics = r.gate("numerics")
  assert numerics.status == "fail" and "numerics" in r.verdict, str(r)
  assert "; gradients (args [0]) within " in numerics.figures, numerics.figures
  assert any(d.startswith("worst gradient: leaf 0 float32[64]") for d in numerics.details), \
      numerics.details


@pytest.mark.usefixtures("clean_fallbacks")
def test_a_validated_and_timed_sweep_point_records_each_phases_seconds_apart():
  # A sweep record's "seconds" name each phase: validation's and timing's
  # are two measurements, both kept, neither written over by the other.
  spec = registry.get_spec("softmax")
  p = {"rows": 8, "cols": 16, "grad": False}
  out = sweep.OpSweep(spec).run(p, plugins.Measure(validate=True, time=True, repeats=1,
                                                   warmup=0),
                                lambda fn, args: {"seconds": {"audit": 0.0}})
  assert set(out["seconds"]) == {"audit", "validate", "time"}, out["seconds"]
  assert out["seconds"]["validate"] > 0 and out["seconds"]["time"] > 0
  assert out["timing"]["kernel_ms"] > 0 and out["validation"]["passed"] is True


def test_verify_refuses_an_abstract_argument_even_beside_concrete_ones():
  x = jnp.ones((8, 16), jnp.float32)
  shape = jax.ShapeDtypeStruct((8, 16), jnp.float32)
  for args in ((shape,), (x, shape), (x, {"w": shape})):
    with pytest.raises(ValueError, match="pass concrete arrays, not ShapeDtypeStructs"):
      pallas_kernels.verify(jnp.tanh, jnp.tanh, *args)


def test_a_leaf_of_another_shape_or_dtype_is_named_by_its_position():
  a = (jnp.ones((4,), jnp.float32), jnp.ones((2, 3), jnp.float32), jnp.ones((5,), jnp.float32))
  b = (jnp.ones((4,), jnp.float32), jnp.ones((3, 2), jnp.float32), jnp.ones((5,), jnp.bfloat16))
  worst, lines, ok = verify_mod._compare("outputs", a, b, [jnp.dtype(jnp.float32)], False)
  assert not ok
  # Another shape alone, another dtype alone: each named.
  assert "outputs[1]: float32[3, 2] vs float32[2, 3]" in lines
  assert "outputs[2]: bfloat16[5] vs float32[5]" in lines
  _, lines, ok = verify_mod._compare("outputs", a, a[:1], [jnp.dtype(jnp.float32)], False)
  assert not ok and lines == ["outputs: 3 vs 1 leaves"]


def test_only_floating_leaves_with_a_dtype_set_the_bound():
  tree = (jnp.ones(2, jnp.int32), 3.0, {"w": jnp.ones(2, jnp.bfloat16)}, np.ones(2, np.float16))
  assert verify_mod._float_dtypes(tree) == [jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)]  # noqa: SLF001


def test_a_candidate_within_the_bound_passes_without_being_held_to_the_truth():
  # The candidate is 0.01% off a baseline that the float32 truth matches
  # exactly: within the bound, it passes; the truth only excuses, never fails.
  x = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, 256), jnp.bfloat16)
  f = lambda x: x.astype(jnp.float32) * 2
  r = pallas_kernels.verify(f, lambda x: f(x) * (1 + 1e-4), x)
  numerics = r.gate("numerics")
  assert numerics.status == "pass", str(r)
  assert "against float32" not in numerics.details[0]


@pytest.mark.parametrize("after, status", [
    (900, "pass"),    # the peak fell
    (1040, "pass"),   # +4%: within the 5% tolerance
    (1050, "pass"),   # +5%: at it (the tolerance is inclusive)
    (1060, "fail"),   # +6%
])
def test_the_memory_gate_holds_the_peak_to_its_tolerance(after, status):
  import types  # pylint: disable=import-outside-toplevel
  gate = verify_mod._memory_gate(types.SimpleNamespace(peak_bytes=1000),  # noqa: SLF001
                                 types.SimpleNamespace(peak_bytes=after), 0.05, False)
  assert gate.status == status, gate
  assert gate.figures.endswith(f"tolerance +5%): 1000 -> {after} B")


def test_an_exact_candidate_still_names_its_worst_leaf():
  x = jnp.linspace(0.5, 1.5, 64, dtype=jnp.float32)
  numerics = pallas_kernels.verify(jnp.tanh, jnp.tanh, x).gate("numerics")
  assert numerics.status == "pass"
  assert numerics.details[0].startswith("worst output: leaf 0 float32[64] rel. error 0.00e+00")
