"""The row ops' sweep cases: each parameter of a point becomes the argument
or keyword the op takes."""

from __future__ import annotations

from pallas_kernels._src.ops import row_ops


def test_a_softmax_point_passes_its_scale_mask_and_output_dtype():
  case = row_ops.make_case("softmax", seed=0, tags=("sweep",), grad=True, rows=4, cols=32,
                           dtype="bfloat16", out_dtype="float32", scale=0.5, causal=True)
  assert dict(case.kwargs) == {"scale": 0.5, "causal": True, "out_dtype": "float32"}
  assert [a.shape for a in case.args] == [(4, 32)] and case.args[0].dtype == "bfloat16"
  assert case.grad_argnums == (0,) and case.tags == frozenset({"sweep"})
  plain = row_ops.make_case("softmax", seed=0, tags=(), grad=False, rows=4, cols=32)
  assert dict(plain.kwargs) == {} and plain.grad_argnums == ()


def test_a_norm_point_passes_gamma_beta_residual_and_quantize():
  case = row_ops.make_case("layer_norm", seed=0, tags=(), grad=True, rows=4, cols=32,
                           residual=True, quantize="int8", out_dtype="bfloat16")
  # x, gamma, beta, residual; a quantized output is not differentiated.
  assert [a.shape for a in case.args] == [(4, 32), (32,), (32,), (4, 32)]
  assert dict(case.kwargs) == {"quantize": "int8", "out_dtype": "bfloat16"}
  assert case.grad_argnums == ()
  rms = row_ops.make_case("rms_norm", seed=0, tags=(), grad=True, rows=4, cols=32)
  assert [a.shape for a in rms.args] == [(4, 32), (32,)] and rms.grad_argnums == (0, 1)
