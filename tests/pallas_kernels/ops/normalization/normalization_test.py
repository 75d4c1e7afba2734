"""layer_norm / rms_norm: the shared suite, interpreted here and compiled on GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from normalization_base import NormalizationTestBase, make


class TestNormalizationInterpret(NormalizationTestBase):
  """The Pallas kernel in interpret mode (runs on any machine)."""

  __test__ = True
  implementation = "pallas"
  interpret = True


@pytest.mark.gpu
class TestNormalizationGPU(NormalizationTestBase):
  """The Pallas kernel compiled for the GPU (skipped without one)."""

  __test__ = True
  implementation = "pallas"
  interpret = False


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_kernel_launch_carries_the_named_scope(kind):
  x, gamma, beta, _ = make(kind, (7, 129), "float32")
  fn = pk.layer_norm if kind == "layer_norm" else pk.rms_norm
  args = (x, gamma, beta) if kind == "layer_norm" else (x, gamma)
  lowered = jax.jit(lambda *a: fn(*a, implementation="pallas", interpret=True)
                    ).lower(*args)
  assert f"pallas_kernels.{kind}" in lowered.as_text(debug_info=True)


def test_default_implementation_on_cpu_is_xla():
  if jax.default_backend() != "cpu":
    pytest.skip("default choice differs where kernels compile")
  x, gamma, beta, _ = make("layer_norm", (7, 129), "float32")
  # Eager: the operands name this CPU, and XLA runs.
  jaxpr = str(jax.make_jaxpr(lambda: pk.layer_norm(x, gamma, beta))())
  assert "pallas_call" not in jaxpr
  # Traced: lowered for this CPU, XLA's, without an interpreted kernel's loop.
  cpu = jax.jit(lambda *a: pk.layer_norm(*a)).lower(x, gamma, beta).as_text()
  assert "stablehlo.while" not in cpu
  jaxpr = str(jax.make_jaxpr(lambda *a: pk.layer_norm(*a, implementation="pallas"))(
      x, gamma, beta))
  assert "pallas_call" in jaxpr


def test_config_rejects_non_power_of_two_blocks():
  from pallas_kernels._src.ops.normalization.config import Config
  with pytest.raises(ValueError, match="block_cols must be a power of two"):
    Config(block_rows=2, block_cols=100)


def test_heuristic_config_fits_rows_and_caps_width():
  from pallas_kernels._src.backend import Backend
  from pallas_kernels._src.ops.normalization import config
  wide = config.heuristic_config((4, 100_000), jnp.bfloat16, Backend.GPU)
  assert wide.block_cols == 8192 and wide.block_rows == 1
  small = config.heuristic_config((3, 129), jnp.float32, Backend.GPU)
  assert small.block_cols == 256 and small.block_rows == 4
  bwd = config.heuristic_backward_config((8192, 8192), jnp.bfloat16, Backend.GPU)
  assert bwd.row_steps * bwd.block_rows * 512 >= 8192
  chunked = config.heuristic_backward_config((64, 20_000), jnp.float32, Backend.GPU)
  assert chunked.row_steps == 1
