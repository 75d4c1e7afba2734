"""The testing assertions and sweeps with `target=`: CI without a GPU holds
the program XLA compiles for one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import testing
from hlo_audit._src.sweep.grid import GridError
from hlo_audit._src.sweep.targets import Measure
from tests.gpu_target import gpu_target  # noqa: F401 - the fixture

S = jax.ShapeDtypeStruct
ARGS = (S((1024, 128), jnp.bfloat16), S((128, 1024), jnp.bfloat16))


def layer(x, w):
  return jnp.tanh(x @ w)


def test_a_report_is_compiled_already():
  report = hlo_audit.audit(jax.jit(layer), *ARGS)
  with pytest.raises(TypeError, match="target= compiles a function; a AuditReport"):
    testing.assert_kernel_count(report, at_most=10, target="h200")


def test_a_sweeps_gpu_target_is_part_of_each_points_id():
  plain, h200 = Measure(), Measure(device="h200")
  assert "device" not in plain.identity and plain.compile_target() is None
  assert h200.identity["device"] == "h200" and h200.identity["gpus"] == 1
  assert Measure(device="h200", gpus=8).identity != h200.identity
  with pytest.raises(GridError, match="not with a GPU target"):
    Measure(device="h200", validate=True).compile_target()


@pytest.mark.usefixtures("gpu_target")
def test_assertions_audit_the_targets_program():
  # XLA:GPU runs the dot and tanh in one Triton gemm fusion: one kernel.
  r = testing.assert_kernel_count(jax.jit(layer), *ARGS, at_most=1, target="h200")
  assert r.module.target == "h200" and r.module.platform == "gpu"
  testing.assert_fused(jax.jit(layer), *ARGS, op="tanh", into="dot", target="h200")
  testing.assert_peak_below(jax.jit(layer), *ARGS, bytes="3MiB", target="h200")
  with pytest.raises(AssertionError, match="is not below"):
    testing.assert_peak_below(jax.jit(layer), *ARGS, bytes="1KiB", target="h200")
