"""Keep-reuse is about a producer's materialization that several readers
share; a buffer written in place (dynamic-update-slice, scatter) holds the
updated values, not what the producer wrote, so it is never "worth keeping"."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind, Lifetime


def _update_then_read_three_times(x, w, u, i):
  y = x @ w
  y = jax.lax.dynamic_update_slice(y, u, (i, 0))
  return jnp.tanh(y).sum(0), jnp.exp(y).sum(1), jnp.sin(y).max(0)


def test_a_buffer_written_in_place_is_never_worth_keeping():
  S = jax.ShapeDtypeStruct
  r = hlo_audit.audit(jax.jit(_update_then_read_three_times),
                      S((1024, 256), jnp.float32), S((256, 256), jnp.float32),
                      S((1, 256), jnp.float32), S((), jnp.int32))
  # Buffers keep-reuse would take but for being written in place: several
  # readers, 1 MiB (well over 1% of the peak), neither input nor output.
  in_place = [b for b in r.buffers if b.aliases and len(b.consumers) > 1
              and b.bytes >= 1024 * 256 * 4 and b.producer
              and b.lifetime not in (Lifetime.INPUT, Lifetime.EXTERNAL_OUTPUT)]
  assert in_place, [(b.name, b.aliases, b.consumers) for b in r.buffers]
  names = {b.name for b in in_place}
  keep = r.findings_of(FindingKind.KEEP_REUSE)
  assert not [f for f in keep if f.boundary in names]
  for f in r.findings:
    if f.boundary in names:
      assert not any(FindingKind.KEEP_REUSE.value in n for n in f.notes), f.notes
