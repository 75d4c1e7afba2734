"""Convolutional networks as XLA:GPU compiles them for an H200 (keras'
MobileNetV3Small, a group-norm CNN; committed HLO, no compile): the rules
that read cuDNN's calls, MobileNetV3's activations and XLA's multi-output
transpose fusions, each held on the kernel where the HLO shows it."""

from __future__ import annotations

import functools

import hlo_audit
from hlo_audit import FindingKind
from tests.hlo_audit.real_models import h200_support

P, R, B = (FindingKind.UNFUSED_PROLOGUE, FindingKind.SEPARATE_REDUCTION,
           FindingKind.EXPANDED_BROADCAST)


@functools.cache
def _report(name: str) -> hlo_audit.AuditReport:
  return hlo_audit.audit_hlo(h200_support.fixture(name))


def _at(name: str, boundary: str):
  found = [f for f in _report(name).findings if f.boundary == boundary]
  assert len(found) == 1, (boundary, [(f.kind, f.boundary) for f in _report(name).findings
                                      if f.boundary.startswith(boundary.split("{")[0])])
  return found[0]


def test_hard_swish_is_named_where_it_acts_on_the_data():
  # BatchNorm's apply then x * relu6(x + 3) / 6, padded for a depthwise
  # convolution: the prologue names the activation the kernel must apply.
  f = _at("keras_mobilenet", "loop_pad_fusion.1")
  assert f.ops == ("affine", "activation:hard_swish", "pad"), f.ops
  # A squeeze-excite gate's hard-sigmoid on [8, 1, 1, C] scaling the data
  # is the gate's, not an activation of the data.
  for f in _report("keras_mobilenet").findings_of(P):
    assert "activation:hard_sigmoid" not in f.ops, (f.boundary, f.ops)


def test_a_multi_output_transpose_fusion_written_for_convolutions_is_a_prologue():
  # input_multiply_transpose_fusion (XLA:GPU's transpose emitter, kInput)
  # writes BatchNorm + hard-swish twice: for the 5x5 depthwise convolution
  # ({1}) and transposed for its backward filter ({0}).
  for index in (0, 1):
    f = _at("keras_mobilenet", f"input_multiply_transpose_fusion{{{index}}}")
    assert f.kind is P and f.ops[:2] == ("affine", "activation:hard_swish"), f
    # The kernel still runs for its other output: its reads stay, and the
    # convolution reads them instead of the buffer.
    buf = next(b for b in _report("keras_mobilenet").buffers if b.name == f.boundary)
    kernel = next(k for k in _report("keras_mobilenet").kernels if k.name == f.producer)
    assert f.bytes_saved == 2 * buf.bytes - kernel.bytes_read, (f.bytes_saved, buf.bytes)


def test_random_bits_are_no_prologue():
  # Dropout's threefry hashed in the kernel writing its output for the
  # logits' convolution: a tile loaded again would hash again.
  for f in _report("keras_mobilenet").findings_of(P):
    assert not f.producer.startswith("input_select_transpose_fusion"), f


def test_cudnn_bias_operand_is_no_expanded_broadcast():
  # zeros [576] passed as cuDNN's bias: the call reads a dense vector.
  assert not [f for f in _report("keras_mobilenet").findings_of(B)
              if f.boundary == "loop_broadcast_fusion"]
  # The hard-sigmoid's + 3 broadcast to [8, 1, 1, C] as the side input is
  # still one.
  assert [f for f in _report("keras_mobilenet").findings_of(B)
          if f.boundary_shape.startswith("f32[8,1,1,")]


def test_a_multi_output_fusions_backward_output_is_backward_work():
  # loop_select_transpose_fusion{1}: the squeeze-excite relu6's backward,
  # beside the forward pooled mean that names the fusion.
  f = _at("keras_mobilenet", "loop_select_transpose_fusion{1}")
  assert f.kind is R and "forward pass" not in f.evidence, f.evidence
  assert "a bias, gamma or weight gradient" in f.evidence


def test_hard_swish_times_dy_is_still_a_contraction():
  # The squeeze-excite gate's gradient sums hard_swish(x) * dy over H, W:
  # hard-swish's own relu6 factor makes no gate of the product.
  f = _at("keras_mobilenet", "cudnn-conv.214{0}")
  assert f.kind is R and f.ops == ("contraction",), f.ops


def test_batch_norm_statistics_of_a_convolution_ask_its_kernel():
  stats = [f for f in _report("keras_mobilenet").findings_of(R)
           if f.need is not None and f.need.ops == ("batch_norm_stats",)]
  assert stats
  for f in stats:
    assert f.need.anchor == "convolution", f
    producer = next(k for k in _report("keras_mobilenet").kernels if k.name == f.producer)
    assert producer.opcode == "custom-call", producer


def test_a_weight_gradients_dy_column_sum_asks_the_convolution():
  # The group-norm CNN's conv bias gradients: dy summed over N, H, W beside
  # cuDNN's backward filter, which reads dy whole.
  conv = [f for f in _report("groupnorm_cnn").findings_of(R)
          if f.need is not None and f.need.ops == ("column_sum",)
          and f.need.anchor == "convolution"]
  assert len(conv) == 2, [(f.boundary, f.need) for f in _report("groupnorm_cnn").findings_of(R)]
  module = hlo_audit.parse_hlo(h200_support.fixture("groupnorm_cnn"))
  entry = module.entry
  for f in conv:
    filt = entry.instruction(f.need.anchor_kernel)
    assert filt.custom_call_target == "__cudnn$convBackwardFilter", filt
  # keras' column sums beside convolutions are all read by forward or
  # input-gradient convolutions (and its 1x1 filters' gradients are
  # gemms): they keep the batch axis the sum reduces, so none anchors one.
  assert not [f for f in _report("keras_mobilenet").findings_of(R)
              if f.need is not None and f.need.ops == ("column_sum",)
              and f.need.anchor == "convolution"]


def _column_sums(name: str):
  return [f for f in _report(name).findings_of(R) if f.ops == ("column_reduction",)
          and f.need is not None]


def test_a_group_norms_gamma_and_beta_gradients_are_its_own():
  # flax's GroupNorm over [8, 32, 32, 32] in 8 groups: its statistics read x
  # as [8, 1024, 8, 4]; the column sums over N, H, W of its backward are its
  # scale and shift gradients, not a batch norm's (whose kernel would not
  # compute the per-sample group sums its dx needs).
  # (dy's column sums beside a convolution's filter gradient are the
  # convolution's bias gradients: anchored there.)
  sums = [f for f in _column_sums("groupnorm_cnn") if f.boundary_shape == "f32[8,32,32,32]"
          and f.need.anchor != "convolution"]
  assert len(sums) == 2 and all(f.need.anchor == "group_norm_backward" for f in sums), [
      (f.boundary, f.need.anchor) for f in sums]
  assert all("group norm's" in f.evidence for f in sums)


def test_batch_norms_column_sums_stay_column_sums():
  # MobileNetV3's batch norms (and a per-channel normalization over 2 x 2
  # pixels of [8, 2, 2, 576] that keeps every channel, no groups) leave
  # their gradients' column sums as such: a batch norm's backward closes them.
  sums = [f for f in _column_sums("keras_mobilenet") if f.need.anchor != "convolution"]
  assert len(sums) >= 50
  assert all(f.need.anchor == "column_reduction" for f in sums), {
      f.need.anchor for f in sums}
