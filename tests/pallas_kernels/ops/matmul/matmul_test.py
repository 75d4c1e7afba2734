"""matmul: the shared suite (interpreted here, compiled on GPU) plus unit tests."""

from __future__ import annotations

import pytest

from matmul_base import MatmulTestBase


class TestMatmulInterpret(MatmulTestBase):
  """The Pallas kernel in interpret mode (runs on any machine)."""

  __test__ = True
  implementation = "pallas"
  interpret = True


@pytest.mark.gpu
class TestMatmulGPU(MatmulTestBase):
  """The Pallas kernel compiled through Triton (skipped without a GPU)."""

  __test__ = True
  implementation = "pallas"
  interpret = False
