"""`check_guard`: an op's guard asked about shapes and dtypes, nothing run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels


def _sds(shape, dtype="float32"):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def test_a_supported_call_runs_the_kernel_here():
  check = pallas_kernels.check_guard("matmul", _sds((64, 256)), _sds((256, 512)),
                                     bias=_sds((512,)), activation="gelu")
  assert check.runs and check.reason is None
  assert check.op == "matmul" and check.backend == jax.default_backend()
  assert check.interpret == (check.backend == "cpu")
  assert check.device_kind == jax.devices()[0].device_kind
  # The Pallas backend the dry run built (on a CPU: Triton's kernel, interpreted).
  assert check.kernel_backend == "triton" if check.backend == "cpu" else check.kernel_backend


def test_a_guarded_call_names_the_fallback_reason():
  check = pallas_kernels.check_guard("matmul", _sds((64, 256), "int32"),
                                     _sds((256, 512), "int32"))
  assert not check.runs and "int32" in check.reason
  assert check.kernel_backend == ""


def test_arrays_are_read_as_their_shapes():
  x = jnp.ones((8, 128), jnp.bfloat16)
  by_array = pallas_kernels.check_guard("rms_norm", x, jnp.ones((128,), jnp.bfloat16))
  by_shape = pallas_kernels.check_guard("rms_norm", _sds((8, 128), "bfloat16"),
                                        _sds((128,), "bfloat16"))
  assert by_array == by_shape and by_array.runs


def test_an_invalid_call_is_a_reason_not_an_exception():
  check = pallas_kernels.check_guard("matmul", _sds((64, 256)), _sds((255, 512)))
  assert check.reason.startswith("invalid call: ")


def test_bad_questions_raise():
  with pytest.raises(ValueError, match="unknown op 'matmull'; known: .*matmul, "):
    pallas_kernels.check_guard("matmull", _sds((2, 2)), _sds((2, 2)))
  with pytest.raises(ValueError, match="drop implementation="):
    pallas_kernels.check_guard("softmax", _sds((2, 2)), implementation="xla")


def test_answers_are_per_shape_dtype_and_option():
  """Each question is answered for its own shapes, dtypes and options (the
  answers are cached: a cache too coarse would repeat an earlier answer)."""
  ask = lambda dtype, n=512, **kw: pallas_kernels.check_guard(
      "matmul", _sds((64, 256), dtype), _sds((256, n), dtype), **kw)
  assert ask("float32").runs and not ask("int32").runs and ask("float32").runs
  assert ask("float32", n=255).runs and ask("float32", n=255).reason is None
  assert ask("float32", activation="relu").runs
  assert ask("float32", activation="nope").reason.startswith("invalid call: ")
  assert ask("float32", bias=_sds((512,))).runs
  assert ask("float32", bias=_sds((511,))).reason.startswith("invalid call: ")
  # A scalar keyword is a value, part of the question as well.
  assert pallas_kernels.check_guard("softmax", _sds((8, 128)), scale=0.5).runs
  assert pallas_kernels.check_guard("softmax", _sds((8, 128)), scale=0.5, causal=True).runs
