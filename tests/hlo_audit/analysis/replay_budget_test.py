"""The audit's budget of full what-if replays: one work budget for the whole
audit (fusion findings, remat, donation, collectives), deterministic, spent
on the findings whose change can move the peak, the largest first; the rest
keep the quick estimate and say so (`peak_exact`)."""

from __future__ import annotations

import fractions
import functools
import json

import jax
import jax.numpy as jnp

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit._src.analysis import replay
from hlo_audit._src.report.json_report import report_from_dict
from hlo_audit._src.report.text import record_fields

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def mlp(ws, x):
  # Two residual streams of different widths: the backward holds every
  # layer's inputs at the peak, so each layer adds findings whose boundary
  # can move it, of two sizes.
  y = x[:, :128]
  for w, v in ws:
    x = jnp.tanh(x @ w) * 1.5 + x
    y = jnp.tanh(y @ v) * 1.5 + y
  return jnp.sum(x) + jnp.sum(y)


@functools.cache
def mlp_capture(layers: int) -> hlo_audit.Capture:
  return hlo_audit.capture(jax.jit(jax.grad(mlp)),
                           [(S((256, 256), F32), S((128, 128), F32))] * layers,
                           S((512, 256), F32))


def step(params, opt, x):
  g = jax.grad(lambda p, x: mlp([(p["a"], p["b"])] * 3, x))(params, x)
  new_opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, g)
  return jax.tree.map(lambda p, m: p - 0.01 * m, params, new_opt), new_opt


@functools.cache
def step_capture() -> hlo_audit.Capture:
  params = {"a": S((256, 256), F32), "b": S((128, 128), F32)}
  return hlo_audit.capture(jax.jit(step), params, params, S((512, 256), F32))


def audit_counting(monkeypatch, cap, replays: int | None = None):
  """The audit of `cap` and its full replays (liveness runs of
  replay.replay, counted); with `replays`, a budget worth exactly that many
  plain replays."""
  if replays is not None:
    plain = hlo_audit.audit(cap)
    cost = replay.full_replay_cost(plain.program)
    monkeypatch.setattr(replay, "FULL_REPLAY_WORK_PER_INSTRUCTION", fractions.Fraction(
        replays * cost, plain.module.instruction_count))
    monkeypatch.setattr(replay, "MIN_FULL_REPLAY_WORK", 0)
  calls = []
  real = replay.analyze_liveness

  def counting(*args, **kwargs):
    calls.append(args[3])  # the edits
    return real(*args, **kwargs)

  monkeypatch.setattr(replay, "analyze_liveness", counting)
  report = hlo_audit.audit(cap)
  monkeypatch.setattr(replay, "analyze_liveness", real)
  return report, len(calls)


def movers(report) -> list:
  """Findings whose change can move the peak: (bytes, finding). A fusion
  that keeps its boundary (another reader needs it) leaves the peak as is."""
  out = []
  for f in report.findings:
    spec = (replay._full_replay_of(f)
            if f.peak_after is not None and not f.boundary_kept else None)
    if spec is None:
      continue
    fuse = spec.get("fuse")
    size = (replay.peak_mover_bytes(report.program, *fuse[0]) if fuse else
            replay.peak_mover_bytes(report.program, spec["remat"][0]))
    if size:
      out.append((size, f))
  return out


def test_full_replays_do_not_grow_with_the_findings(monkeypatch):
  counts, candidates = {}, {}
  for layers in (2, 8):
    # Four replays' worth: the donation of ws takes two (a dataflow run and
    # an assignment), the fusion findings two.
    r, counts[layers] = audit_counting(monkeypatch, mlp_capture(layers), replays=4)
    candidates[layers] = len(movers(r))
    assert r.program.cache["replay_budget"].replays == counts[layers]
  assert candidates[8] > candidates[2] > 2  # more findings could use one...
  assert counts == {2: 3, 8: 3}  # ...but the budget is the budget
  # The budget, not a lack of candidates, is what stops them.
  r, n = audit_counting(monkeypatch, mlp_capture(8), replays=1000)
  assert n >= 1 + candidates[8]  # (some replayed records merge into others)
  assert all(f.peak_exact for _, f in movers(r))


def test_a_small_module_gets_a_full_replay_for_every_finding_that_can_move_the_peak():
  r = hlo_audit.audit(mlp_capture(2))
  assert movers(r) and all(f.peak_exact for _, f in movers(r))


def test_the_largest_boundary_that_can_move_the_peak_gets_the_full_replay(monkeypatch):
  r, n = audit_counting(monkeypatch, mlp_capture(8), replays=4)
  ranked = sorted(movers(r), key=lambda m: -m[0])
  assert ranked[0][0] > ranked[-1][0]  # sizes differ: the order is tested
  exact = [f for _, f in ranked if f.peak_exact]
  # Two assignments' worth after the donation (one run, charged two): two
  # fusions, or one assigned at both of its placements (its kernel where the
  # consumer or where the producer ran), each charged.
  assert r.program.cache["replay_budget"].replays == n == 3
  # (the largest first: among boundaries of one size, any of them)
  assert len(exact) in (1, 2)
  assert min(n for n, f in ranked if f.peak_exact) >= max(
      n for n, f in ranked if not f.peak_exact)
  for f in exact:
    assert f.peak_after == r.what_if(fuse=[f]).peak_bytes
  # The others keep the quick estimate, and say so.
  assert sum(f.peak_exact for _, f in ranked) == len(exact)


def test_the_budget_is_shared_by_donation_and_fusions_and_deterministic(monkeypatch):
  # Two donation groups (params, opt) cost two replays each (dataflow too),
  # which leaves one of five for the fusion findings.
  r, n = audit_counting(monkeypatch, step_capture(), replays=5)
  donations = r.findings_of(FindingKind.UNDONATED_ARGUMENT)
  assert len(donations) == 2 and all(f.peak_exact and f.peak_after for f in donations)
  others = [f for _, f in movers(r)]
  assert len(others) > 1
  assert sum(f.peak_exact for f in others) == 1
  assert n == 3 and r.program.cache["replay_budget"].replays == 3
  again, _ = audit_counting(monkeypatch, step_capture(), replays=5)
  assert again.findings == r.findings
  # Without budget for the second donation, it has no peak rather than a
  # guess; the replay left goes to the largest fusion finding.
  r, n = audit_counting(monkeypatch, step_capture(), replays=3)
  assert sum(f.peak_after is not None for f in
             r.findings_of(FindingKind.UNDONATED_ARGUMENT)) == 1
  assert n == 2 and sum(f.peak_exact for _, f in movers(r)) == 1


def test_an_estimated_peak_says_so_in_json_and_text(monkeypatch):
  r, _ = audit_counting(monkeypatch, mlp_capture(8), replays=4)
  quick = [f for f in r.findings if f.peak_after is not None and not f.peak_exact]
  assert quick
  d = json.loads(r.to_json())
  assert [f["peak_exact"] for f in d["findings"]] == [f.peak_exact for f in r.findings]
  assert report_from_dict(d).findings == r.findings
  for f in d["findings"]:
    del f["peak_exact"]  # files written before the field: exact
  assert all(f.peak_exact for f in report_from_dict(d).findings)
  peak_line = {f: dict(record_fields(f))["peak after"] for f in r.findings
               if f.peak_after is not None}
  assert all(("estimated" in line) != f.peak_exact for f, line in peak_line.items())


def test_a_replay_on_the_shared_tables_is_a_fresh_replay():
  r = hlo_audit.audit(mlp_capture(2))
  assert "liveness_tables" in r.program.cache  # the baseline run made them
  for f in [*(f for _, f in movers(r)), *r.findings_of(FindingKind.UNDONATED_ARGUMENT)]:
    kwargs = ({"donate": list(f.ops)} if f.kind is FindingKind.UNDONATED_ARGUMENT
              else replay._full_replay_of(f))
    shared = replay.replay(r.program, **kwargs)
    tables = r.program.cache.pop("liveness_tables")
    fresh = replay.replay(r.program, **kwargs)
    r.program.cache["liveness_tables"] = tables
    assert shared == fresh
  # Edits never change the tables.
  assert replay.replay(r.program, drop=[]).timeline == r.timeline
