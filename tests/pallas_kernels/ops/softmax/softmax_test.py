"""softmax: the shared suite, interpreted here and compiled on GPU."""

from __future__ import annotations

import jax
import pytest

import pallas_kernels as pk
from pallas_kernels._src.ops.softmax import kernel, reference
from softmax_base import SoftmaxTestBase, assert_close, normal, ref_f32


class TestSoftmaxInterpret(SoftmaxTestBase):
  """The Pallas kernel in interpret mode (runs on any machine)."""

  __test__ = True
  implementation = "pallas"
  interpret = True


@pytest.mark.gpu
class TestSoftmaxGPU(SoftmaxTestBase):
  """The Pallas kernel compiled for the GPU (skipped without one)."""

  __test__ = True
  implementation = "pallas"
  interpret = False


@pytest.mark.parametrize("x_shape,mask_shape,rows,cols,terms", [
    ((2, 3, 5, 7), (5, 7), 5, 7, ((1, 5, 1),)),
    ((2, 3, 5, 7), (2, 1, 5, 7), 10, 7, ((1, 5, 1), (15, 2, 5))),
    ((2, 3, 5, 7), (2, 3, 5, 7), 30, 7, ((1, 30, 1),)),
    ((2, 3, 5, 7), (2, 1, 1, 7), 2, 7, ((15, 2, 1),)),
    ((4, 300), (4, 1), 4, 1, ((1, 4, 1),)),
    ((4, 300), (300,), 1, 300, ()),
])
def test_mask_layout_maps_rows_without_materializing(x_shape, mask_shape, rows, cols,
                                                     terms):
  layout = kernel.MaskLayout.of(x_shape, mask_shape)
  assert (layout.rows, layout.cols, layout.terms) == (rows, cols, terms)
  # Every x row must find the mask row that broadcasting would give it.
  import numpy as np
  lead = x_shape[:-1]
  padded = (1,) * (len(x_shape) - len(mask_shape)) + mask_shape
  index = np.arange(int(np.prod(padded[:-1]))).reshape(padded[:-1])
  expected = np.broadcast_to(index, lead).reshape(-1)
  got = np.asarray(layout.row_index(jax.numpy.arange(expected.size, dtype="int32")))
  np.testing.assert_array_equal(got, expected)


def test_kernel_launch_carries_the_named_scope():
  x = normal((7, 129), "float32")
  lowered = jax.jit(lambda a: pk.softmax(a, scale=0.125, implementation="pallas",
                                         interpret=True)).lower(x)
  assert "pallas_kernels.softmax" in lowered.as_text(debug_info=True)


def _pallas_call_scopes(jaxpr) -> list[str]:
  """The name stack of every pallas_call in `jaxpr` and its sub-jaxprs."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      out.append(str(eqn.source_info.name_stack))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      out.extend(_pallas_call_scopes(sub))
  return out


def test_backward_kernel_carries_the_named_scope_too():
  # The audit names a kernel's op from this scope: the backward launch is
  # softmax's as much as the forward one.
  x = normal((7, 129), "float32")
  w = jax.numpy.arange(129.0)
  loss = lambda a: (pk.softmax(a, scale=0.125, implementation="pallas",
                               interpret=True) * w).sum()
  scopes = _pallas_call_scopes(jax.make_jaxpr(jax.grad(loss))(x).jaxpr)
  assert len(scopes) == 2, scopes  # forward and backward
  assert all("pallas_kernels.softmax/" in s for s in scopes), scopes


def test_the_specification_casts_to_the_inputs_dtype_by_default():
  # reference.py is the semantics every implementation matches: its result
  # is in x's dtype unless out_dtype says otherwise, not in the float32 it
  # computes in (the API passes out_dtype resolved; the default is its own).
  x = normal((4, 40), "bfloat16")
  assert reference.softmax(x).dtype == jax.numpy.bfloat16
  assert reference.softmax(x, out_dtype=jax.numpy.float16).dtype == jax.numpy.float16
  assert reference.softmax_f32(x).dtype == jax.numpy.float32


@pytest.mark.parametrize("implementation", ["xla", "pallas"])
def test_the_result_takes_the_inputs_dtype_unless_out_dtype_says(implementation):
  x = normal((4, 40), "bfloat16")
  out = pk.softmax(x, implementation=implementation, interpret=True)
  assert out.dtype == jax.numpy.bfloat16
  assert_close(out, ref_f32(x))
  wide = pk.softmax(x, out_dtype="float32", implementation=implementation, interpret=True)
  assert wide.dtype == jax.numpy.float32


def test_the_guard_names_the_dtypes_it_takes_in_order():
  from pallas_kernels._src.ops.softmax import guard  # pylint: disable=import-outside-toplevel
  reason = guard.unsupported_reason(x_shape=(4, 128), x_dtype="int8", mask_dtype=None,
                                    interpret=True)
  assert reason == ("x dtype int8 is not one of "
                    f"{sorted(guard.SUPPORTED_DTYPES)}"), reason
  assert len(guard.SUPPORTED_DTYPES) > 1  # (so that their order shows)
