"""`validate`: hold any registered op's kernel against its XLA reference.

For every case of the requested tags, one row of checks:

* kernel_err: relative error norm of the Pallas kernel against the float32
  ground truth (`OpSpec.reference_f32`), per output, bounded by `tolerance()`
  of that output's dtype. The row shows the output with the worst error/bound.
* xla_err: the same measure for the XLA implementation (implementation="xla")
  on that output, so the kernel's error sits next to XLA's own.
* grad_err: for cases with `grad_argnums`, `jax.vjp` of the kernel with a
  random normal cotangent against `jax.vjp` of the ground truth on float32
  inputs, bounded by `tolerance(dtype, grad=True)`.
* written: every output element was written. Interpret mode initializes
  kernel outputs with NaN (integers: their minimum), i.e. it poisons them, and
  our ops have no `out=` buffer to poison on compiled backends; so the check is
  (1) non-finite values only where the ground truth has them, (2) no integer
  minimum where the ground truth has none (quantizers clip symmetrically), and
  (3) element-wise, |out - ref| <= 64 * bound * max(|ref|, rms(ref)), which
  catches finite garbage left in an unwritten region on compiled backends.
* nonfinite_ok: NaN and +-Inf at exactly the ground truth's positions (XLA's
  propagation); the point of the "nonfinite" cases, checked on all.
* repeat_exact: the same inputs twice give bit-identical outputs.
* fallback: reasons recorded by the op's guard while running the case (the
  kernel then ran XLA for that part, which the numbers reflect). Guards run
  when a call is traced, so each case first clears the trace caches of the
  ops' registered entry points (`guard.retrace_guards`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._src import backend
from pallas_kernels._src import guard
from pallas_kernels._src import inputs
from pallas_kernels._src import registry
from pallas_kernels._src.spec import Case, OpSpec
from pallas_kernels._src.tolerances import relative_error, tolerance

#: Element-wise slack of the `written` check, in multiples of the norm bound.
WRITTEN_SLACK = 64.0


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationRow:
  """Checks of one case of one op (see the module docstring)."""

  op: str
  case: str
  dtype: str
  kernel_err: float
  xla_err: float
  bound: float
  grad_err: float | None
  grad_bound: float | None
  written: bool
  nonfinite_ok: bool
  repeat_exact: bool
  fallback: str | None
  #: A fallback fails the row: the kernel itself must have run (and compiled).
  kernel_required: bool = False
  #: The designed fallback the case exercises (`Case.expect_fallback`), if any.
  expected_fallback: str = ""
  #: The distinct fallback reasons (`fallback` joins them for display).
  fallback_reasons: tuple[str, ...] = ()
  #: The Pallas backend(s) the kernels were built with ("mosaic_gpu",
  #: "triton", "mosaic_gpu+triton"), "xla" when no kernel was built.
  backend: str = ""

  @property
  def passed(self) -> bool:
    grads_ok = self.grad_err is None or self.grad_err <= self.grad_bound
    return (self.kernel_err <= self.bound and grads_ok and self.written
            and self.nonfinite_ok and self.repeat_exact
            and not (self.kernel_required and not self.fallback_as_designed))

  @property
  def fallback_as_designed(self) -> bool:
    """No fallback, or exactly the designed one the case exercises."""
    if self.expected_fallback:
      return bool(self.fallback_reasons) and all(
          r.startswith(self.expected_fallback) for r in self.fallback_reasons)
    return not self.fallback


_COLUMNS = ("op", "case", "dtype", "backend", "kernel_err", "xla_err", "bound", "grad_err",
            "written", "nonfinite", "repeat", "passed", "FALLBACK")


def _fallback_cell(r: ValidationRow) -> str:
  if not r.fallback:
    return "MISSING DESIGNED FALLBACK" if r.expected_fallback and r.kernel_required else "-"
  if r.expected_fallback and r.fallback_as_designed:
    return f"as designed: {r.fallback}"
  return ("REQUIRED KERNEL FELL BACK: " if r.kernel_required else "") + r.fallback


def _fmt_err(v: float | None) -> str:
  if v is None:
    return "-"
  return "inf" if math.isinf(v) else f"{v:.2e}"


def _yes(v: bool) -> str:
  return "yes" if v else "NO"


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationReport:
  """All rows of a `validate` run; `passed` only if every row passed."""

  rows: tuple[ValidationRow, ...]
  interpret: bool
  device: str
  #: Whether a fallback to XLA failed a row (see `validate`).
  require_kernel: bool = False

  @property
  def passed(self) -> bool:
    return bool(self.rows) and all(r.passed for r in self.rows)

  def failures(self) -> tuple[ValidationRow, ...]:
    return tuple(r for r in self.rows if not r.passed)

  def _cells(self) -> list[list[str]]:
    out = []
    for r in self.rows:
      grad = "-" if r.grad_err is None else f"{_fmt_err(r.grad_err)} (<= {r.grad_bound:.0e})"
      out.append([r.op, r.case, r.dtype, r.backend or "-", _fmt_err(r.kernel_err),
                  _fmt_err(r.xla_err),
                  f"{r.bound:.0e}", grad, _yes(r.written), _yes(r.nonfinite_ok),
                  _yes(r.repeat_exact), "PASS" if r.passed else "FAIL",
                  _fallback_cell(r)])
    return out

  def _header(self) -> str:
    mode = "interpret mode" if self.interpret else "compiled"
    if self.require_kernel:
      mode += ", kernels required"
    fell_back = sum(1 for r in self.rows if r.fallback)
    if fell_back:
      mode += f", {fell_back} fell back to XLA"
    verdict = "PASSED" if self.passed else "FAILED"
    return (f"validate: {verdict}, {len(self.rows)} cases, "
            f"{len(self.failures())} failed ({mode}, {self.device})")

  def to_markdown(self) -> str:
    """A Markdown table with a one-line verdict above it."""
    lines = [self._header(), "", "| " + " | ".join(_COLUMNS) + " |",
             "|" + "---|" * len(_COLUMNS)]
    for cells in self._cells():
      lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)

  def __str__(self) -> str:
    cells = [list(_COLUMNS)] + self._cells()
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = [self._header()]
    for k, row in enumerate(cells):
      lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
      if k == 0:
        lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _host(x) -> np.ndarray:
  return np.asarray(jax.device_get(x))


def _leaves(tree) -> list[Any]:
  return jax.tree_util.tree_leaves(tree)


def _bits_equal(a, b) -> bool:
  a, b = _host(a), _host(b)
  return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _nonfinite_match(out, ref) -> bool:
  out = _host(out).astype(np.float64)
  ref = _host(ref).astype(np.float64)
  return (np.array_equal(np.isnan(out), np.isnan(ref))
          and np.array_equal(np.where(np.isinf(ref), ref, 0.0),
                             np.where(np.isinf(out), out, 0.0)))


def _written(out, ref, bound: float) -> bool:
  raw = _host(out)
  out64 = raw.astype(np.float64)
  ref64 = _host(ref).astype(np.float64)
  if np.any(~np.isfinite(out64) & np.isfinite(ref64)):
    return False
  if np.issubdtype(raw.dtype, np.integer):
    poison = np.iinfo(raw.dtype).min
    if np.any((raw == poison) & (ref64 != poison)):
      return False
  finite = np.isfinite(ref64) & np.isfinite(out64)
  if not finite.any():
    return True
  ref_f = ref64[finite]
  rms = float(np.sqrt(np.mean(ref_f * ref_f)))
  limit = WRITTEN_SLACK * bound * np.maximum(np.abs(ref_f), rms) + 1e-30
  return bool(np.all(np.abs(out64[finite] - ref_f) <= limit))


def _call(spec: OpSpec, case: Case, implementation: str, interpret: bool,
          args: Sequence[Any] | None = None):
  args = case.args if args is None else args
  return spec.fn(*args, implementation=implementation, interpret=interpret,
                 **case.kwargs)


def _jitted(spec: OpSpec, case: Case, implementation: str, interpret: bool):
  # One compiled program per implementation: the same path a jitted user
  # program takes, and far faster than op-by-op dispatch of the reference.
  return jax.jit(lambda *args: _call(spec, case, implementation, interpret, args))


def _grad_errors(spec: OpSpec, case: Case, interpret: bool, seed: int
                 ) -> tuple[float, float]:
  """(worst grad error, its bound) by error/bound ratio."""
  argnums = case.grad_argnums

  def with_grads(base, grads):
    args = list(base)
    for i, g in zip(argnums, grads):
      args[i] = g
    return args

  def kernel_fn(*grads):
    return _call(spec, case, "pallas", interpret, with_grads(case.args, grads))

  args32 = [a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a
            for a in case.args]

  def ref_fn(*grads):
    return spec.reference_f32(*with_grads(args32, grads), **case.kwargs)

  primals = [case.args[i] for i in argnums]
  out_shapes = jax.eval_shape(kernel_fn, *primals)
  keys = inputs.Keys(seed, "cotangent:" + case.name)
  cts = jax.tree_util.tree_map(
      lambda o: inputs.normal(keys.next(), o.shape, o.dtype), out_shapes)

  @jax.jit
  def both(primals, primals32, cts):
    _, pullback = jax.vjp(kernel_fn, *primals)
    ref_out, ref_pullback = jax.vjp(ref_fn, *primals32)
    ref_cts = jax.tree_util.tree_map(lambda c, r: c.astype(r.dtype), cts, ref_out)
    return pullback(cts), ref_pullback(ref_cts)

  grads, ref_grads = both(primals, [args32[i] for i in argnums], cts)
  worst = (0.0, tolerance(primals[0].dtype, grad=True))
  for g, rg, p in zip(grads, ref_grads, primals):
    err = relative_error(g, rg)
    bound = tolerance(p.dtype, grad=True)
    if err / bound >= worst[0] / worst[1]:
      worst = (err, bound)
  return worst


def _validate_case(spec: OpSpec, case: Case, interpret: bool, seed: int,
                   check_grads: bool) -> ValidationRow:
  # Guards decide (and record fallbacks) when a call is traced; a cached trace
  # from an earlier call would hide them from this row's fallback column.
  guard.retrace_guards()
  before = len(guard.fallbacks(spec.name))
  chosen = len(guard.choices(spec.name))
  # The kernel path is called as users call it (the ops jit internally).
  out = _call(spec, case, "pallas", interpret)
  again = _call(spec, case, "pallas", interpret)
  xla = _jitted(spec, case, "xla", interpret)(*case.args)
  ref = jax.jit(lambda *args: spec.reference_f32(*args, **case.kwargs))(*case.args)
  outs, agains, xlas, refs = map(_leaves, (out, again, xla, ref))
  if not (len(outs) == len(refs) == len(xlas)):
    raise ValueError(f"{spec.name} {case.name}: {len(outs)} outputs, reference "
                     f"{len(refs)}, xla {len(xlas)}")

  worst = None  # (ratio, kernel_err, xla_err, bound)
  written = nonfinite_ok = True
  for o, x, r in zip(outs, xlas, refs):
    bound = tolerance(o.dtype)
    err = relative_error(o, r)
    ratio = err / bound
    if worst is None or ratio > worst[0]:
      worst = (ratio, err, relative_error(x, r), bound)
    written &= _written(o, r, bound)
    nonfinite_ok &= _nonfinite_match(o, r)
  repeat_exact = all(_bits_equal(a, b) for a, b in zip(outs, agains))

  grad_err = grad_bound = None
  if check_grads and case.grad_argnums:
    grad_err, grad_bound = _grad_errors(spec, case, interpret, seed)

  reasons = []
  for f in guard.fallbacks(spec.name)[before:]:
    if f.reason not in reasons:
      reasons.append(f.reason)
  _, kernel_err, xla_err, bound = worst
  backends = sorted({c.backend for c in guard.choices(spec.name)[chosen:]})
  return ValidationRow(
      op=spec.name, case=case.name, dtype=jnp.dtype(case.args[0].dtype).name,
      kernel_err=kernel_err, xla_err=xla_err, bound=bound, grad_err=grad_err,
      grad_bound=grad_bound, written=bool(written), nonfinite_ok=bool(nonfinite_ok),
      repeat_exact=repeat_exact, fallback="; ".join(reasons) or None,
      fallback_reasons=tuple(reasons),
      expected_fallback=case.expect_fallback,
      backend="+".join(backends) or ("xla" if reasons else kernel_backend_of(spec)))


def kernel_backend_of(spec: OpSpec) -> str:
  """The backend of an op that records no choice: its kernels are Triton's
  (only the matmul has a Mosaic GPU kernel and records which it built)."""
  del spec
  return "triton"


def validate(op: str | OpSpec | Sequence[str | OpSpec], *,
             tags: Sequence[str] = ("ci",), dtypes: Sequence[Any] | None = None,
             seed: int = 0, interpret: bool | None = None,
             check_grads: bool = True,
             require_kernel: bool | None = None, target: Any = None) -> ValidationReport:
  """Validates op(s) against the XLA reference over their cases.

  Args:
    op: an op name ("layer_norm"), an `OpSpec`, or a sequence of either.
    tags: run the cases carrying any of these tags (each case once).
    dtypes: keep only cases whose first argument has one of these dtypes;
      None keeps all.
    seed: seeds the random inputs and cotangents (deterministic).
    interpret: Pallas interpret mode; None interprets exactly without GPU/TPU.
    check_grads: also check gradients of cases that name `grad_argnums`.
    require_kernel: a row whose call fell back to XLA fails (else it passes on
      the reference's numbers, with the reason in the FALLBACK column). None
      requires kernels exactly where they compile (GPU, TPU): there "every
      kernel compiled" must not read like "nothing compiled".
    target: build the kernels for this device ("h200", a `jax.Device`, a
      `Target`; see `backend.resolve_target`): with `interpret=True` on a CPU,
      the kernels a GPU would compile run in their interpret mode (for an
      H200, the Mosaic GPU matmul in Mosaic GPU's interpreter; for "tpu", the
      row ops' Mosaic TPU kernels in TPU interpret mode). None: the device
      the inputs are on.

  Returns:
    A frozen `ValidationReport`; `report.passed` is the verdict, `print(report)`
    the table.

  Raises:
    ValueError: if the selection holds no case at all (a vacuous pass would
      hide a typo in `tags` or `dtypes`).
  """
  resolved = backend.resolve_target(target)
  with backend.targeting(resolved) if resolved is not None else contextlib.nullcontext():
    return _validate(op, tags=tags, dtypes=dtypes, seed=seed, interpret=interpret,
                     check_grads=check_grads, require_kernel=require_kernel)


def _validate(op, *, tags, dtypes, seed, interpret, check_grads, require_kernel):
  wanted = None if dtypes is None else {jnp.dtype(d).name for d in dtypes}
  interp = backend.resolve_interpret(interpret)
  required = (not interp) if require_kernel is None else bool(require_kernel)
  rows = [dataclasses.replace(_validate_case(spec, case, interp, seed, check_grads),
                              kernel_required=required)
          for spec, case in registry.select_cases(op, tags, seed)
          if wanted is None or jnp.dtype(case.args[0].dtype).name in wanted]
  if not rows:
    ops = [op] if isinstance(op, (str, OpSpec)) else list(op)
    raise registry.NoCasesError(f"no cases for ops {[getattr(o, 'name', o) for o in ops]} "
                                f"with tags {tuple(tags)} and dtypes {dtypes}")
  return ValidationReport(rows=tuple(rows), interpret=interp,
                          device=backend.target().describe(), require_kernel=required)
