"""The convolution calls the audit suggests on XLA:GPU's compiles of keras'
MobileNetV3 and two flax CNNs (committed HLO): each is the convolution the
HLO computes -- every option read off the cuDNN call and the prologue's pad,
none left for the user to fill in -- so its result is the call's output."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
import pallas_kernels as pk
from hlo_audit import plugins
from pallas_kernels._src import registry
from pallas_kernels._src.audit import library
from tests.hlo_audit.real_models import h200_support

MODELS = ("keras_mobilenet", "groupnorm_cnn", "bn_cnn")


@functools.cache
def _calls(name: str):
  text = h200_support.fixture(name)
  module = hlo_audit.parse_hlo(text)
  r = hlo_audit.audit_hlo(text, options=hlo_audit.AuditOptions(device="h200"))
  out = []
  for f in r.actionable:
    op = (f.kernel or "").removeprefix("pallas_kernels.")
    if op not in ("conv2d", "conv2d_weight_grad"):
      continue
    call = registry.specs()[op].suggest(library._facts(f, module))
    out.append((f, call))
  return out


def _array(dt: str, dims) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(dims), jnp.dtype(plugins.numpy_dtype_name(dt)))


def _result_shapes(text: str) -> list[tuple[int, ...]]:
  return [tuple(int(d) for d in m.split(",")) for m in re.findall(r"\[([\d,]+)\]", text)]


@pytest.mark.parametrize("name", MODELS)
def test_each_call_computes_the_convolution_in_the_hlo(name):
  written = [(f, c) for f, c in _calls(name) if c is not None]
  assert written, name
  for f, call in written:
    assert "HO" not in call.result and "=stride" not in call.text(), call.text()
    positional = [_array(dt, dims) for _, dt, dims, pos in call.arrays if pos]
    keywords = {k: _array(dt, dims) for k, dt, dims, pos in call.arrays if not pos}
    options = {k: value for k, _, value in call.options}
    fn = getattr(pk, call.op)
    out = jax.eval_shape(lambda *a, **k: fn(*a, implementation="xla", **k, **options),
                         *positional, **keywords)
    got = [tuple(o.shape) for o in jax.tree.leaves(out)]
    assert got == _result_shapes(call.result), (f.boundary, call.text(), got)
    if call.op == "conv2d" and f.kind.slug != "unfused-prologue":
      # The epilogue's (or statistic's) boundary is the convolution's output.
      assert got[0] == tuple(plugins.parse_array(f.boundary_shape).dims)


def test_keras_asymmetric_pad_goes_into_the_call():
  # keras' ZeroPadding2D before a stride-2 depthwise convolution: one low,
  # two high, which cuDNN (symmetric pads only) cannot take itself.
  (f, call), = [(f, c) for f, c in _calls("keras_mobilenet")
                if f.producer == "loop_pad_fusion.2" and c is not None]
  opts = dict((k, v) for k, _, v in call.options)
  assert opts["padding"] == ((1, 2), (1, 2)) and opts["stride"] == 2 and opts["groups"] == 96
  assert opts["prologue_activation"] == "hard_swish"
  assert call.arrays[0][2] == (8, 8, 8, 96)  # x before the pad


def test_a_weight_gradients_call_sums_dy():
  written = [c for f, c in _calls("groupnorm_cnn")
             if c is not None and c.op == "conv2d_weight_grad"]
  assert len(written) == 2
  for call in written:
    assert ("column_sum", "True", True) in call.options
    assert dict((k, v) for k, _, v in call.options)["padding"] == ((1, 1), (1, 1))


def test_calls_the_op_cannot_make_are_none():
  # Prologues read only by a backward-filter call, or with a squeeze-excite's
  # per-sample factor, and an input gradient's dilated dy: no call.
  declined = {f.producer for f, c in _calls("keras_mobilenet") if c is None}
  assert "loop_pad_fusion.4" in declined
