"""`verify`: the method's acceptance gate for a swap (or any rewrite).

Keep a fusion only when (`../shared/docs/gpu-memory-fusion-layout.md`,
"Acceptance gate"):

a. the intended intermediate and launch are actually gone: both programs are
   audited with `hlo_audit` and diffed; the unfused-epilogue/prologue and
   separate-reduction findings at the lines the swap replaced must be gone, and
   launches must not grow (else the added kernels are listed: the why-not);
b. the numbers agree with the XLA baseline within the one tolerance table
   (`tolerances.py`), outputs and, when asked, gradients;
c. peak memory (the audit's) does not regress beyond a tolerance;
d. end-to-end time improves (median of synchronised repeats) -- measured only
   where kernels compile: interpret-mode timings mean nothing;
e. the kernels ran: a kernel of the candidate that fell back to XLA (its
   guard's reason, recorded while the candidate was traced, lowered and run)
   is named and fails the gate, since the numbers then say nothing about it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src.tolerances import relative_error, tolerance

PASS, FAIL, NOT_MEASURED = "pass", "fail", "not measured"

#: Finding classes a kernel swap is meant to close.
TARGET_CLASSES = ("unfused-epilogue", "unfused-prologue", "separate-reduction")


@dataclasses.dataclass(frozen=True, slots=True)
class Gate:
  """One criterion of the acceptance gate."""

  name: str
  #: "pass", "fail" or "not measured".
  status: str
  #: The figures the status rests on, in one line.
  figures: str
  #: Supporting lines (findings gone or left, worst errors, ...).
  details: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class VerificationReport:
  """Per-gate results and the overall verdict of `verify(f, g, ...)`."""

  gates: tuple[Gate, ...]
  #: Audits of the baseline and of the candidate, and their diff.
  before: Any = dataclasses.field(default=None, compare=False, repr=False)
  after: Any = dataclasses.field(default=None, compare=False, repr=False)
  diff: Any = dataclasses.field(default=None, compare=False, repr=False)
  #: The swap's report when the candidate is a swapped function.
  swap_report: Any = dataclasses.field(default=None, compare=False, repr=False)

  @property
  def passed(self) -> bool:
    """True when no measured gate failed."""
    return all(g.status != FAIL for g in self.gates)

  @property
  def verdict(self) -> str:
    failed = [g.name for g in self.gates if g.status == FAIL]
    return "PASS" if not failed else "FAIL (" + ", ".join(failed) + ")"

  def gate(self, name: str) -> Gate:
    for g in self.gates:
      if g.name == name:
        return g
    raise KeyError(name)

  def __str__(self) -> str:
    w_name = max(len(g.name) for g in self.gates)
    w_stat = max(len(g.status) for g in self.gates)
    lines = [f"{'gate'.ljust(w_name)}  {'status'.ljust(w_stat)}  figures",
             f"{'-' * w_name}  {'-' * w_stat}  {'-' * 40}"]
    for g in self.gates:
      lines.append(f"{g.name.ljust(w_name)}  {g.status.ljust(w_stat)}  {g.figures}")
      lines += [f"{'':{w_name}}  {'':{w_stat}}    {d}" for d in g.details]
    lines.append(f"verdict: {self.verdict}")
    return "\n".join(lines)

  def to_dict(self) -> dict:
    return {"verdict": self.verdict, "passed": self.passed,
            "gates": [dataclasses.asdict(g) for g in self.gates]}


def _fmt_bytes(n: int) -> str:
  from hlo_audit import format_bytes_delta
  return format_bytes_delta(n)


def _same_file(a: str, b: str) -> bool:
  return a == b or os.path.basename(a) == os.path.basename(b) and (
      a.endswith(b) or b.endswith(a))


def _removal_gate(before, after, diff, swap_report) -> Gate:
  from hlo_audit import finding_key

  targeted = [f for f in before.findings if f.kind.slug in TARGET_CLASSES]
  if swap_report is not None:
    locs = [loc for s in swap_report.replaced for loc in s.locations]
    targeted = [f for f in targeted if f.source is not None and any(
        _same_file(f.source.file, file) and f.source.line == line for file, line in locs)]
  # The swap replaces forward patterns; the backward at the same lines is the
  # kernels' VJP's business: its leftovers are reported, not judged.
  ops = {k.name: k.op_name for k in before.kernels}
  backward = [f for f in targeted if "transpose(" in ops.get(f.producer, "")]
  targeted = [f for f in targeted if f not in backward]
  after_ops = {k.name: k.op_name for k in after.kernels}
  after_bwd = {f for f in after.findings if "transpose(" in after_ops.get(f.producer, "")}
  # Findings are matched by class, shape, line and work; compare forward with
  # forward (a backward buffer of the same shape at the same line is another).
  left_keys = {finding_key(f) for f in after.findings if f not in after_bwd}
  gone = [f for f in targeted if finding_key(f) not in left_keys]
  kept = [f for f in targeted if finding_key(f) in left_keys]
  bwd_keys = {finding_key(f) for f in after_bwd}
  bwd_kept = [f for f in backward if finding_key(f) in bwd_keys]
  launches = diff.launches_delta
  figures = (f"{len(gone)}/{len(targeted)} targeted findings gone; kernels "
             f"{len(before.kernels)} -> {len(after.kernels)} (launches per run "
             f"{launches:+d}); materialized {_fmt_bytes(diff.materialized_bytes_delta)}")
  details = [f"still there: {f.kind.value} {f.boundary_shape} at {_src(f)}" for f in kept]
  details += [f"gone: {f.kind.value} {f.boundary_shape} at {_src(f)}" for f in gone[:6]]
  if len(gone) > 6:
    details.append(f"... and {len(gone) - 6} more gone")
  details += [f"backward, left by the kernel's VJP: {f.kind.value} {f.boundary_shape} at "
              f"{_src(f)}" for f in bwd_kept]
  if backward:
    details.append(f"backward findings at the replaced lines: "
                   f"{len(backward) - len(bwd_kept)}/{len(backward)} gone (not judged)")
  if not targeted:
    details.append("no unfused-epilogue/prologue or separate-reduction finding at the "
                   "replaced lines (XLA may already fuse them on this backend)")
  if launches > 0:
    details.append("launches grew; kernels added: " + ", ".join(
        f"{k.name} ({k.kind.value})" for k in diff.kernels_added[:8]))
  if not targeted and launches <= 0:
    # Nothing to remove is no removal: the gate says so instead of passing.
    return Gate("intermediates removed", NOT_MEASURED, figures, tuple(details))
  ok = not kept and launches <= 0
  return Gate("intermediates removed", PASS if ok else FAIL, figures, tuple(details))


def _src(f) -> str:
  """Where a finding came from, as the audit report prints it (openable)."""
  import hlo_audit
  return hlo_audit.format_source(f.source) if f.source else "unknown"


def _float_dtypes(tree) -> list:
  return [jnp.dtype(x.dtype) for x in jax.tree.leaves(tree)
          if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]


def _bound_dtype(out_dtype, input_dtypes) -> Any:
  """The least precise float dtype among an output and the inputs: a bf16
  model's f32 loss carries bf16 rounding, whichever side computes it."""
  cands = [jnp.dtype(out_dtype)] + list(input_dtypes)
  return min(cands, key=lambda d: (jnp.finfo(d).nmant, jnp.finfo(d).bits))


def _compare(label: str, a_tree, b_tree, input_dtypes, grad: bool, truth_tree=None):
  """(worst error/bound ratio, worst line, all ok) over the leaves of the
  baseline `a_tree` and the candidate `b_tree`.

  With `truth_tree` (the baseline computed in float32, for low-precision
  inputs) a leaf past the bound still passes when the candidate is no further
  from that truth than the baseline itself: in bf16, XLA's own rounding (a
  bias gradient summed in bf16, say) can exceed the bound that a kernel
  accumulating in f32 is then held to.
  """
  lines, ok, worst = [], True, 0.0
  a_leaves = jax.tree.leaves(a_tree)
  b_leaves = jax.tree.leaves(b_tree)
  t_leaves = jax.tree.leaves(truth_tree) if truth_tree is not None else [None] * len(a_leaves)
  if not len(a_leaves) == len(b_leaves) == len(t_leaves):
    return float("inf"), [f"{label}: {len(a_leaves)} vs {len(b_leaves)} leaves"], False
  for i, (a, b, t) in enumerate(zip(a_leaves, b_leaves, t_leaves)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
      lines.append(f"{label}[{i}]: {b.dtype}{list(b.shape)} vs {a.dtype}{list(a.shape)}")
      ok = False
      continue
    if not jnp.issubdtype(a.dtype, jnp.floating):
      if not np.array_equal(a, b):
        lines.append(f"{label}[{i}]: {a.dtype} values differ")
        ok = False
      continue
    dt = _bound_dtype(a.dtype, input_dtypes)
    bound = tolerance(dt, grad=grad)
    err = relative_error(b, a)
    within = err <= bound
    versus = ""
    if not within and t is not None and np.shape(t) == a.shape:
      t = np.asarray(t, np.float32)
      own, base = relative_error(b.astype(np.float32), t), relative_error(a.astype(np.float32), t)
      within = own <= base
      versus = (f"; against float32: {own:.2e}, the baseline's own {base:.2e}"
                f"{' (no worse: pass)' if within else ''}")
    ratio = err / bound if not within or versus == "" else min(err / bound, 1.0)
    if ratio >= worst:
      worst = ratio
      lines.insert(0, f"worst {label}: leaf {i} {a.dtype}{list(a.shape)} rel. error "
                      f"{err:.2e} (bound {bound:.0e}, {jnp.dtype(dt).name}){versus}")
    ok &= within
  return worst, lines[:3], ok


def _upcast(tree):
  """Low-precision float leaves as float32 (the baseline's float32 truth)."""
  def leaf(x):
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and \
        jnp.finfo(x.dtype).bits < 32:
      return jnp.asarray(x, jnp.float32)
    return x
  return jax.tree.map(leaf, tree)


def _numerics_gate(fj, gj, args, kwargs, grad_argnums) -> Gate:
  input_dtypes = _float_dtypes((args, kwargs))
  ref = fj(*args, **kwargs)
  out = gj(*args, **kwargs)
  low = any(jnp.finfo(d).bits < 32 for d in input_dtypes)
  # The baseline in float32: what low-precision errors are measured against.
  truth = fj(*_upcast(args), **_upcast(kwargs)) if low else None
  worst, lines, ok = _compare("output", ref, out, input_dtypes, grad=False, truth_tree=truth)
  figures = f"outputs within {worst:.2g}x of the bound"
  if grad_argnums is not None:
    nums = (grad_argnums,) if isinstance(grad_argnums, int) else tuple(grad_argnums)
    leaves = jax.tree.leaves(ref)
    rng = np.random.default_rng(0)
    cot = [jnp.asarray(rng.normal(size=np.shape(x)).astype(np.asarray(x).dtype))
           if jnp.issubdtype(np.asarray(x).dtype, jnp.floating) else None for x in leaves]

    def grads(fn):
      def scalar(*diff):
        full = list(args)
        for i, d in zip(nums, diff):
          full[i] = d
        outs = jax.tree.leaves(fn(*full, **kwargs))
        return sum(jnp.vdot(c.astype(jnp.float32), o.astype(jnp.float32))
                   for c, o in zip(cot, outs) if c is not None)
      return jax.jit(jax.grad(scalar, argnums=tuple(range(len(nums)))))(
          *[args[i] for i in nums])

    gw, glines, gok = _compare("gradient", grads(fj), grads(gj), input_dtypes, grad=True)
    ok &= gok
    worst = max(worst, gw)
    lines += glines
    figures += f"; gradients (args {list(nums)}) within {gw:.2g}x"
  return Gate("numerics", PASS if ok else FAIL, figures, tuple(lines))


def peak_without_internal(report) -> int:
  """The report's peak as a compiled kernel would leave it, step by step.

  Interpreted, a Pallas kernel is a loop over its grid whose outputs are
  filled before the loop starts; XLA schedules those fills (merged when
  identical, then copied into each loop's state) long before the loop runs,
  and pads operands and carries copies in the loop. Compiled, the kernel reads
  its operands in place and its outputs come to life when it launches. So the
  kernels' internal buffers are taken out, and each buffer an interpreted
  kernel produces is counted from that kernel's launch on, not from its fill.
  """
  line = list(report.timeline)
  if not line:
    return report.peak_bytes
  launch = {k.name: k.time for k in report.kernels if k.members}
  for b in report.buffers:
    if b.placement != "heap":
      continue  # XLA's allocations, shared by many buffers, stay
    first, last = b.live_range
    if not b.internal:
      if b.producer not in launch:
        continue
      last = min(last, launch[b.producer] - 1)  # before its kernel launched
    for t in range(max(first, 0), min(last, len(line) - 1) + 1):
      line[t] -= b.bytes
  return max(line)


def _memory_gate(before, after, peak_tolerance: float, interpreted: bool) -> Gate:
  raw = after.peak_bytes - before.peak_bytes
  judged = after.peak_bytes
  if interpreted:
    judged = peak_without_internal(after)
  internal = after.peak_bytes - judged
  delta = judged - before.peak_bytes
  rel = delta / max(before.peak_bytes, 1)
  ok = rel <= peak_tolerance
  figures = (f"peak {_fmt_bytes(delta)} ({100 * rel:+.1f}%, tolerance "
             f"+{100 * peak_tolerance:.0f}%): {before.peak_bytes} -> {judged} B")
  details = ()
  if internal:
    details = (f"raw peak {_fmt_bytes(raw)}; {internal} B lower as compiled kernels "
               "would leave it: without the interpreted kernels' padding and loop-state "
               "copies, and with their outputs live from their launch, not from the "
               "fills XLA schedules early",)
  return Gate("peak memory", PASS if ok else FAIL, figures, details)


def _time(fn, args, kwargs, repeats: int) -> float:
  jax.block_until_ready(fn(*args, **kwargs))
  samples = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args, **kwargs))
    samples.append(time.perf_counter() - t)
  return statistics.median(samples)


def _timing_gate(fj, gj, args, kwargs, repeats: int, interpreted: bool) -> Gate:
  if interpreted:
    return Gate("end-to-end time", NOT_MEASURED,
                "not measured: interpret mode timings mean nothing")
  tf = _time(fj, args, kwargs, repeats)
  tg = _time(gj, args, kwargs, repeats)
  return Gate("end-to-end time", PASS if tg < tf else FAIL,
              f"median of {repeats}: {tf * 1e3:.3f} ms -> {tg * 1e3:.3f} ms "
              f"({tf / tg:.2f}x)")


def _kernels_gate(fell_back: Sequence[guard.Fallback]) -> Gate:
  reasons: list[str] = []
  for f in fell_back:
    line = f"pallas_kernels.{f.op} fell back to XLA: {f.reason} ({f.signature})"
    if line not in reasons:
      reasons.append(line)
  figures = (f"{len(reasons)} kernel fallback(s) while the candidate was built and run"
             if reasons else "every kernel of the candidate ran (no fallback recorded)")
  return Gate("kernels ran", FAIL if reasons else PASS, figures, tuple(reasons[:8]))


def verify(f: Callable, g: Callable, *args: Any, grad_argnums: int | Sequence[int] | None = None,
           peak_tolerance: float = 0.05, repeats: int = 20, swap_report: Any = None,
           target: Any = None, here: Callable | None = None,
           **kwargs: Any) -> "VerificationReport":
  """Runs the acceptance gate of replacing `f` by `g` (e.g. `swap(f)`).

  Args:
    f: the XLA baseline.
    g: the candidate computing the same values (e.g. `pallas_kernels.swap(f)`);
      when it is a swapped function, gate (a) targets the findings at the lines
      it replaced, else every finding of the targeted classes.
    *args: concrete arrays (pytrees) to run both on.
    grad_argnums: also compare gradients (a vjp with a random cotangent) with
      respect to these positional arguments.
    peak_tolerance: accepted relative growth of peak memory.
    repeats: timing repeats (GPU/TPU only).
    swap_report: the `SwapReport` naming the replaced lines, when `g` is built
      from a swapped function rather than being one (e.g. a training step
      around a swapped loss).
    target: audit both programs as XLA compiles them for this device (e.g.
      "h200", `hlo_audit.get_target`); numerics still run on this machine.
    here: the candidate as it runs on this machine, where `g` is built for
      `target` alone (`swap(f, target="h200")` compiles for an H200 only):
      the same plan interpreted, e.g. `swap(f, target="h200",
      interpret=True)`. The numerics and timing gates run it; the audit
      compiles `g`.
    **kwargs: keyword arguments of both functions.

  Returns:
    A `VerificationReport`: per-gate status and figures and the verdict.

  Raises:
    ValueError: if an argument is abstract (a ShapeDtypeStruct).
  """
  from hlo_audit import audit
  from pallas_kernels._src.swap.rewrite import Swapped

  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves((args, kwargs))):
    raise ValueError("verify runs both functions: pass concrete arrays, not "
                     "ShapeDtypeStructs")
  fj, gj = jax.jit(f), jax.jit(g)
  before = audit(fj, *args, target=target, **kwargs)
  # Guards record when a call is traced: the candidate's own records follow.
  recorded = len(guard.fallbacks())
  after = audit(gj, *args, target=target, **kwargs)
  diff = before.diff(after)
  if swap_report is None and isinstance(g, Swapped):
    swap_report = g.report(*args, **kwargs)
  def interpreted(fn) -> bool:
    if isinstance(fn, Swapped) and fn._options.interpret is not None:  # noqa: SLF001
      return fn._options.interpret  # noqa: SLF001
    return backend.resolve_interpret(None)

  removal = _removal_gate(before, after, diff, swap_report)
  hj = gj if here is None else jax.jit(here)
  numerics = _numerics_gate(fj, hj, args, kwargs, grad_argnums)
  gates = (
      removal, numerics,
      # A program compiled for a target holds its kernels compiled.
      _memory_gate(before, after, peak_tolerance, target is None and interpreted(g)),
      _timing_gate(fj, hj, args, kwargs, repeats, interpreted(g if here is None else here)),
      _kernels_gate(guard.fallbacks()[recorded:]),
  )
  return VerificationReport(gates=gates, before=before, after=after, diff=diff,
                            swap_report=swap_report)
