"""Sweep targets: parameters, canonical values, argument templates, kernel cases."""

from __future__ import annotations

import jax
import pytest

import hlo_audit
from hlo_audit._src.sweep.grid import GridError
from hlo_audit._src.sweep.targets import (TIME_KEYS, KernelTarget, Measure, TargetRef,
                                          audit_summary, kernel_targets, make_target,
                                          render_args, template_names)
from tests.hlo_audit.testing.assertions_test import GPU_UNFUSED
from tests.hlo_audit.testing.min_time_test import FACTS


def test_example_exposes_its_sizes_and_fills_defaults():
  t = make_target(TargetRef("example"))
  names = [p.name for p in t.params]
  assert names == ["batch", "seq", "d_model", "heads", "d_ff", "layers", "vocab",
                   "dtype", "backward"]
  params = t.resolve({"batch": 2, "dtype": "bf16", "backward": False})
  assert params["batch"] == 2 and params["dtype"] == "bfloat16"
  assert params["seq"] == 128 and params["backward"] is False


def test_spellings_of_one_dtype_are_one_point():
  t = make_target(TargetRef("example"))
  assert t.resolve({"dtype": "f32"}) == t.resolve({"dtype": "float32"}) == t.resolve({})


@pytest.mark.parametrize("values, message", [
    ({"bacth": 2}, "grid name 'bacth' is not a parameter of target 'example'; known: batch"),
    ({"batch": "two"}, "batch='two'.*expected an integer"),
    ({"batch": 1.5}, "expected an integer"),
    ({"batch": True}, "expected an integer"),
    ({"dtype": "float33"}, "'float33' is not a dtype"),
    ({"backward": 3}, "expected true or false"),
    ({"seq": None}, "seq cannot be none"),
])
def test_example_rejects_bad_grid_values(values, message):
  with pytest.raises(GridError, match=message):
    make_target(TargetRef("example")).resolve(values)


def test_unknown_target_and_misplaced_args():
  with pytest.raises(GridError, match="expected 'example', MODULE:FUNCTION, or a kernel"):
    make_target(TargetRef("exampel"))
  with pytest.raises(GridError, match="--args applies to MODULE:FUNCTION"):
    make_target(TargetRef("example", args="f32[1]"))
  with pytest.raises(GridError, match="needs --args"):
    make_target(TargetRef("m.py:f"))


def test_render_args_substitutes_names_expressions_and_dtypes():
  t = "x=f32[{b},{d}]; w={dtype}[{d}, {4*d}] ;s32[];bias={dtype}[{(d+1)//2}]"
  assert template_names(t) == ("b", "d", "dtype")
  assert render_args(t, {"b": 8, "d": 16, "dtype": "bfloat16"}) == (
      "f32[8,16]", "bf16[16,64]", "s32[]", "bf16[8]")
  assert render_args(t, {"b": 1, "d": 2, "dtype": "f16"})[1] == "f16[2,8]"


@pytest.mark.parametrize("template, values, message", [
    ("x=f32[{b}]", {}, "uses 'b', which the grid does not set"),
    ("x=f33[{b}]", {"b": 1}, "unknown element type 'f33'"),
    ("x=f32[{b}", {"b": 1}, "expected an HLO shape like f32"),
    ("x=f32({b})", {"b": 1}, "unknown element type 'f32\\(1\\)'"),
    ("x=f32[{b*dt}]", {"b": 1, "dt": "f32"}, "arithmetic on non-integers"),
    ("x=f32[{b**2}]", {"b": 1}, r"\+ - \* // and parentheses"),
    ("x=f32[{b-4}]", {"b": 1},
     r"\{b-4\} is -3 at b=1, not a dimension \(a non-negative integer\)$"),
    # Every failure names the expression and the point's values at fault.
    ("x=f32[{b//0}]", {"b": 3}, r"'x=f32\[\{b//0\}\]': \{b//0\} divides by zero at b=3$"),
    ("x=f32[{b//(c-d)},{c}]", {"b": 3, "c": 2, "d": 2},
     r"\{b//\(c-d\)\} divides by zero at b=3, c=2, d=2$"),
    ("x=f32[{-dt}]", {"dt": "f32"}, r"\{-dt\} does arithmetic on non-integers at dt=f32$"),
    ("x=f32[{b}]", {"b": "notalist"}, r"\{b\} is 'notalist', not a dimension"),
    ("x=f32[{b}]", {"b": 1.5}, r"\{b\} is 1\.5, not a dimension"),
    ("x=f32[{b}]", {"b": True}, r"\{b\} is True, not a dimension"),
    ("x=f32[{b\x1b}]", {"b": 1}, r"\{b\\x1b\} is not a name"),
    pytest.param("x=f32[{" + "-" * 100_000 + "b}]", {"b": 1},
                 "is not a name or an integer|nested", id="deeply-nested"),
    ("1x=f32[{b}]", {"b": 1}, "is not a label"),
    (" ; ", {}, "no arguments"),
])
def test_render_args_errors(template, values, message):
  with pytest.raises(GridError, match=message):
    render_args(template, values)


def _module(tmp_path, body: str) -> str:
  (tmp_path / "model.py").write_text(body)
  return str(tmp_path / "model.py")


def test_function_target_ids_follow_shapes_and_keywords(tmp_path):
  path = _module(tmp_path, "import jax.numpy as jnp\n"
                           "def f(x, w, act='tanh'):\n"
                           "  return getattr(jnp, act)(x @ w)\n")
  t = make_target(TargetRef(f"{path}:f", args="x=f32[{b},{d}];w=f32[{d},{d}]"))
  p = t.resolve({"b": 4, "d": 8, "act": "sin"})
  assert p["args"] == "f32[4,8];f32[8,8]"
  # Grid names that only size arguments do not enter the identity; keywords do.
  assert t.identity(p) == {"target": f"{path}:f", "args": "f32[4,8];f32[8,8]",
                           "kwargs": {"act": "sin"}}
  out = t.run(p, Measure())
  assert out["audit"]["kernels"] >= 1 and out["audit"]["platform"] == "cpu"
  other = t.run(t.resolve({"b": 4, "d": 8, "act": "tanh"}), Measure())
  assert other["hlo_fingerprint"] != out["hlo_fingerprint"]


@pytest.mark.parametrize("measure", [Measure(validate=True), Measure(time=True)],
                         ids=["validate", "time"])
def test_a_model_target_refuses_kernel_measurements_before_compiling(tmp_path, measure):
  # The API's own check, for a caller that runs a target without a plan.
  path = _module(tmp_path, "def f(x):\n  raise AssertionError('compiled')\n")
  t = make_target(TargetRef(f"{path}:f", args="f32[{b}]"))
  example = make_target(TargetRef("example"))
  for target, params in ((t, t.resolve({"b": 4})), (example, example.resolve({}))):
    with pytest.raises(GridError, match="validate/time apply to kernel targets only"):
      target.run(params, measure)


def test_function_target_rejects_keywords_the_function_lacks(tmp_path):
  path = _module(tmp_path, "def f(x):\n  return x\n")
  t = make_target(TargetRef(f"{path}:f", args="f32[{b}]"))
  with pytest.raises(GridError, match="'c' is not used by --args and is not a parameter"):
    t.resolve({"b": 1, "c": 2})
  with pytest.raises(GridError, match="uses b, which the grid does not set"):
    t.resolve({})


def test_function_target_reports_import_errors(tmp_path):
  t = make_target(TargetRef(f"{tmp_path}/nope.py:f", args="f32[1]"))
  with pytest.raises(GridError, match="no file"):
    t.resolve({"k": 1})


def test_kernel_targets_are_the_installed_librarys_ops():
  targets = kernel_targets()
  for op in ("matmul", "layer_norm", "rms_norm", "softmax"):
    assert op in targets and f"pallas_kernels.{op}" in targets
    t = make_target(TargetRef(op))
    assert isinstance(t, KernelTarget)
    assert [p.name for p in t.params] == [p.name for p in targets[op].params]
  assert "rows" in [p.name for p in make_target(TargetRef("softmax")).params]
  with pytest.raises(GridError, match="grid name 'rows' is not a parameter"):
    make_target(TargetRef("matmul")).resolve({"rows": 4})


def test_kernel_point_audits_xla_and_validates_and_times_the_kernel():
  t = make_target(TargetRef("layer_norm"))
  out = t.run(t.resolve({"rows": 8, "cols": 128}),
              Measure(validate=True, time=True, repeats=2, warmup=1))
  assert out["audit"]["findings"] >= 0 and out["audit"]["peak_bytes"] > 0
  assert out["kernel"]["bytes_moved"] == 8 * 128 * 4 * 2 + 2 * 128 * 4
  assert out["validation"]["passed"] is True
  assert out["timing"]["speedup"] > 0 and out["timing"]["interpret"] is True
  assert set(out["seconds"]) == {"compile", "analysis", "validate", "time"}


def test_audit_summary_keeps_the_estimated_step_its_split_and_device():
  report = hlo_audit.audit_hlo(GPU_UNFUSED, options=hlo_audit.AuditOptions(device=FACTS))
  t = report.timing
  a = audit_summary(report)
  assert a["time_device"] == "test"
  assert [a[k] for k in TIME_KEYS] == [t.step_time, t.memory_time, t.compute_time,
                                       t.launch_time, t.communication_time]
  # Two kernels, each paying its launch: the parts differ and sum to the step.
  assert a["launch_time"] == 2e-6 and a["memory_time"] != a["compute_time"]
  assert sum(a[k] for k in TIME_KEYS[1:]) == pytest.approx(a["step_time"])
  # The device unknown: the keys are there, empty.
  unknown = audit_summary(hlo_audit.audit_hlo(GPU_UNFUSED))
  assert {k: unknown[k] for k in (*TIME_KEYS, "time_device")} == dict.fromkeys(
      (*TIME_KEYS, "time_device"))


def test_the_fingerprint_is_the_programs_not_where_it_was_compiled_from():
  from hlo_audit._src.sweep.targets import program_fingerprint

  def module(frames: str, op_name: str, op: str = "tanh") -> str:
    return f"""HloModule jit_f, is_scheduled=true

FileNames
1 "{frames}"

FunctionNames
1 "f"

FileLocations
1 {{file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}}

StackFrames
1 {{file_location_id=1 parent_frame_id=1}}

ENTRY %main (x: f32[8]) -> f32[8] {{
  %x = f32[8]{{0}} parameter(0), metadata={{op_name="x"}}
  ROOT %t = f32[8]{{0}} {op}(%x), metadata={{op_name="{op_name}" stack_frame_id=1}}
}}
"""

  here = program_fingerprint(module("/work/model.py", "jit(f)/tanh"))
  # A Ray worker's stack, and an op_name with a brace and an escaped quote.
  assert program_fingerprint(module("/ray/default_worker.py", 'jit(f)/a}\\"{b')) == here
  assert program_fingerprint(module("/work/model.py", "jit(f)/tanh", op="exp")) != here


@pytest.mark.parametrize("measure, keys", [
    (Measure(), {"validate", "time"}),
    (Measure(validate=True), {"validate", "time", "seed"}),
    # Timing draws its inputs from the seed too: another seed, another point.
    (Measure(time=True), {"validate", "time", "seed", "repeats", "warmup"}),
])
def test_a_points_identity_holds_what_its_measure_reads(measure, keys):
  assert set(measure.identity) == keys

