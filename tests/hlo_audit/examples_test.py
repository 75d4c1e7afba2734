"""`hlo_audit.examples`: the built-in example, audited and run from its public names."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import examples

_TINY = examples.TransformerConfig(batch=2, seq=8, d_model=16, heads=2, d_ff=32, vocab=32)


def test_the_example_audits_from_abstract_args():
  fn, (params, tokens, cfg) = examples.example(_TINY)
  assert cfg is _TINY and tokens.shape == (2, 8)
  report = hlo_audit.audit(fn, params, tokens, cfg)
  assert report.kernels and report.peak_bytes > 0


def test_the_train_step_runs_on_initialised_params():
  params = examples.init_params(_TINY, jax.random.PRNGKey(0))
  tokens = jnp.zeros((_TINY.batch, _TINY.seq), jnp.int32)
  loss, new = jax.jit(examples.train_step, static_argnums=(2,))(params, tokens, _TINY)
  assert jnp.isfinite(loss)
  assert jnp.allclose(loss, examples.loss_fn(params, tokens, _TINY), rtol=1e-5)
  assert jax.tree.structure(new) == jax.tree.structure(params)


def test_data_parallel_splits_the_batch_and_replicates_the_parameters():
  import pytest
  from jax.sharding import PartitionSpec as P

  _, args = examples.example(_TINY)
  params, tokens, cfg = examples.data_parallel(args, 1)
  assert tokens.sharding.spec == P("data", None) and cfg is _TINY
  assert all(p.sharding.spec == P() for p in jax.tree.leaves(params))
  with pytest.raises(ValueError, match=r"batch \(2\) must divide by 3"):
    examples.data_parallel(args, 3)
