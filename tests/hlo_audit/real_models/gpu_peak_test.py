"""Peak memory of the real models and the built-in example compiled for an
H200 (on this machine, no GPU): within 1% of XLA:GPU's footprint (argument +
output + temp - alias, `memory_analysis()`). Needs the plugin wheels
(`pip install 'hlo-audit[gpu-target]'`); skipped without them."""

from __future__ import annotations

import pytest

pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("optax")

import hlo_audit  # noqa: E402
from hlo_audit._src.examples import transformer  # noqa: E402
from tests.gpu_target import gpu_target  # noqa: E402,F401 - the fixture
from tests.hlo_audit.real_models import truth  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gpu_target")]

PROGRAMS = ("example", "example_forward", *truth.MODELS)


def _build(name: str):
  if name.startswith("example"):
    return transformer.example(backward=name == "example")
  missing = truth.missing_library(name)
  if missing:
    pytest.skip(f"not installed: pip install '{missing}'")
  return truth.model(name).build()


@pytest.mark.parametrize("name", PROGRAMS)
def test_peak_within_one_percent_of_xla_gpu(name):
  fn, args = _build(name)
  r = hlo_audit.audit(fn, *args, target="h200")
  assert r.module.platform == "gpu" and r.xla_peak_bytes
  assert abs(r.peak_bytes - r.xla_peak_bytes) <= 0.01 * r.xla_peak_bytes, \
      (r.peak_bytes, r.xla_peak_bytes)


#: Data-parallel train steps: the example's sizes (`TransformerConfig`
#: fields) and the GPUs the batch is split over.
DATA_PARALLEL = {
    "two_layers_4": (dict(batch=8, layers=2), 4),
    "small_8": (dict(batch=8, seq=64, d_model=128, heads=4, d_ff=512, layers=2, vocab=256), 8),
}


@pytest.mark.parametrize("name", DATA_PARALLEL)
def test_a_data_parallel_peak_within_one_percent_of_xla_gpu(name):
  # The batch split over the GPUs, the parameters replicated: the gradients
  # are all-reduced asynchronously, in place.
  sizes, gpus = DATA_PARALLEL[name]
  target = hlo_audit.get_target("h200", gpus=gpus)
  fn, args = transformer.example(transformer.TransformerConfig(**sizes))
  r = hlo_audit.audit(fn, *transformer.data_parallel(args, gpus, target), target=target)
  assert any(c.opcode == "all-reduce" and c.is_async for c in r.collectives)
  assert abs(r.peak_bytes - r.xla_peak_bytes) <= 0.01 * r.xla_peak_bytes, \
      (r.peak_bytes, r.xla_peak_bytes)
