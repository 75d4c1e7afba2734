"""Compiling for a GPU target on a CPU-only machine (needs the plugin wheels:
`pip install 'hlo-audit[gpu-target]'`; skipped without them, with the pip
command)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_audit
from hlo_audit import CaptureError, KernelKind
from tests.gpu_target import gpu_target  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("gpu_target")

S = jax.ShapeDtypeStruct


def mlp(x, w, b):
  return jax.nn.gelu(x @ w + b)


ARGS = (S((256, 512), jnp.bfloat16), S((512, 1024), jnp.bfloat16), S((1024,), jnp.bfloat16))


def test_audit_for_an_h200_holds_xla_gpus_program():
  r = hlo_audit.audit(jax.jit(mlp), *ARGS, target="h200")
  m = r.module
  assert m.platform == "gpu" and m.device_kind == "NVIDIA H200 141GB HBM3e"
  assert m.target == "h200" and m.target_notes[0].startswith("not autotuned")
  kinds = {k.kind for k in r.kernels}
  assert KernelKind.TRITON_GEMM in kinds, kinds
  assert r.xla_peak_bytes and abs(r.peak_bytes - r.xla_peak_bytes) <= 0.01 * r.xla_peak_bytes
  # The header says it; the JSON carries it.
  assert "target h200: compiled on this machine, without the device; not autotuned" \
      in str(r)
  module = json.loads(r.to_json())["module"]
  assert module["target"] == "h200" and module["target_notes"][0].startswith("not autotuned")
  from hlo_audit._src.report.json_report import report_from_dict
  assert report_from_dict(json.loads(r.to_json())).module.target_notes == m.target_notes


def test_without_a_target_nothing_changes():
  r = hlo_audit.audit(jax.jit(mlp), *ARGS)
  assert r.module.platform == jax.default_backend() and r.module.target == ""
  assert "target" not in json.loads(r.to_json())["module"]
  assert "target " not in str(r).splitlines()[1]


@pytest.mark.parametrize("make", [
    lambda: tuple(jnp.zeros(a.shape, a.dtype) for a in ARGS),  # uncommitted arrays
    lambda: tuple(jax.device_put(jnp.zeros(a.shape, a.dtype), jax.devices("cpu")[0])
                  for a in ARGS),  # committed to this machine's CPU
    lambda: tuple(np.zeros(a.shape, a.dtype) for a in ARGS),
    lambda: tuple(S(a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(
        jax.devices("cpu")[0])) for a in ARGS),
])
def test_arguments_get_the_targets_sharding(make):
  cap = hlo_audit.capture(jax.jit(mlp), *make(), target="h200")
  assert cap.platform == "gpu" and cap.target.name == "h200"
  assert "__triton" in cap.hlo_text or "gemm_fusion" in cap.hlo_text


def test_a_plain_callable_and_keyword_arguments():
  cap = hlo_audit.capture(lambda x, w, *, b: mlp(x, w, b), *ARGS[:2], b=ARGS[2],
                          target="h100")
  assert cap.device_kind == "NVIDIA H100 80GB HBM3"


def test_equinox_filter_jit_steps_compile_for_the_target():
  eqx = pytest.importorskip("equinox")
  model = eqx.nn.MLP(64, 8, 128, depth=2, key=jax.random.key(0))

  @eqx.filter_jit
  def loss(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)

  r = hlo_audit.audit(loss, model, jnp.zeros((32, 64)), target="h200")
  assert r.module.device_kind == "NVIDIA H200 141GB HBM3e" and r.kernels


def test_stages_already_lowered_are_refused():
  lowered = jax.jit(mlp).lower(*ARGS)
  with pytest.raises(CaptureError, match="lowered for its devices already"):
    hlo_audit.capture(lowered, target="h200")


def test_eight_gpus_give_nccl_collectives():
  target = hlo_audit.get_target("h200", gpus=8)
  mesh = target.mesh()
  P = jax.sharding.PartitionSpec
  batch = jax.sharding.NamedSharding(mesh, P("data", None))

  def step(w, x):
    return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

  r = hlo_audit.audit(jax.jit(step), S((512, 512), jnp.float32),
                      S((256, 512), jnp.float32, sharding=batch), target=target)
  assert r.module.target == "8x h200"
  assert [(c.opcode, c.group_size) for c in r.collectives] == [("all-reduce", 8)]
  assert r.module.instruction_count and r.peak_bytes  # one device's program


def test_abstract_mesh_shardings_move_onto_the_targets_devices():
  abstract = getattr(jax.sharding, "AbstractMesh", None)
  if abstract is None:
    pytest.skip("this jax has no AbstractMesh")
  mesh = abstract((4,), ("data",))
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  target = hlo_audit.get_target("h200", gpus=4)
  (placed,), _ = target.place((S((64, 8), jnp.float32, sharding=sh),))
  assert placed.sharding.spec == sh.spec
  assert set(placed.sharding.device_set) == set(target.devices())


def test_autotune_results_reach_the_compile(tmp_path):
  results = tmp_path / "results.textproto"
  results.write_text("version: 3\n")
  r = hlo_audit.audit(jax.jit(mlp), *ARGS, target=hlo_audit.get_target(
      "h200", autotune_results=results))
  assert r.module.target_notes[0] == \
      f"autotuned from {results} (results dumped on a real GPU)"


@pytest.mark.parametrize("name", [s.name for s in hlo_audit.list_targets()])
def test_every_listed_target_builds_a_topology_on_this_jaxlib(name):
  # Specs newer than this jaxlib's XLA lose the fields it does not know.
  target = hlo_audit.get_target(name)
  (device,) = target.devices()
  assert device.device_kind == target.device_kind
