"""`make_case`: any op's case at one point of its shape parameters."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pallas_kernels


def test_matmul_case_follows_the_ops_own_case_builder():
  case = pallas_kernels.make_case("matmul", seed=3, tags=("sweep",), grad=True, m=8, k=16,
                                  n=24, batch=2, dtype="bfloat16", bias=True,
                                  activation="gelu")
  assert [a.shape for a in case.args] == [(2, 8, 16), (16, 24), (24,)]
  assert case.args[0].dtype.name == "bfloat16" and case.kwargs["activation"] == "gelu"
  assert case.tags == frozenset({"sweep"}) and case.grad_argnums == (0, 1, 2)
  again = pallas_kernels.make_case("matmul", seed=3, m=8, k=16, n=24, batch=(2,),
                                   dtype="bfloat16", bias=True, activation="gelu")
  np.testing.assert_array_equal(case.args[0], again.args[0])  # same seed, same data


@pytest.mark.parametrize("op, n_args", [("layer_norm", 4), ("rms_norm", 3), ("softmax", 1)])
def test_row_op_cases(op, n_args):
  options = {"residual": True} if op != "softmax" else {"causal": True, "scale": 0.5}
  case = pallas_kernels.make_case(op, seed=0, grad=True, rows=6, cols=40, **options)
  assert case.name == f"{op} x=f32[6,40]" and len(case.args) == n_args
  assert case.args[0].shape == (6, 40) and case.grad_argnums == tuple(range(n_args))
  if op == "softmax":
    assert case.kwargs == {"causal": True, "scale": 0.5}
  # What the spec's cost model and `validate` take.
  assert pallas_kernels.get_spec(op).bytes_moved(case) > 0


def test_quantized_norm_checks_no_gradients():
  case = pallas_kernels.make_case("layer_norm", grad=True, rows=4, cols=32, quantize="int8")
  assert case.kwargs == {"quantize": "int8"} and case.grad_argnums == ()


def test_abstract_case_makes_no_arrays():
  args = jax.eval_shape(lambda: pallas_kernels.make_case("softmax", rows=4096,
                                                         cols=4096).args)
  assert not isinstance(args[0], jax.Array) and args[0].shape == (4096, 4096)


def test_bad_points_are_named():
  with pytest.raises(ValueError, match=r"make_case\('softmax'\): unknown parameter\(s\) "
                                       r"residual; known: rows, cols, dtype, scale"):
    pallas_kernels.make_case("softmax", rows=2, cols=2, residual=True)
  with pytest.raises(ValueError, match="unknown op 'gelu'; known: .*matmul"):
    pallas_kernels.make_case("gelu", rows=2, cols=2)
  with pytest.raises(ValueError, match="a residual without a bias"):
    pallas_kernels.make_case("matmul", m=2, k=2, n=2, residual=True)
