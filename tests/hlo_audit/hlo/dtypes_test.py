"""Element types: which conversions keep every value (what decides whether a
dtype round trip split over two kernels gives its values back), and the
names numpy and JAX give them."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from hlo_audit._src.hlo import dtypes


@pytest.mark.parametrize("src, dst, exact", [
    ("f32", "f32", True),
    ("bf16", "f32", True), ("f32", "bf16", False),
    ("f16", "f32", True), ("f32", "f16", False),
    # Neither 16-bit float holds the other: bf16 has the range, f16 the digits.
    ("f16", "bf16", False), ("bf16", "f16", False),
    ("f32", "f64", True), ("f64", "f32", False),
    ("f8e4m3fn", "bf16", True), ("f8e5m2", "f16", True), ("f8e5m2", "bf16", True),
    ("f8e4m3fn", "f8e5m2", False), ("f8e5m2", "f8e4m3fn", False),
    ("f8e8m0fnu", "f32", True), ("f8e8m0fnu", "bf16", True), ("f8e8m0fnu", "f16", False),
    # Same widths, other encodings: fnuz's bias halves the range, fn has no inf.
    ("f8e4m3fn", "f8e4m3fnuz", False), ("f8e4m3", "f8e4m3fn", False),
    ("f8e5m2", "f8e5m2fnuz", False), ("f8e4m3b11fnuz", "f8e4m3fnuz", False),
    # Integers: the same kind widens; unsigned into a wider signed; never
    # signed into unsigned.
    ("s8", "s32", True), ("s32", "s8", False), ("u8", "u16", True), ("u16", "u8", False),
    ("u8", "s16", True), ("u8", "s8", False), ("s8", "u16", False), ("s8", "u8", False),
    ("s32", "s32", True),
    # Integers into floats: while the mantissa (and its hidden bit) holds them.
    ("s8", "bf16", True), ("s16", "bf16", False), ("s16", "f32", True),
    ("s32", "f32", False), ("s32", "f64", True), ("u8", "f16", True),
    # Floats never into integers; pred into anything.
    ("f16", "s32", False), ("bf16", "s8", False),
    ("pred", "s8", True), ("pred", "f32", True),
])
def test_a_conversion_is_widening_when_it_keeps_every_value(src, dst, exact):
  assert dtypes.is_widening(src, dst) is exact


def test_the_mantissa_bound_is_inclusive():
  # f16 has 10 stored bits and a hidden one: 11-bit integers all fit, so an
  # 11-bit type would; s16 (16 bits) does not, nor does s8 into f8e4m3fn.
  assert dtypes.is_widening("s8", "f16") and not dtypes.is_widening("s16", "f16")
  assert not dtypes.is_widening("s8", "f8e4m3fn")
  assert dtypes.is_widening("pred", "pred") and not dtypes.is_widening("s8", "pred")


@pytest.mark.parametrize("xla, numpy_name", [
    ("f32", "float32"), ("bf16", "bfloat16"), ("f16", "float16"), ("s8", "int8"),
    ("u32", "uint32"), ("pred", "bool"), ("f8e4m3fn", "float8_e4m3fn"),
    ("c64", "complex64"),
])
def test_numpy_names_both_ways(xla, numpy_name):
  assert dtypes.to_numpy(xla) == numpy_name
  assert dtypes.from_numpy(np.dtype(numpy_name if numpy_name != "bfloat16"
                                    else ml_dtypes.bfloat16)) == xla
  assert dtypes.from_numpy(numpy_name) == xla  # a name as a string


def test_jax_dtypes_and_unknowns():
  assert dtypes.from_numpy(jnp.dtype(jnp.bfloat16)) == "bf16"
  assert dtypes.from_numpy(jnp.dtype(jnp.float32)) == "f32"
  assert dtypes.to_numpy("token") == "token"  # no numpy type: itself
  with pytest.raises(KeyError, match="no XLA element type for dtype 'bytes256'"):
    dtypes.from_numpy(np.dtype("S32"))
