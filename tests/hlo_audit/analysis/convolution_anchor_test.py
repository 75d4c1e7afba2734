"""What a kernel library reads of a convolution (`plugins.convolution_anchor`)
and of a prologue's pad (`plugins.pad_widths`): x, w and y in NHWC/HWIO
whichever of them a cuDNN call reads and writes, the window, the groups."""

from __future__ import annotations

import functools

import pytest

import hlo_audit
from hlo_audit import plugins
from tests.hlo_audit.real_models import h200_support


@functools.cache
def _module(name: str):
  return hlo_audit.parse_hlo(h200_support.fixture(name))


def _anchor(name: str, kernel: str):
  m = _module(name)
  return plugins.convolution_anchor(m, m.entry.name, kernel)


def test_a_cudnn_forward_call_in_nhwc_and_hwio():
  # keras' stem: 3x3 stride 2 over the image padded to 65x65; cuDNN holds the
  # filter as OHWI (dim_labels b01f_o01i->b01f) and returns (y, scratch).
  a = _anchor("keras_mobilenet", "cudnn-conv.178")
  assert a.role == "forward"
  assert a.input == plugins.ArraySpec("f32", (8, 65, 65, 3))
  assert a.kernel == plugins.ArraySpec("f32", (3, 3, 3, 16))
  assert a.output == plugins.ArraySpec("f32", (8, 32, 32, 16))
  assert (a.stride, a.padding, a.dilation, a.groups) == ((2, 2), ((0, 0), (0, 0)), (1, 1), 1)


def test_a_depthwise_call_has_its_groups():
  a = _anchor("keras_mobilenet", "cudnn-conv.179")
  assert a.groups == 16 and a.kernel.dims == (3, 3, 1, 16), a


def test_backward_calls_read_in_the_forwards_roles():
  # The group-norm CNN's Conv_1: the filter gradient reads (x, dy) and
  # writes dW; the input gradient reads (dy, w) and writes dx.
  f = _anchor("groupnorm_cnn", "cudnn-conv-bw-filter.3")
  assert f.role == "backward_filter"
  assert f.kernel.dims == (3, 3, 32, 32) and f.output.dims == (8, 32, 32, 32)
  assert f.padding == ((1, 1), (1, 1))
  i = _anchor("groupnorm_cnn", "cudnn-conv-bw-input.1")
  assert i.role == "backward_input"
  assert i.kernel.dims == (3, 3, 32, 32) and i.input.dims == (8, 32, 32, 32)


def test_xla_convolution_in_a_fusion():
  text = """HloModule m, entry_computation_layout={(f32[2,9,9,4]{3,2,1,0}, f32[4,3,3,8]{3,2,1,0})->f32[2,4,5,8]{3,2,1,0}}

%fused (p0: f32[2,9,9,4], p1: f32[4,3,3,8]) -> f32[2,4,5,8] {
  %p0 = f32[2,9,9,4]{3,2,1,0} parameter(0)
  %p1 = f32[4,3,3,8]{3,2,1,0} parameter(1)
  ROOT %conv = f32[2,4,5,8]{3,2,1,0} convolution(%p0, %p1), window={size=3x3 stride=2x2 pad=0_1x1_1 rhs_dilate=1x1}, dim_labels=b01f_i01o->b01f, feature_group_count=1
}

ENTRY %main (x: f32[2,9,9,4], w: f32[4,3,3,8]) -> f32[2,4,5,8] {
  %x = f32[2,9,9,4]{3,2,1,0} parameter(0)
  %w = f32[4,3,3,8]{3,2,1,0} parameter(1)
  ROOT %f = f32[2,4,5,8]{3,2,1,0} fusion(%x, %w), kind=kOutput, calls=%fused
}
"""
  m = hlo_audit.parse_hlo(text)
  a = plugins.convolution_anchor(m, m.entry.name, "f")
  # The kernel's labels i01o: [I, KH, KW, O] read as HWIO.
  assert a.kernel.dims == (3, 3, 4, 8) and a.output.dims == (2, 4, 5, 8)
  assert a.stride == (2, 2) and a.padding == ((0, 1), (1, 1))
  assert plugins.convolution_anchor(m, m.entry.name, "x") is None


def test_pad_widths_of_a_prologue():
  # keras pads the stride-2 depthwise input asymmetrically (cuDNN pads both
  # sides alike): BatchNorm + hard-swish, then one row and column low, two
  # high.
  m = _module("keras_mobilenet")
  src, widths = plugins.pad_widths(m, m.entry.name, "loop_pad_fusion.2")
  assert src.dims == (8, 8, 8, 96) and widths == ((0, 0), (1, 2), (1, 2), (0, 0))
  # An input gradient's dy dilated by the stride (interior zeros): none.
  assert plugins.pad_widths(m, m.entry.name, "loop_pad_fusion.4") is None


@pytest.mark.parametrize("kernel", ["cudnn-conv.178", "cudnn-conv.179"])
def test_the_anchor_is_the_convolution_jax_computes(kernel):
  jax = pytest.importorskip("jax")
  a = _anchor("keras_mobilenet", kernel)
  x = jax.ShapeDtypeStruct(a.input.dims, "float32")
  w = jax.ShapeDtypeStruct(a.kernel.dims, "float32")
  y = jax.eval_shape(lambda x, w: jax.lax.conv_general_dilated(
      x, w, a.stride, a.padding, rhs_dilation=a.dilation, feature_group_count=a.groups,
      dimension_numbers=("NHWC", "HWIO", "NHWC")), x, w)
  assert y.shape == a.output.dims
