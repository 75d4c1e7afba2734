"""Standalone copies whose result is the program's output, on XLA:CPU: what
the record says reads them, and when narrowing is a change of numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind, NumericalClass

S = jax.ShapeDtypeStruct


def _copy(fn) -> hlo_audit.FusionDecisionRecord:
  report = hlo_audit.audit(jax.jit(fn), S((256, 512), jnp.float32))
  (copy,) = report.findings_of(FindingKind.STANDALONE_COPY)
  return copy


def test_a_transpose_into_the_output_is_read_by_the_programs_output():
  copy = _copy(lambda x: x.T)
  assert copy.consumers == ()
  assert copy.evidence.endswith("of f32[512,256] written to memory and read by the "
                                "program's output"), copy.evidence


def test_narrowing_into_the_output_drops_no_rounding():
  # f32 -> bf16 in the copy, and nothing widens it back: removing the copy
  # keeps the one rounding the program asked for.
  copy = _copy(lambda x: x.T.astype(jnp.bfloat16))
  assert copy.boundary_shape == "bf16[512,256]"
  assert copy.numerical_class is NumericalClass.EXACT
  assert "round trip" not in copy.evidence and not any(
      "rounds" in r for r in copy.reasons), copy
