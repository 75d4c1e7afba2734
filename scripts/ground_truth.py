r"""Precision and recall of the audit on the real-model ground-truth suite.

Compiles each model of tests/hlo_audit/real_models (flax linen and nnx,
equinox, optax train steps; CPU, a few seconds each), audits it, and compares
the findings with the model's hand-read `TRUTH`. Scoring, as in the tests
(tests/hlo_audit/real_models/truth.py):

  recall     expected finding instances matched (class, boundary shape, the
             model's own source line, bytes where given) / all expected,
             per expected class;
  precision  TP / (TP + FP) per reported class. A finding is TP when it
             matches an expectation and FP when it matches a declared
             non-finding (it contradicts the HLO: then it fills no
             expectation either). Every finding must be one or the other:
             the unjudged column counts those neither judges, and the
             suite's tests fail on any.

KEEP_REUSE and ALREADY_FUSED propose no change and are not scored.

Usage:
  python scripts/ground_truth.py                  # all models
  python scripts/ground_truth.py --models=lstm,bn_cnn --verbose
  python scripts/ground_truth.py --target=h200     # XLA:GPU for an H200
  python scripts/ground_truth.py --pending         # with truth.PENDING's models

Exit codes: 0 printed (whatever the scores), 2 bad flags or missing extras.
"""

from __future__ import annotations

import collections
import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_MODELS = flags.DEFINE_list("models", None, "models to run (default: all)")
_TARGET = flags.DEFINE_enum("target", "cpu", ["cpu", "h200"],
                            "cpu: compile here for XLA:CPU; h200: the committed "
                            "XLA:GPU compiles for an H200")
_VERBOSE = flags.DEFINE_bool("verbose", False, "list misses and false positives")
_PENDING = flags.DEFINE_bool("pending", False,
                             "also score the models the audit still gets wrong in "
                             "places (truth.PENDING): the whole grown suite")


def _pct(num: int, den: int) -> str:
  return f"{100 * num / den:5.1f}%" if den else "    -"


def main(argv) -> int:
  del argv
  try:
    from tests.hlo_audit.real_models import truth  # noqa: PLC0415
  except ImportError as e:  # flax, equinox or optax missing
    print(f"ground_truth: {e} (pip install -e '.[test]')", file=sys.stderr)
    return 2
  known = list(truth.MODELS) + list(truth.PENDING)
  names = _MODELS.value or (known if _PENDING.value else list(truth.MODELS))
  unknown = sorted(set(names) - set(known))
  if unknown:
    print(f"ground_truth: unknown models {unknown}; known: {', '.join(known)}",
          file=sys.stderr)
    return 2

  expected = collections.Counter()   # label -> instances expected
  found = collections.Counter()      # label -> instances matched
  tp = collections.Counter()         # reported class -> true positives
  fp = collections.Counter()         # reported class -> false positives
  unjudged = collections.Counter()   # reported class -> unjudged
  target = _TARGET.value
  print(f"jax {'.'.join(map(str, truth.jax_version()))}, target {target}")
  print(f"{'model':16} {'expected':>8} {'found':>6} {'TP':>4} {'FP':>4} {'unjudged':>8}"
        f" {'recall':>7} {'precision':>9}")
  for name in names:
    missing = truth.missing_library(name)
    if missing:
      print(f"{name:16} skipped: not installed: pip install '{missing}'")
      continue
    unread = truth.cpu_truth_unread(name) if target == "cpu" else ""
    if unread:
      print(f"{name:16} skipped: {unread}")
      continue
    r = truth.target_report(name, target)
    judged = truth.truth_of(name, target) or truth.ModelTruth(expect=())
    out = truth.compare(name, r.findings, judged)
    m_exp = sum(e.count for e, _ in out.matched)
    m_found = sum(len(fs) for _, fs in out.matched)
    for e, fs in out.matched:
      expected[e.label] += e.count
      found[e.label] += len(fs)
    true = [f for _, fs in out.matched for f in fs]
    for f in true:
      tp[f.kind.slug] += 1
    for f, _ in out.false_positives:
      fp[f.kind.slug] += 1
    for f in out.unjudged:
      unjudged[f.kind.slug] += 1
    m_tp, m_fp = len(true), len(out.false_positives)
    print(f"{name:16} {m_exp:8d} {m_found:6d} {m_tp:4d} {m_fp:4d} "
          f"{len(out.unjudged):8d} {_pct(m_found, m_exp):>7} {_pct(m_tp, m_tp + m_fp):>9}")
    if _VERBOSE.value:
      for e, fs in out.matched:
        for f in fs:
          print(f"    found  {e.label} {e.shape} <- {truth.describe(name, f)}")
      for e, n in out.missed:
        where = f"<{e.marker}>" if e.marker else "any line"
        print(f"    missed {n}x {e.label} {e.shape} at {where}: {e.why}")
      for f, why in out.false_positives:
        print(f"    false  {truth.describe(name, f)}\n           -> {why}")
      for f in out.unjudged:
        print(f"    unjudged {truth.describe(name, f)}")

  print()
  print(f"{'class':40} {'recall':>15} {'precision':>15} {'unjudged':>8}")
  labels = [k.slug for k in truth.SCORED] + ["any class"]
  for label in labels:
    if not (expected[label] or tp[label] or fp[label] or unjudged[label]):
      continue
    rec = f"{found[label]}/{expected[label]} {_pct(found[label], expected[label])}"
    pre = f"{tp[label]}/{tp[label] + fp[label]} {_pct(tp[label], tp[label] + fp[label])}"
    print(f"{label:40} {rec:>15} {pre:>15} {unjudged[label]:8d}")
  e_all, f_all = sum(expected.values()), sum(found.values())
  t_all, p_all = sum(tp.values()), sum(fp.values())
  print(f"{'overall':40} {f'{f_all}/{e_all} {_pct(f_all, e_all)}':>15} "
        f"{f'{t_all}/{t_all + p_all} {_pct(t_all, t_all + p_all)}':>15} "
        f"{sum(unjudged.values()):8d}")
  return 0


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))
