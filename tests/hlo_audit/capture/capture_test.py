"""capture(): every accepted input, what it holds, and clear errors."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
from hlo_audit import CaptureError, TargetError

S = jax.ShapeDtypeStruct


def mlp(x, w, *, scale=1.0):
  return jnp.tanh(x @ w) * scale


X = S((8, 16), jnp.float32)
W = S((16, 32), jnp.float32)


@functools.cache
def jit_capture():
  return hlo_audit.capture(jax.jit(mlp), X, W)


def test_capture_of_a_jit_function_holds_everything():
  c = jit_capture()
  assert c.origin == "jit"
  assert c.module.name == "jit_mlp"
  assert "ENTRY" in c.hlo_text and c.module.entry.root.shape.dtype_str == "f32[8,32]"
  assert c.pre_optimization_text and "HloModule" in c.pre_optimization_text
  assert c.platform == "cpu" and c.jax_version == jax.__version__
  assert c.cost_analysis and c.cost_analysis["flops"] > 0
  m = c.memory_analysis()
  assert m.argument_bytes == (8 * 16 + 16 * 32) * 4
  assert m.output_bytes == 8 * 32 * 4
  assert c.buffer_assignment is not None and c.buffer_assignment.allocations
  assert c.xla_memory_source == "buffer-assignment proto"
  assert c.live_range is None  # only XLA's dump reports have live ranges
  assert c.notes == ()


def test_the_executables_buffer_assignment_is_named_on_first_read(monkeypatch):
  from hlo_audit._src import compat
  asked = []
  real = compat.hlo_module_proto
  monkeypatch.setattr(compat, "hlo_module_proto", lambda c: asked.append(1) or real(c))
  c = hlo_audit.capture(jax.jit(mlp).lower(X, W).compile())
  # The sizes XLA's peak sums are read at once; the module proto that names
  # the values is asked for only when someone reads the assignment.
  assert c.xla_allocated_bytes and asked == []
  report = hlo_audit.audit_capture(c)
  assert report.module.xla_peak_source == "buffer-assignment proto" and asked == []
  assert c.buffer_assignment.allocated_bytes() == c.xla_allocated_bytes
  assert asked == [1]
  assert c.buffer_assignment is c.buffer_assignment and asked == [1]


@functools.cache
def reports_capture():
  return hlo_audit.capture(jax.jit(mlp), X, W, xla_reports=True)


def test_xla_reports_under_the_persistent_cache_say_why_they_are_missing(tmp_path):
  # jax's persistent cache key drops the dump options: the dump compile loads
  # the executable the first compile stored, and XLA writes no reports. The
  # capture must say so, not read as an audit with reports.
  script = (
      "import jax, jax.numpy as jnp, hlo_audit\n"
      "f = jax.jit(lambda x, w: jnp.tanh(x @ w).sum())\n"
      "c = hlo_audit.capture(f, jnp.ones((8, 16)), jnp.ones((16, 4)), xla_reports=True)\n"
      "print(c.xla_memory_source); print(*c.notes, sep='\\n')\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  source, *notes = out.stdout.splitlines()
  assert source != "dump reports"
  assert any("XLA wrote no dump reports" in n and "persistent compilation cache" in n
             and str(tmp_path / "cache") in n for n in notes), out.stdout


def test_xla_reports_add_live_ranges_and_agree_with_the_proto():
  c = reports_capture()
  assert c.xla_memory_source == "dump reports" and c.notes == ()
  assert c.live_range is not None and c.live_range.sequence

  def table(ba):
    return [(a.index, a.size, a.kind, a.parameter_number, a.is_thread_local,
             sorted((v.instruction, v.shape_index, v.size, v.offset)
                    for v in a.values)) for a in ba.allocations]
  # The executable's proto, decoded, says what XLA's text report says.
  assert table(jit_capture().buffer_assignment) == table(c.buffer_assignment)


class _Compiles:
  """Counts XLA backend compiles (jax.monitoring events) while active."""

  def __init__(self):
    self.count = 0
    self.active = False
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event, duration, **_):
    if self.active and event == "/jax/core/compile/backend_compile_duration":
      self.count += 1

  def __enter__(self):
    self.count, self.active = 0, True
    return self

  def __exit__(self, *exc):
    self.active = False


_COMPILES = _Compiles()


def test_audit_reuses_the_executable_jit_built():
  def step(x, w):  # a function jax has not compiled before this test
    return jnp.sin(x @ w) + 1.0
  jitted = jax.jit(step)
  x, w = np.ones((8, 16), np.float32), np.ones((16, 32), np.float32)
  with _COMPILES as compiles:
    jitted(x, w)
  assert compiles.count == 1  # the counter sees jit's own compile
  with _COMPILES as compiles:
    report = hlo_audit.audit(jitted, x, w)
    hlo_audit.audit(jax.jit(step), X, W)  # a new jit object, abstract args
  assert compiles.count == 0
  assert report.module.xla_peak_source == "buffer-assignment proto"
  assert report.xla_peak_bytes and report.xla_peak_bytes > 0
  with _COMPILES as compiles:
    report = hlo_audit.audit(jitted, x, w, xla_reports=True)
  assert compiles.count == 1  # dump options are part of jax's cache key
  assert report.module.xla_peak_source == "dump reports"


def test_audit_before_jit_compiles_once_for_both():
  def step(x, w):
    return jnp.cos(x @ w) * 2.0
  jitted = jax.jit(step)
  x, w = np.ones((8, 16), np.float32), np.ones((16, 32), np.float32)
  with _COMPILES as compiles:
    hlo_audit.audit(jitted, x, w)
    jitted(x, w)
  assert compiles.count == 1


def test_audit_reads_xla_analyses_only_after_its_own(monkeypatch):
  """XLA's memory analysis runs beside the audit's analyses: the audit asks
  for its result only to report XLA's peak, after the findings."""
  import threading

  from hlo_audit._src import audit as audit_mod
  from hlo_audit._src.capture import capture as capture_mod
  started, order = threading.Event(), []
  real_memory, real_kernels = capture_mod._raw_memory, audit_mod.find_kernels

  def slow_memory(compiled):  # XLA's analysis, done only once the audit runs
    order.append("analyses waited" if started.wait(timeout=30) else "analyses first")
    return real_memory(compiled)

  def kernels(*args, **kwargs):
    started.set()
    return real_kernels(*args, **kwargs)

  monkeypatch.setattr(capture_mod, "_raw_memory", slow_memory)
  monkeypatch.setattr(audit_mod, "find_kernels", kernels)
  report = hlo_audit.audit(jax.jit(mlp), X, W)
  assert order == ["analyses waited"]
  # The same report as from the whole capture: XLA's peak and cost included.
  whole = hlo_audit.audit_capture(hlo_audit.capture(jax.jit(mlp), X, W))
  assert report.xla_peak_bytes == whole.xla_peak_bytes > 0
  assert report.module.xla_peak_source == "buffer-assignment proto"
  assert report.cost_analysis == whole.cost_analysis and report.cost_analysis["flops"] > 0
  assert report.to_json() == whole.to_json()


def test_a_pending_capture_holds_the_module_then_xla_analyses():
  from hlo_audit._src.capture.capture import start_capture
  pending = start_capture(jax.jit(mlp), X, W)
  assert pending.partial.module.name == "jit_mlp"
  assert pending.partial.memory_stats is None and pending.partial.cost_analysis is None
  assert pending.partial.argument_names == ("x", "w")
  whole = pending.result()
  assert whole is pending.result()  # waited for once
  assert whole.memory_stats.output_bytes == 8 * 32 * 4
  assert whole.xla_memory_source == "buffer-assignment proto"
  assert whole.argument_names == ("x", "w") and whole.module is pending.partial.module
  assert whole.pre_optimization_text and "HloModule" in whole.pre_optimization_text


def test_plain_callable_real_arrays_kwargs_and_lowered():
  x = np.ones((8, 16), np.float32)
  w = np.ones((16, 32), np.float32)
  c = hlo_audit.capture(mlp, x, w, scale=2.0)
  assert c.module.entry.root.shape.dtype_str == "f32[8,32]"
  lowered = jax.jit(mlp).lower(X, W)
  c2 = hlo_audit.capture(lowered)
  assert c2.origin == "lowered" and c2.buffer_assignment is not None


def test_compiled_stage_has_xla_buffer_assignment_but_no_dump():
  compiled = jax.jit(mlp).lower(X, W).compile()
  c = hlo_audit.capture(compiled)
  # The executable carries XLA's buffer assignment; only live ranges need a
  # dump, which a Compiled cannot make.
  assert c.origin == "compiled" and c.buffer_assignment is not None
  assert c.live_range is None and c.notes == ()
  assert c.memory_stats is not None
  # Nor is its module before optimizations there to read: none, not an error.
  assert c.pre_optimization_text is None
  with pytest.raises(CaptureError, match="cannot be compiled again"):
    hlo_audit.capture(compiled, xla_reports=True)


def test_static_and_donated_arguments_are_honoured():
  def f(x, n):
    return x * n
  c = hlo_audit.capture(jax.jit(f, static_argnums=1, donate_argnums=0), X, 3)
  assert "input_output_alias" in c.module.attributes
  assert c.module.input_output_alias[0].parameter == 0


def test_pytree_arguments():
  def f(params, x):
    return x @ params["w"] + params["b"]
  c = hlo_audit.capture(f, {"w": W, "b": S((32,), jnp.float32)}, X)
  assert len(c.module.entry.parameters) == 3


def test_errors_name_the_problem():
  with pytest.raises(CaptureError, match="expects a function"):
    hlo_audit.capture(42)
  with pytest.raises(CaptureError, match=r"could not trace mlp\(float32\[8, 16\]\)"):
    hlo_audit.capture(mlp, X)
  def not_jittable(x):
    return float(x.sum())  # concrete value of a tracer
  with pytest.raises(CaptureError, match="could not trace not_jittable"):
    hlo_audit.capture(not_jittable, X)
  lowered = jax.jit(mlp).lower(X, W)
  compiled = lowered.compile()
  # Positional or keyword, either is refused by either stage.
  for stage, args, kwargs in [(lowered, (X,), {}), (lowered, (), {"x": X}),
                              (compiled, (X,), {}), (compiled, (), {"x": X})]:
    with pytest.raises(CaptureError, match=f"a {type(stage).__name__} stage takes no arguments"):
      hlo_audit.capture(stage, *args, **kwargs)


def test_a_stage_lowered_already_is_refused_another_target():
  # Its devices are fixed at lowering: the function and its arguments go
  # with target=, which this refusal says (no CUDA plugin needed to refuse).
  with pytest.raises(CaptureError, match="lowered for its devices already.*target='h200'"):
    hlo_audit.capture(jax.jit(mlp).lower(X, W), target="h200")


def test_a_function_with_a_target_is_not_taken_for_a_stage():
  # Without the CUDA plugin the target's own error; with it, a capture.
  try:
    hlo_audit.capture(jax.jit(mlp), X, W, target="h200")
  except (CaptureError, TargetError) as e:
    assert "lowered for its devices already" not in str(e)


@pytest.mark.parametrize("n, more", [(6, ""), (7, ", ...")])
def test_a_failed_trace_names_the_first_six_arguments(n, more):
  def many(*xs):
    return float(sum(x.sum() for x in xs))  # concrete value of a tracer
  args = [S((i + 1,), jnp.float32) for i in range(n)]
  shapes = ", ".join(f"float32[{i + 1}]" for i in range(6))
  with pytest.raises(CaptureError) as e:
    hlo_audit.capture(many, *args)
  assert f"could not trace many({shapes}{more})" in str(e.value)


def _lowered_compile(monkeypatch, with_options):
  """Lowered.compile as an older or failing JAX has it: `with_options(options)`
  runs for a compile given compiler options, in place of the compile."""
  original = jax.stages.Lowered.compile

  def compile(self, compiler_options=None):  # pylint: disable=redefined-builtin
    if compiler_options:
      with_options(compiler_options)
    return original(self)

  monkeypatch.setattr(jax.stages.Lowered, "compile", compile)


def test_a_jax_without_per_compile_options_captures_and_says_why_no_reports(monkeypatch):
  def refuse(options):
    raise TypeError("compile() got an unexpected keyword argument 'compiler_options'")
  _lowered_compile(monkeypatch, refuse)
  c = hlo_audit.capture(jax.jit(mlp).lower(X, W), xla_reports=True)
  assert c.notes == ("this JAX cannot pass per-compile dump options; XLA's live ranges "
                     "are unavailable",)
  assert c.live_range is None and c.xla_memory_source != "dump reports"
  assert c.module.entry.root.shape is not None  # the module itself is there


def test_a_dump_compile_that_fails_is_one_line_naming_xla(monkeypatch):
  def fail(options):
    assert options["xla_dump_hlo_as_text"] is True and options["xla_dump_to"]
    raise RuntimeError("INVALID_ARGUMENT: no such flag\n  at some/deep/frame.cc:12")
  _lowered_compile(monkeypatch, fail)
  with pytest.raises(CaptureError) as e:
    hlo_audit.capture(jax.jit(mlp).lower(X, W), xla_reports=True)
  assert str(e.value) == "XLA failed to compile: RuntimeError: INVALID_ARGUMENT: no such flag"


def test_a_wrapper_that_lowers_but_is_not_jaxs_is_lowered_through_its_own_lower():
  class Staged:  # as a library's jit wrapper: its own `lower`, not jax's Wrapped
    def __init__(self, f):
      self.lowered_with = None
      self._jit = jax.jit(f)

    def lower(self, *args, **kwargs):
      self.lowered_with = args
      return self._jit.lower(*args, **kwargs)

  staged = Staged(mlp)
  c = hlo_audit.capture(staged, X, W)
  assert staged.lowered_with == (X, W)
  assert c.module.entry.root.shape.dims == (8, 32)  # mlp(X, W)


def test_a_capture_s_allocated_bytes_come_from_its_assignment_unless_given():
  from hlo_audit._src.capture.result import Capture  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.hlo.xla_reports import Allocation, BufferAssignment  # pylint: disable=import-outside-toplevel
  module = hlo_audit.parse_hlo("HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
  ba = BufferAssignment((Allocation(0, 16, parameter_number=0),
                         Allocation(1, 8, is_thread_local=True)))
  assert Capture(module, "", xla_buffer_assignment=ba).xla_allocated_bytes == 16
  # XLA's own figure (the proto's) stands beside a report read elsewhere.
  given = Capture(module, "", xla_buffer_assignment=ba, xla_allocated_bytes=64)
  assert given.xla_allocated_bytes == 64
  assert Capture(module, "", xla_buffer_assignment=lambda: ba).xla_allocated_bytes is None


def test_the_device_is_read_from_the_executable_s_shardings():
  import types  # pylint: disable=import-outside-toplevel
  from hlo_audit._src.capture.capture import _device  # pylint: disable=import-outside-toplevel
  target_device = object()  # a device this process has none of (a target's)
  sharded = types.SimpleNamespace(device_set={target_device})
  compiled = types.SimpleNamespace(input_shardings=({"w": None, "x": sharded},),
                                   output_shardings=sharded)
  assert _device(compiled) is target_device
  # Nothing to read: this process's first device.
  assert _device(types.SimpleNamespace()) is jax.devices()[0]
