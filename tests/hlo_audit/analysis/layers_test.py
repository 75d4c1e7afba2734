"""The layer each finding names, read off JAX's name stack, on name stacks
the libraries really write (flax.linen, equinox, nn.scan + nn.remat, haiku,
an einsum inside an nnx model) and on a flax model's audit end to end."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit._src.analysis.layers import layer_of


@pytest.mark.parametrize("op_name, layer", [
    # flax.linen: the module path, forward and backward alike.
    ("jit(train_step)/jvp(Model)/MoE/router/dot_general", "Model/MoE/router"),
    ("jit(train_step)/transpose(jvp(Model))/MoE/router/dot_general", "Model/MoE/router"),
    # equinox: vmapped modules, and a jitted activation that is no layer.
    ("jit(make_step)/transpose(jvp(vmap(eqx.nn.MLP)))/eqx.nn.Linear/dot_general",
     "eqx.nn.MLP/eqx.nn.Linear"),
    ("jit(make_step)/jvp(vmap(eqx.nn.MLP))/vmap(jit(silu))/div", "eqx.nn.MLP"),
    # nn.scan over nn.remat: loop and remat plumbing dropped.
    ("jit(train_step)/transpose(jvp(Stack))/while/body/closed_call/checkpoint/"
     "rematted_computation/ScanCheckpointLayer_0/Dense_0/dot_general",
     "Stack/ScanCheckpointLayer_0/Dense_0"),
    # haiku's module separators.
    ("jit(f)/transformer/~/mlp/~/linear_0/dot_general", "transformer/mlp/linear_0"),
    # An inner jit of the whole step is no layer either.
    ("jit(step)/jit(main)/jvp(MLP)/Dense_1/dot_general", "MLP/Dense_1"),
    # No name at all (nnx pushes none), an einsum spec, fused names.
    ("jit(train_step)/jvp()/mul", ""),
    ("jit(train_step)/transpose(jvp(vmap(BTNH,BSNH->BNTS)))/transpose", ""),
    ("jit(f)/jvp(A)/b/add;jit(f)/jvp(C)/d/mul", "A/b"),
    ("", ""),
])
def test_layer_of_name_stacks(op_name, layer):
  assert layer_of(op_name) == layer


def test_findings_name_their_layer_in_json_text_and_html(tmp_path):
  flax_nn = pytest.importorskip("flax.linen")

  class Block(flax_nn.Module):
    @flax_nn.compact
    def __call__(self, x):
      h = flax_nn.gelu(flax_nn.Dense(256, name="up")(x))
      return flax_nn.Dense(64, name="down")(h)

  model = Block()
  x = jnp.zeros((128, 64))
  params = model.init(jax.random.key(0), x)["params"]

  def loss(p, x):
    return jnp.sum(model.apply({"params": p}, x) ** 2)

  r = hlo_audit.audit(jax.jit(jax.grad(loss)), params, x)
  layers = {f.layer for f in r.findings}
  assert {"Block/up", "Block/down"} <= layers, layers
  # Every finding of this model comes from one of its layers or none.
  assert layers <= {"Block/up", "Block/down", "Block", ""}, layers
  doc = json.loads(r.to_json())
  assert {f["layer"] for f in doc["findings"]} == layers
  text = r.to_text(all=True)
  assert "layer: Block/up" in text or "layer: Block/down" in text
  page = tmp_path / "r.html"
  r.to_html(str(page))
  assert "Block/up" in page.read_text()


def test_an_output_of_a_multi_output_fusion_names_its_own_layer():
  # penzai's llama-like transformer compiled for an H200: a fusion's outputs
  # come from different sublayers (penzai names them by index), and its own
  # op_name is only its first output's.
  from tests.hlo_audit.real_models import h200_support

  r = hlo_audit.audit_hlo(h200_support.fixture("penzai_llama"))
  layers = {f.boundary: f.layer for f in r.findings}
  assert layers["input_add_multiply_reduce_fusion{2}"] == "3/1"  # the final norm
  assert layers["input_add_reduce_fusion.4{1}"] == "2/1/1/0/0"
  assert layers["input_multiply_reduce_fusion{1}"] == "1/0/0/1"
