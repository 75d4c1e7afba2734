"""The op registry."""

from __future__ import annotations

import pytest

from pallas_kernels._src import registry
from pallas_kernels._src.spec import OpSpec


def test_registry_lists_the_row_wise_ops():
  names = registry.spec_names()
  for name in ("layer_norm", "rms_norm", "softmax"):
    assert name in names
    spec = registry.get_spec(name)
    assert isinstance(spec, OpSpec) and spec.name == name
    assert registry.SPECS[name] is spec
  assert not registry.load_errors(), dict(registry.load_errors())


def test_registry_includes_matmul_once_it_exists():
  import importlib.util
  if importlib.util.find_spec("pallas_kernels._src.ops.matmul.arg_specs") is None:
    pytest.skip("matmul's arg_specs not written yet")
  assert "matmul" in registry.spec_names()


def test_unknown_op_names_the_registered_ones():
  with pytest.raises(KeyError, match="registered: .*softmax"):
    registry.get_spec("convolution")


def test_an_opspec_passes_through():
  spec = registry.get_spec("softmax")
  assert registry.get_spec(spec) is spec


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "softmax"])
def test_cases_are_deterministic_and_tagged(name):
  spec = registry.get_spec(name)
  first = list(spec.cases("ci", 0))
  again = list(spec.cases("ci", 0))
  other = list(spec.cases("ci", 1))
  assert len(first) >= 5 and all("ci" in c.tags for c in first)
  assert [c.name for c in first] == [c.name for c in again]
  import numpy as np
  for a, b, c in zip(first, again, other):
    np.testing.assert_array_equal(np.asarray(a.args[0], np.float32),
                                  np.asarray(b.args[0], np.float32))
    if a.args[0].size > 1:
      assert not np.array_equal(np.asarray(a.args[0], np.float32),
                                np.asarray(c.args[0], np.float32))
    assert spec.bytes_moved(a) > 0 and spec.flops(a) > 0
  assert any("nonfinite" in c.tags for c in first)
  assert any(c.grad_argnums for c in first)
