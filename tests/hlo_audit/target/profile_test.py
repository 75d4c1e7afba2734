"""Kernel times read from JAX's profiler trace."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.errors import HloAuditError
from hlo_audit._src.target.profile import kernel_profile, read_trace_events


def _event(op, ts, dur, run, module="jit_f"):
  return {"ph": "X", "name": op, "ts": ts, "dur": dur,
          "args": {"hlo_op": op, "hlo_module": module, "run_id": run}}


def test_kernel_times_are_medians_over_runs_of_each_runs_sum():
  events = [
      # run 1: the loop body kernel twice, then the output
      _event("body", 0, 10, "1"), _event("body", 10, 10, "1"), _event("out", 20, 5, "1"),
      # run 2: slower
      _event("body", 100, 20, "2"), _event("body", 120, 20, "2"), _event("out", 140, 5, "2"),
      # run 3
      _event("body", 200, 12, "3"), _event("body", 212, 12, "3"), _event("out", 224, 7, "3"),
      # another module's kernel, and a host event: not ours
      _event("body", 300, 999, "4", module="jit_g"), {"ph": "X", "name": "host", "ts": 0,
                                                      "dur": 5},
  ]
  p = kernel_profile(events, "jit_f")
  assert p.runs == 3
  assert p.kernel_times["body"] == pytest.approx(24e-6)  # median of 20, 40, 24 us
  assert p.kernel_times["out"] == pytest.approx(5e-6)
  assert p.launches == {"body": 2, "out": 1}
  assert p.step_times == pytest.approx((25e-6, 45e-6, 31e-6))
  assert p.step_time == pytest.approx(31e-6)
  assert p.kernel_runs["out"] == pytest.approx((5e-6, 5e-6, 7e-6))
  only = kernel_profile(events, "jit_f", kernels=["out"])
  assert set(only.kernel_times) == {"out"}


def test_a_device_s_events_are_grouped_by_the_step_that_launched_them():
  # A GPU's activity carries the group_id of its step, not XLA:CPU's run_id.
  def gpu(op, ts, dur, group):
    return {"ph": "X", "name": op, "ts": ts, "dur": dur,
            "args": {"hlo_op": op, "hlo_module": "jit_f", "group_id": group}}

  events = [gpu("k", 0, 10, "1"), gpu("k", 10, 10, "1"), gpu("k", 100, 30, "2")]
  p = kernel_profile(events, "jit_f")
  assert p.runs == 2 and p.step_times == pytest.approx((20e-6, 30e-6))
  assert p.launches == {"k": 2}  # per run: the first step's two


def test_an_asynchronous_kernel_lasts_until_the_next_starts_or_the_run_ends():
  # XLA:CPU's Eigen dot: its event ends when its work is handed to the
  # thread pool; the next kernel starts 480 us later, and the run's wait for
  # completion ends after the last kernel's asynchronous work.
  events = [
      _event("dot", 0, 20, "7"), _event("add", 500, 10, "7"), _event("dot2", 510, 5, "7"),
      {"ph": "X", "name": "ThunkExecutor::Execute (wait for completion)", "ts": 15,
       "dur": 900, "args": {"run_id": "7"}},
      # Kernels that overlap (run at once on two threads) keep their own time.
      _event("a", 2000, 100, "8", module="jit_h"), _event("b", 2010, 50, "8", module="jit_h"),
  ]
  p = kernel_profile(events, "jit_f", asynchronous={"dot", "dot2"})
  assert p.kernel_times["dot"] == pytest.approx(500e-6)
  assert p.kernel_times["add"] == pytest.approx(10e-6)
  assert p.kernel_times["dot2"] == pytest.approx(405e-6)  # to the run's end at 915
  assert p.step_times[0] == pytest.approx(915e-6)
  # Kernels not named keep their events' times; the run's end stands.
  plain = kernel_profile(events, "jit_f")
  assert plain.kernel_times["dot"] == pytest.approx(20e-6)
  assert plain.kernel_times["dot2"] == pytest.approx(5e-6)
  assert plain.step_times[0] == pytest.approx(915e-6)
  both = kernel_profile(events, "jit_h", asynchronous=True)
  assert both.kernel_runs["a"] == pytest.approx((100e-6,))
  assert both.kernel_runs["b"] == pytest.approx((50e-6,))
  # A wait that names no run (another executor's) ends no run.
  unnamed = {"ph": "X", "name": "ThunkExecutor::Execute (wait for completion)", "ts": 0,
             "dur": 5000, "args": {}}
  assert kernel_profile([*events, unnamed], "jit_f", asynchronous={"dot", "dot2"}) == p


def test_a_folder_without_a_trace_is_one_clear_error(tmp_path):
  with pytest.raises(HloAuditError, match="no perfetto_trace.json.gz"):
    read_trace_events(str(tmp_path))
  bad = tmp_path / "plugins" / "profile" / "x" / "perfetto_trace.json.gz"
  bad.parent.mkdir(parents=True)
  bad.write_bytes(gzip.compress(b"{not json"))
  with pytest.raises(HloAuditError, match="cannot read the profiler's trace"):
    read_trace_events(str(tmp_path))
  bad.write_bytes(gzip.compress(json.dumps({"traceEvents": [
      {"ph": "X", "name": "k", "ts": 1, "dur": 2}, {"ph": "M", "name": "m"}]}).encode()))
  assert [e["name"] for e in read_trace_events(str(tmp_path))] == ["k"]


def test_profiling_a_program_names_its_kernels_as_the_audit_does():
  def f(x, w):
    return jnp.tanh(x @ w).sum(axis=1)

  x = jnp.ones((64, 64))
  compiled = jax.jit(f).lower(x, x).compile()
  report = hlo_audit.audit(compiled)
  p = hlo_audit.profile_kernels(compiled, x, x, runs=3, warmup=1)
  assert p.runs == 3 and p.module == report.module.name
  assert set(p.kernel_times) <= {k.name for k in report.kernels}
  assert p.kernel_times and all(t > 0 for t in p.kernel_times.values())
  assert p.step_time == pytest.approx(max(p.kernel_times.values()), rel=1.0)
