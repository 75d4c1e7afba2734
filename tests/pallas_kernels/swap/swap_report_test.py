"""`SwapReport`: its text, dict and counts, the user's lines of each site,
and one trace per input signature."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

import pallas_kernels

_F32 = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 24), jnp.float32)
_S32 = jax.ShapeDtypeStruct((8, 16), jnp.int32), jax.ShapeDtypeStruct((16, 24), jnp.int32)
_GUARD = "x dtype int32 is not one of "


def two_dots(x, w, xi, wi):
  y = x @ w  # dot line
  y = jnp.tanh(y + 1.0)  # epilogue line
  z = jnp.maximum(xi @ wi + 3, 0)  # int line
  return y, z


def _line(marker: str) -> int:
  import inspect
  lines, start = inspect.getsourcelines(two_dots)
  return start + next(i for i, l in enumerate(lines) if l.endswith(f"# {marker}\n"))


def test_report_text_dict_and_counts():
  swapped = pallas_kernels.swap(two_dots)
  report = swapped.report(*_F32, *_S32)
  assert swapped.last_report is report
  assert report.kernels() == {"pallas_kernels.matmul": 1}
  (done,), (left,) = report.replaced, report.left
  assert done.status == "replaced"
  assert left.status.startswith("left to XLA: " + _GUARD) and left.reason.startswith(_GUARD)
  here = __file__
  lines = str(report).splitlines()
  assert lines[0] == "swap(two_dots): 1 replaced, 1 left to XLA"
  assert lines[1] == (f"  + pallas_kernels.matmul: dot_general + bias + activation:tanh at "
                      f"{here}:{_line('dot line')} (two_dots)")
  assert lines[2] == ("      matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], "
                      "activation='tanh') -> f32[8,24]")
  assert lines[3] == (f"  - pallas_kernels.matmul: dot_general + bias + activation:relu at "
                      f"{here}:{_line('int line')} (two_dots)")
  assert lines[4].endswith("-> s32[8,24]") and "bias=s32[24]" in lines[4]
  assert lines[5] == f"      left to XLA: {left.reason}" and len(lines) == 6
  d = report.to_dict()
  assert d["function"] == "two_dots" and len(d["sites"]) == 2
  assert d["sites"][0] == {
      "kernel": "pallas_kernels.matmul", "pattern": "dot_general + bias + activation:tanh",
      "call": "matmul(x=f32[8,16], w=f32[16,24], bias=f32[24], activation='tanh')",
      "output": "f32[8,24]", "source": f"{here}:{_line('dot line')} (two_dots)",
      "where": "", "replaced": True, "reason": "",
      "locations": [[here, _line("dot line")], [here, _line("epilogue line")]]}
  assert d["sites"][1]["replaced"] is False and d["sites"][1]["reason"] == left.reason


def test_sites_in_bodies_say_where_in_the_text():
  def f(c, xs, w):
    def body(c, x):
      c = jax.lax.cond(x.sum() > 0, lambda c: jnp.tanh(c @ w), lambda c: c, c)
      return jnp.tanh(c @ w + 1.0), None
    return jax.lax.scan(body, c, xs)[0]

  report = pallas_kernels.swap(f).report(jnp.ones((8, 16)), jnp.ones((3, 8, 16)),
                                         jnp.ones((16, 16)))
  assert [s.where for s in report.sites] == ["scan body/cond branch 1", "scan body"]
  text = str(report).splitlines()
  assert text[1].endswith(".f.<locals>.body.<locals>.<lambda>) [scan body/cond branch 1]")
  assert text[3].endswith(".f.<locals>.body) [scan body]")


def test_one_trace_per_signature_and_the_report_of_the_last_one():
  traces = []

  def f(x, w):
    traces.append(x.shape)
    return jnp.tanh(x @ w)

  swapped = pallas_kernels.swap(f)
  first = swapped.report(*_F32)
  assert swapped.report(*_F32) is first and len(traces) == 1
  other = swapped.report(jax.ShapeDtypeStruct((4, 16), jnp.float32), _F32[1])
  assert len(traces) == 2 and other.sites[0].output == "f32[4,24]"
  assert swapped.last_report is other
  # So is the dtype.
  bf16 = swapped.report(jax.ShapeDtypeStruct((8, 16), jnp.bfloat16),
                        jax.ShapeDtypeStruct((16, 24), jnp.bfloat16))
  assert len(traces) == 3 and bf16.sites[0].output == "bf16[8,24]"
  # A static (non-array) argument is part of the signature.
  g = pallas_kernels.swap(lambda x, w, k: jnp.tanh(x @ w) * k)
  assert g.report(*_F32, 2.0) is g.report(*_F32, 2.0)
  assert g.report(*_F32, 2.0) is not g.report(*_F32, 3.0)


def test_a_partial_is_reported_by_its_function_name():
  def dense(x, w, scale):
    return jnp.tanh(x @ w) * scale

  report = pallas_kernels.swap(functools.partial(dense, scale=2.0)).report(*_F32)
  assert report.function == "test_a_partial_is_reported_by_its_function_name.<locals>.dense"
  assert str(report).startswith(f"swap({report.function}): 1 replaced")


def test_the_kernel_keeps_the_users_name_stack_in_the_hlo():
  # XLA's metadata (what an audit reads back as where a kernel comes from)
  # keeps the user's scope around the swapped kernel.
  def block(x, w):
    with jax.named_scope("mlp_block"):
      return jnp.tanh(x @ w)

  x, w = jnp.ones((8, 16)) / 4, jnp.ones((16, 24)) / 4
  text = jax.jit(pallas_kernels.swap(block)).lower(x, w).as_text(debug_info=True)
  kernel = [ln for ln in text.splitlines() if "pallas_kernels.matmul" in ln]
  assert kernel, "no kernel in the lowered program"
  assert any("mlp_block/" in ln for ln in kernel), kernel[:3]
