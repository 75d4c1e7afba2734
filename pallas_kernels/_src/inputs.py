"""Deterministic random inputs for op cases (validation, benchmarks, tests).

Inputs are standard normal (never zeros: a zero input hides scaling and
indexing bugs), derived from the integer seed and the case's name so that every
case gets different data but a rerun gets the same.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp


class Keys:
  """A stream of PRNG keys for one case: `next()` gives a fresh key."""

  def __init__(self, seed: int, case_name: str):
    self._key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(case_name.encode()))
    self._count = 0

  def next(self) -> jax.Array:
    self._count += 1
    return jax.random.fold_in(self._key, self._count)


def normal(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
  """Standard normal values of `dtype` (drawn in float32, then rounded)."""
  return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def short_dtype(dtype) -> str:
  """"f32", "bf16", "f16", "i8", "f8" ... for case names."""
  name = jnp.dtype(dtype).name
  return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
          "int8": "i8", "bool": "bool", "float8_e4m3fn": "f8e4m3"}.get(name, name)


def describe(name: str, shape: tuple[int, ...], dtype) -> str:
  """"x=bf16[8,128]"-style description of one argument."""
  return f"{name}={short_dtype(dtype)}[{','.join(map(str, shape))}]"
