"""The program context: what every finder and replay reads of one audit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit._src.analysis.program import Program, Tables

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def _loss(w, xs):
  def step(h, x):
    h = jnp.tanh(h @ w + x)
    return h, h
  _, hs = jax.lax.scan(step, xs[0], xs)
  return jnp.sum(hs ** 2)


@functools.cache
def report() -> hlo_audit.AuditReport:
  return hlo_audit.audit(jax.jit(jax.grad(_loss)), S((64, 64), F32), S((8, 16, 64), F32))


def test_the_program_holds_the_reports_kernels_and_buffers_by_name():
  r = report()
  program = r.program
  assert isinstance(program, Program)
  assert list(program.kernels.values()) == list(r.kernels)
  assert list(program.buffers.values()) == list(r.buffers)
  assert program.options == r.options


def test_derived_tables_are_made_once_from_the_fields():
  r = report()
  program = r.program
  writes = {}
  for b in r.buffers:
    if b.producer:
      writes.setdefault(b.producer, []).append(b)
  assert program.writes == {k: tuple(v) for k, v in writes.items()}
  assert list(program.comps) == list(program.schedule.span)
  # The scan's body runs under a while loop; the gradient is a backward pass.
  whiles = [i for c in program.module.computations for i in c.instructions
            if i.opcode == "while"]
  assert whiles and set(program.loop_of.values()) == {w.name for w in whiles}
  assert program.has_backward


def test_kernel_instructions_users_and_lookups():
  program = report().program
  k = next(iter(program.kernels.values()))
  comp = program.comps[k.computation]
  assert program.inst(k) is comp.instruction(k.name)
  assert program.find_instruction(k.name) is program.inst(k)
  assert program.find_instruction("no-such-instruction") is None
  for operand in dict.fromkeys(program.inst(k).operands):
    assert program.inst(k) in program.users(comp, operand)
  assert comp.name in program.tables.users  # filled on first use
  program.tables.clear()
  assert program.tables == Tables()


def test_a_program_of_the_analyses_alone_replays():
  """Replays need the analyses, not the finders' fields."""
  r = report()
  p = r.program
  bare = Program(module=p.module, schedule=p.schedule, dataflow=p.dataflow,
                 liveness=p.liveness)
  assert bare.writes == {} and not bare.has_backward
  from hlo_audit._src.analysis.replay import replay
  assert replay(bare, drop=[]).peak_bytes == r.peak_bytes
