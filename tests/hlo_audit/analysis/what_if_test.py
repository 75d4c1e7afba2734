"""What-if replays and the memory findings, held against XLA's own peaks.

The train step below was inspected by hand: without donation XLA keeps the
six arguments of params and opt read-only and writes six outputs of the same
shapes; with `donate_argnums=(0, 1)` the outputs reuse the arguments' memory,
and XLA copies params['out']['kernel'], which the backward reads on a path
not ordered before its update.
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind, WhatIfError
from hlo_audit._src.report.json_report import report_from_dict
from hlo_audit._src.report.report import SCHEMA_VERSION

S = jax.ShapeDtypeStruct
F32 = jnp.float32
#: The replay's peak must match the changed program's peak this closely.
PREDICTION_TOLERANCE = 0.05
#: Per-finding peaks (quick replays) against full replays, as a share of the peak.
QUICK_TOLERANCE = 0.01
GPU_DUMPS = pathlib.Path(__file__).parents[1] / "capture" / "gpu_dumps"


def loss(params, x):
  h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
  return jnp.sum(h @ params["out"]["kernel"])


def step(params, opt, x):
  g = jax.grad(loss)(params, x)
  new_opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, g)
  new_params = jax.tree.map(lambda p, m: p - 0.01 * m, params, new_opt)  # update
  return new_params, new_opt


PARAMS = {"dense": {"kernel": S((512, 512), F32), "bias": S((512,), F32)},
          "out": {"kernel": S((512, 256), F32)}}
X = S((64, 512), F32)


@functools.cache
def report(donate: tuple[int, ...] = ()) -> hlo_audit.AuditReport:
  return hlo_audit.audit(jax.jit(step, donate_argnums=donate), PARAMS, PARAMS, X)


def test_undonated_arguments_are_found_by_path_with_the_fix():
  r = report()
  found = {f.boundary: f for f in r.findings_of(FindingKind.UNDONATED_ARGUMENT)}
  assert set(found) == {"params", "opt"}
  p = found["params"]
  assert set(p.ops) == {"params['dense']['kernel']", "params['dense']['bias']",
                        "params['out']['kernel']"}
  assert p.suggestion == "jax.jit(step, donate_argnums=(0, 1))"
  assert p.peak_saved > 0 and p.peak_after == r.peak_bytes - p.peak_saved
  assert p.source is not None and p.source.file.endswith("what_if_test.py")


def constants_step(consts, params, x):
  # A model's constants (penzai's eps, query scale and mask value, each
  # f32[]) read every step and never returned, beside parameters updated.
  def loss(params):
    h = x @ params["w"]
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + consts["eps"])
    return jnp.mean(jnp.where(h > consts["mask"], h * consts["scale"], 0.0))

  value, grads = jax.value_and_grad(loss)(params)
  return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


CONSTS = {"eps": S((), F32), "mask": S((), F32), "scale": S((), F32)}


def test_constants_sharing_only_the_losss_shape_are_not_donated():
  # The loss is the one f32[] output, and JAX's donation would alias it to
  # the first constant: that argument is read and kept (two of its three
  # leaves find no output), so donating it would delete the constants the
  # caller passes again. The parameters, returned updated, are donated.
  args = CONSTS, {"w": S((64, 32), F32)}, S((16, 64), F32)
  text = jax.jit(constants_step).lower(*args).compile().as_text()
  for r, fix in ((hlo_audit.audit(jax.jit(constants_step), *args), "donate_argnums=(1,)"),
                 # From HLO text alone the arguments are known by their paths.
                 (hlo_audit.audit_hlo(text), "donate_argnames=('params',)")):
    (f,) = r.findings_of(FindingKind.UNDONATED_ARGUMENT)
    assert f.boundary == "params" and f.ops == ("params['w']",)
    assert f.suggestion == f"jax.jit(constants_step, {fix})"


def test_donation_prediction_matches_the_donated_program():
  before, after = report(), report((0, 1))
  w = before.what_if(donate=[0, 1])
  assert w.baseline_peak_bytes == before.peak_bytes
  assert abs(w.peak_bytes - after.xla_peak_bytes) <= PREDICTION_TOLERANCE * after.xla_peak_bytes
  # The copy XLA adds for the out kernel is what makes the prediction right.
  assert any("params['out']['kernel']" in n for n in w.notes)
  assert w.peak_saved > 1 << 20
  # Names, paths and numbers name the same arguments.
  assert before.what_if(donate=["params", "opt"]).peak_bytes == w.peak_bytes
  # With donation in place the finding is gone.
  assert not after.findings_of(FindingKind.UNDONATED_ARGUMENT)


def test_what_if_names_what_is_wrong():
  r = report()
  with pytest.raises(WhatIfError, match="no argument 'parms'.*params"):
    r.what_if(donate=["parms"])
  with pytest.raises(WhatIfError, match="no buffer 'nope.1'"):
    r.what_if(drop=["nope.1"])


def test_fuse_takes_only_findings_a_fusion_closes():
  r = report()
  undonated, _ = r.findings_of(FindingKind.UNDONATED_ARGUMENT)
  # Replayed as a fusion, the argument would leave the program.
  with pytest.raises(WhatIfError, match=r"'argument not donated' finding \(params\) is not "
                     r"closed by a fusion; replay it with donate=\['params'\]"):
    r.what_if(fuse=[undonated])
  assert r.what_if(donate=[undonated.boundary]).peak_bytes < r.peak_bytes
  dp = hlo_audit.audit_hlo(GPU_DUMPS / "jax-0.11.2" / "dp_step_8gpu")
  (replicated,) = dp.findings_of(FindingKind.REPLICATED_BUFFER)
  (exposed,) = dp.findings_of(FindingKind.EXPOSED_COLLECTIVE)
  with pytest.raises(WhatIfError, match=r"\(param.1\) is not closed by a fusion; the replay "
                     "does not model its change"):
    dp.what_if(fuse=[replicated])
  with pytest.raises(WhatIfError, match=r"'exposed communication' finding \(fusion-start\)"):
    dp.what_if(fuse=[exposed])
  # The backward's scaling of the forward gemm's result reads nothing else:
  # the gemm's epilogue (its prologue alternative for the next gemm a note).
  (epilogue,) = dp.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert dp.what_if(fuse=[epilogue]).changes == (
      "fuse gemm_fusion_dot.1 (gemm_fusion_dot.1 -> loop_multiply_fusion)",)
  assert {k.fix for k in FindingKind} == {"fuse", "donate", "remat", ""}
  assert [k for k in FindingKind if not k.fix] == [
      FindingKind.ALREADY_FUSED, FindingKind.COSTLY_REMAT, FindingKind.EXPOSED_COLLECTIVE,
      FindingKind.RESHARD_AROUND_COLLECTIVE, FindingKind.REPLICATED_BUFFER,
      FindingKind.LOST_IN_PLACE]


def test_drop_and_fuse_replays():
  r = layers_report()
  heap = [b for b in r.buffers if b.name in r.live_at_peak and b.placement == "heap"]
  assert heap
  b = max(heap, key=lambda b: b.bytes)
  w = r.what_if(drop=[b.name])
  assert r.peak_bytes - b.bytes <= w.peak_bytes < r.peak_bytes
  assert len(w.timeline) == len(r.timeline) and w.baseline_timeline == r.timeline
  for f in r.findings:
    if f.peak_after is not None:
      assert f.peak_after + f.peak_saved == r.peak_bytes
  fusible = [f for f in r.actionable if f.boundary and f.peak_after is not None
             and f.kind.slug in ("unfused-epilogue", "separate-reduction",
                                 "unfused-prologue")]
  assert fusible
  # A quick replay of no change is the audited peak.
  from hlo_audit._src.analysis.liveness import LivenessEdits
  from hlo_audit._src.analysis.replay import quick_peak
  assert quick_peak(r.program, LivenessEdits()) == r.peak_bytes
  for f in fusible:  # the quick replay keeps the assignment; the full one redoes it
    full = r.what_if(fuse=[f]).peak_bytes
    assert abs(full - f.peak_after) <= QUICK_TOLERANCE * r.peak_bytes, (full, f.peak_after)


def test_a_quick_drop_shrinks_an_allocation_to_its_largest_member_left():
  from hlo_audit._src.analysis.liveness import LivenessEdits
  from hlo_audit._src.analysis.replay import quick_peak
  program = report().program
  base = program.liveness
  members: dict[int, list] = {}
  for b, i in base.allocation_of.items():
    members.setdefault(i, []).append(b)
  shared = [sorted(m, key=base.sizes.__getitem__, reverse=True)
            for m in members.values() if len(m) > 1]
  assert shared
  heap = quick_peak(program, LivenessEdits()) - sum(base.allocation_sizes)
  for m in shared:
    i = base.allocation_of[m[0]]
    for n in range(1, len(m) + 1):  # the n largest dropped
      left = max((base.sizes[b] for b in m[n:]), default=0)
      want = sum(base.allocation_sizes) - base.allocation_sizes[i] + left + heap
      assert quick_peak(program, LivenessEdits(dropped=frozenset(m[:n]))) == want


def test_what_if_in_json_round_trips():
  r = report()
  w = r.what_if(donate=[0])
  d = json.loads(r.with_what_if(w).to_json())
  assert d["schema_version"] == SCHEMA_VERSION
  assert d["what_if"]["peak_bytes"] == w.peak_bytes
  assert len(d["what_if"]["timeline"]) == len(d["timeline"])
  again = report_from_dict(d)
  assert again.what_if_replay == w
  assert "peak" in str(w) and "donate 0 (3 arrays)" in str(w)
  with pytest.raises(WhatIfError, match="no program"):
    again.what_if(donate=[0])


def mlp_layers(ws, x):
  for w in ws:
    x = jnp.tanh(x @ w)
  return jnp.sum(x)


@functools.cache
def layers_report() -> hlo_audit.AuditReport:
  return hlo_audit.audit(jax.jit(jax.grad(mlp_layers)), [S((512, 512), F32)] * 4,
                         S((1024, 512), F32))


def scaled_mlp(ws, g, x):
  x = x * g  # saved for the backward of the first dot; x and g stay live anyway
  for w in ws:
    x = jnp.tanh(x @ w)
  return jnp.sum(x)


def test_remat_candidate_lowers_the_peak_by_its_replay():
  r = hlo_audit.audit(jax.jit(jax.grad(scaled_mlp, argnums=(0, 1))),
                      [S((512, 512), F32)] * 3, S((512,), F32), S((1024, 512), F32))
  # Only x * g: the tanh outputs' inputs (the dots) die early. A boundary
  # another finding names carries the remat as a note (one record per buffer).
  line = scaled_mlp.__code__.co_firstlineno + 1
  found = [f for f in r.findings if f.kind is FindingKind.REMAT_CANDIDATE or any(
      n.startswith("also " + FindingKind.REMAT_CANDIDATE.value) for n in f.notes)]
  assert [f.source.line for f in found] == [line]
  (f,) = found
  w = r.what_if(remat=[f.boundary])
  assert w.peak_saved == 1024 * 512 * 4
  assert "jax.checkpoint_policies.dots_saveable" in (f.suggestion + " ".join(f.notes))


def scanned_remat(ws, x):
  # Layers under a scan, each rematerialized (flax's nn.scan over nn.remat):
  # the backward loop recomputes every forward dot, which no XLA version
  # can merge with the forward loop's.
  body = jax.checkpoint(lambda x, w: (jnp.tanh(x @ w), None),
                        policy=jax.checkpoint_policies.nothing_saveable)
  x, _ = jax.lax.scan(body, x, ws)
  return jnp.sum(x)


def checkpointed_but_plain(ws, x):
  return mlp_layers(ws, x)  # "checkpoint" in the name, no remat


def test_remat_of_dots_is_flagged_costly():
  r = hlo_audit.audit(jax.jit(jax.grad(scanned_remat)), S((4, 512, 512), F32),
                      S((256, 512), F32))
  (f,) = r.findings_of(FindingKind.COSTLY_REMAT)
  assert "dots_saveable" in f.suggestion
  # The backward loop's recomputed dot runs 4 times, 2*256*512*512 flops
  # each: 4 of the step's 16 (forward, recompute, two gradients per layer).
  assert f.extra_arithmetic.startswith(
      f"{4 * 2 * 256 * 512 * 512} dot flops recomputed (25% ")
  assert f.launches_removed == 1
  plain = hlo_audit.audit(jax.jit(jax.grad(checkpointed_but_plain)),
                          [S((512, 512), F32)] * 4, S((256, 512), F32))
  # The function's name is in every op_name: a substring test would take
  # each forward dot for a recomputed one.
  assert all("checkpoint" in k.op_name for k in plain.kernels if k.op_name)
  assert not plain.findings_of(FindingKind.COSTLY_REMAT)


def test_html_draws_the_timeline_before_and_after():
  r = report()
  page = r.with_what_if(r.what_if(donate=[0, 1])).to_html()
  assert "live bytes before and after the what-if" in page
  assert "before and after the what-if" not in r.to_html()


def test_schema_1_json_still_reads():
  d = json.loads(report().to_json())
  d["schema_version"] = 1
  for f in d["findings"]:
    del f["peak_after"], f["peak_saved"]
  for row in d["kernels"] + d["buffers"] + d["findings"]:
    del row["source_stack"]  # schema 1 had none (3 indexes `frames`)
  del d["what_if"], d["collectives"], d["frames"]
  old = report_from_dict(d)
  assert all(f.peak_after is None for f in old.findings)
  with pytest.raises(ValueError, match="schema_version 99"):
    report_from_dict({**d, "schema_version": 99})


_KEPT_INPUT = """HloModule m, is_scheduled=true

add {
  l = f32[] parameter(0)
  r = f32[] parameter(1)
  ROOT s = f32[] add(l, r)
}

ENTRY e {
  p = f32[] parameter(0)
  zero = f32[] constant(0)
  big = f32[10000000]{0} broadcast(p), dimensions={}
  red1 = f32[] reduce(big, zero), dimensions={0}, to_apply=add
  x = f32[2000,2500]{1,0} broadcast(p), dimensions={}
  b = f32[2000]{0} reduce(x, zero), dimensions={1}, to_apply=add
  y = f32[6000000]{0} broadcast(red1), dimensions={}
  red2 = f32[] reduce(y, zero), dimensions={0}, to_apply=add
  bb = f32[2000]{0} broadcast(red2), dimensions={}
  c0 = f32[2000]{0} add(b, bb)
  c = f32[] reduce(c0, zero), dimensions={0}, to_apply=add
  ROOT t = (f32[], f32[]) tuple(c, red1)
}
"""


def test_a_fusion_that_keeps_a_big_input_longer_is_not_called_exact():
  """`b` is small and away from the peak (`big`, step 2), but fusing it into
  `c0` keeps its 20 MB input `x` live over `y`: the peak rises to 44 MB. The
  shortcut "a heap boundary away from the peak leaves it unchanged" must not
  claim the old peak as exact."""
  from hlo_audit._src.analysis import replay
  p = hlo_audit.audit_hlo(_KEPT_INPUT).program
  fusion = ("b", "b", ("c0",))
  full = replay.replay(p, fuse=[fusion]).peak_bytes
  assert full > p.liveness.peak_bytes + 3_000_000
  ((peak, exact),) = replay.peak_after_fusions(p, [fusion])
  assert not exact and peak >= full


# `m` sums the rows of `v` (32 KiB) and `d` adds `o` to it, after `big` and
# `e` (256 KiB each) have come and gone. `d` is the result (not the heap).
_PLACEMENT = """
HloModule place, is_scheduled=true
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main (x: f32[8,1024], w: f32[1024], z: f32[]) -> (f32[1024], f32[]) {
  %x = f32[8,1024]{1,0} parameter(0)
  %w = f32[1024]{0} parameter(1)
  %z = f32[] parameter(2)
  EARLY
  %v = f32[8,1024]{1,0} exponential(%x)
  %m = f32[1024]{0} reduce(%v, %z), dimensions={0}, to_apply=%sum
  %big = f32[65536]{0} broadcast(%z), dimensions={}
  %e = f32[65536]{0} exponential(%big)
  %r = f32[] reduce(%e, %z), dimensions={0}, to_apply=%sum
  LATE
  %d = f32[1024]{0} add(%m, %o)
  ROOT %t = (f32[1024]{0}, f32[]) tuple(%d, %r)
}
"""


@pytest.mark.parametrize("ready", [True, False])
def test_a_fused_kernel_runs_where_the_producer_ran_when_its_inputs_are_ready(ready):
  """Fusing `m` into `d`: run where `d` ran, the kernel keeps `v` live over
  `big` (28 KiB more at the peak); run where `m` ran, it keeps nothing longer
  and `m`'s 4 KiB are gone. That needs `d`'s other input `o` by then: made
  from the parameter first, it is; sliced from `e`, it is not."""
  from hlo_audit._src.analysis import replay
  other = "%o = f32[1024]{0} negate(%w)" if ready else \
      "%o = f32[1024]{0} slice(%e), slice={[0:1024]}"
  text = _PLACEMENT.replace("EARLY" if ready else "LATE", other).replace(
      "  LATE\n" if ready else "  EARLY\n", "")
  p = hlo_audit.audit_hlo(text).program
  what = replay.replay(p, fuse=[("m", "m", ("d",))])
  if ready:
    assert what.peak_saved == 1024 * 4
    assert any("where their producers ran" in n for n in what.notes)
  else:
    assert what.peak_saved == -(8 * 1024 - 1024) * 4
    assert not what.notes


PASSED_THROUGH = """
HloModule passed, is_scheduled=true
ENTRY %main (a: f32[256,256], b: f32[256,256]) -> (f32[256,256], f32[256,256]) {
  %a = f32[256,256]{1,0} parameter(0)
  %b = f32[256,256]{1,0} parameter(1)
  %c = f32[256,256]{1,0} exponential(%b)
  ROOT %t = (f32[256,256]{1,0}, f32[256,256]{1,0}) tuple(%a, %c)
}
"""


def test_a_donation_never_takes_an_output_that_returns_an_argument():
  # Output 0 is `a` itself: JAX aliases no donated argument to it, so `b`
  # takes output 1 though output 0 comes first and has its shape.
  from hlo_audit._src.analysis.donation import donation_aliases

  program = hlo_audit.audit_hlo(PASSED_THROUGH).program
  assert donation_aliases(program.module, program.dataflow, [1]) == [((1,), 1)]
  assert donation_aliases(program.module, program.dataflow, [0, 1]) == [((1,), 0)]


def sgd(params, x):
  return jax.tree.map(lambda p: p - 0.1 * jnp.mean(x) * p, params)


def test_hlo_text_alone_names_the_argument_to_donate_by_its_path():
  # Without the jitted function only the parameters' paths name them: one
  # name, in a one-element tuple.
  text = jax.jit(sgd).lower({"w": S((512, 512), F32)}, X).compile().as_text()
  (f,) = hlo_audit.audit_hlo(text).findings_of(FindingKind.UNDONATED_ARGUMENT)
  assert (f.boundary, f.ops) == ("params", ("params['w']",))
  assert f.suggestion == "jax.jit(sgd, donate_argnames=('params',))"


@functools.cache
def _adam_mlp():
  """A flax.linen MLP trained with optax.adam, as their examples write it:
  params and the optimizer state are the step's first two arguments."""
  flax_nn = pytest.importorskip("flax.linen")
  optax = pytest.importorskip("optax")

  class MLP(flax_nn.Module):
    @flax_nn.compact
    def __call__(self, x):
      for d in (512, 512, 256):
        x = flax_nn.relu(flax_nn.Dense(d)(x))
      return flax_nn.Dense(10)(x)

  model, tx = MLP(), optax.adam(1e-3)

  def train_step(params, opt_state, x, y):
    def loss_fn(p):
      return jnp.mean((model.apply({"params": p}, x) - y) ** 2)
    loss_value, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss_value

  x, y = jnp.zeros((64, 256)), jnp.zeros((64, 10))
  params = model.init(jax.random.key(0), x)["params"]
  return train_step, (params, tx.init(params), x, y)


@pytest.mark.parametrize("donate", [(0,), (1,), (0, 1)])
def test_partial_donation_matches_xla_within_one_percent(donate):
  # Donating only the params (or only the optimizer state) makes XLA copy
  # the params the backward reads after their update: the copies are values
  # the buffer assigner packs like any other (two of the four fit in memory
  # another value leaves free here), not intervals on top of the heap.
  step_fn, args = _adam_mlp()
  r = hlo_audit.audit(jax.jit(step_fn), *args)
  w = r.what_if(donate=list(donate))
  xla = hlo_audit.audit(jax.jit(step_fn, donate_argnums=donate), *args).xla_peak_bytes
  assert abs(w.peak_bytes - xla) <= 0.01 * xla, (w.peak_bytes, xla)
  assert len(w.timeline) == len(w.baseline_timeline)
  if donate == (0,):
    assert sum("XLA copies params" in n for n in w.notes) == 4
