"""The seconds a finding's change saves, class by class, priced from the
kernels it names: on the step the time model estimated for XLA:CPU's compile
of `relu(x @ w + b)` (two kernels: the dot, and the bias and relu)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.analysis.time_model import time_saved

S = jax.ShapeDtypeStruct


@functools.cache
def _audit():
  r = hlo_audit.audit(lambda x, w, b: jax.nn.relu(x @ w + b), S((64, 128), jnp.float32),
                      S((128, 256), jnp.float32), S((256,), jnp.float32))
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  dot, epilogue = f.producer, f.consumers[0]
  return r.timing, f, r.timing.kernel(dot), r.timing.kernel(epilogue)


def _as(kind, **fields):
  step, f, _, _ = _audit()
  return time_saved(dataclasses.replace(f, kind=kind, **fields), step)


def test_the_two_kernels_are_priced_apart():
  _, _, dot, epilogue = _audit()
  assert dot.time > 0 and epilogue.time > 0 and dot.time != epilogue.time


def test_capacity_findings_save_no_time():
  for kind in (FindingKind.KEEP_REUSE, FindingKind.ALREADY_FUSED,
               FindingKind.UNDONATED_ARGUMENT, FindingKind.REPLICATED_BUFFER):
    assert _as(kind) == 0.0


def test_a_remat_costs_its_producer_once_and_a_costly_one_saves_all_it_names():
  _, f, dot, epilogue = _audit()
  assert _as(FindingKind.REMAT_CANDIDATE) == -dot.time_per_launch
  assert _as(FindingKind.REMAT_CANDIDATE, producer="nope") is None
  assert _as(FindingKind.COSTLY_REMAT) == pytest.approx(dot.time + epilogue.time)


def test_collectives_save_what_they_expose_or_what_a_dot_can_hide():
  _, f, dot, epilogue = _audit()
  assert _as(FindingKind.EXPOSED_COLLECTIVE) == dot.time
  assert _as(FindingKind.EXPOSED_COLLECTIVE, producer="nope") is None
  # An all-gather (here the dot) overlapped with the dot reading it (here
  # the epilogue): the smaller of the two.
  assert _as(FindingKind.COLLECTIVE_MATMUL) == min(dot.time, epilogue.time)
  assert _as(FindingKind.COLLECTIVE_MATMUL, consumers=("nope",)) == 0.0
  assert _as(FindingKind.COLLECTIVE_MATMUL, producer="nope") is None
  # A reshard: the copy the boundary names goes.
  assert _as(FindingKind.RESHARD_AROUND_COLLECTIVE, boundary=f.consumers[0]) == epilogue.time
  assert _as(FindingKind.RESHARD_AROUND_COLLECTIVE, boundary="nope") is None


def test_loop_invariant_work_saves_every_iteration_but_one():
  _, _, dot, _ = _audit()
  assert _as(FindingKind.LOOP_INVARIANT, trip_count=5) == pytest.approx(4 * dot.time_per_launch)
  assert _as(FindingKind.LOOP_INVARIANT, trip_count=None) == dot.time_per_launch
  assert _as(FindingKind.LOOP_INVARIANT, producer="nope") is None
