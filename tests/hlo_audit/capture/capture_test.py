"""capture(): every accepted input, what it holds, and clear errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
from hlo_audit import CaptureError

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
  assert c.live_range is not None and c.live_range.sequence
  assert c.notes == ()


def test_plain_callable_real_arrays_kwargs_and_lowered():
  x = np.ones((8, 16), np.float32)
  w = np.ones((16, 32), np.float32)
  c = hlo_audit.capture(mlp, x, w, scale=2.0)
  assert c.module.entry.root.shape.dtype_str == "f32[8,32]"
  lowered = jax.jit(mlp).lower(X, W)
  c2 = hlo_audit.capture(lowered)
  assert c2.origin == "lowered" and c2.buffer_assignment is not None


def test_compiled_stage_says_it_has_no_dump():
  compiled = jax.jit(mlp).lower(X, W).compile()
  c = hlo_audit.capture(compiled)
  assert c.origin == "compiled" and c.buffer_assignment is None
  assert any("Compiled" in n for n in c.notes)
  assert c.memory_stats is not None


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
  with pytest.raises(CaptureError, match="takes no arguments"):
    hlo_audit.capture(jax.jit(mlp).lower(X, W), X)
