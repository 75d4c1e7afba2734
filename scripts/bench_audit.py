"""Audit cost at model scale: against the compile, and as the model grows.

Four tables, each measured in this one run. Tables 1 and 2 give the best of
their runs (compiles and audits interleaved, round by round): on a shared
machine the slower runs measure the neighbours. Tables 3 and 4 give medians.

1. `audit(jax.jit(f), *args)` of a train step (`--model`: by default an
   18-layer GPT-2-style Flax LM, ~46k lines of optimized HLO, a module the
   audit's rules were not written against) against
   `jax.jit(f).lower(*args).compile()`: when jit has not compiled `f` yet
   (goal <= 1.05x the compile alone) and when it has (goal <= 8% of it);
   with `xla_reports=True` for reference (one more compile, by design).
2. The whole report of that module: `audit_hlo` of its text (goal <= 8% of
   its compile), then the text, JSON and HTML renderings (all: <= 10%).
3. Scaling: `audit_hlo` of 1x, 2x, 4x and 8x the built-in 12-layer module, each in a fresh
   process: time and peak RSS above the process's baseline, log-log
   exponents against instruction count (goal <= 1.1), RSS / HLO text size
   (goal < 10x); and the HTML page's render time and size (whether a browser
   opens it fast is the HTML report's own test). `--scales=1,2,4,8,16`
   reaches ~535k instructions.
4. Third-party models (`--corpus_modules`, from ../shared/hlo_corpus or
   $HLO_CORPUS; skipped when absent): `audit_hlo` of each file against its
   parse, and how many of the findings' peaks after the change are exact
   (a full replay) rather than bounds. `--corpus_only` runs just this.

The scaled modules are synthesized from the compiled 12-layer module: k
copies of its computations, renamed, and one entry that runs the k copies
of the entry's body on the shared parameters and returns a k-tuple of their
results (XLA's parser accepts the result; the script checks). Compiling a
96-layer train step takes many minutes on 2 shared cores; `--compile_scales`
compiles real 24/48/96-layer steps instead.

Example:
  python scripts/bench_audit.py
  python scripts/bench_audit.py --scales=1,2 --nocapture
  python scripts/bench_audit.py --corpus_only
  python scripts/bench_audit.py --model_only   # tables 1-2: the speed goals
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402  (a sibling script module)

_SCALES = flags.DEFINE_list("scales", ["1", "2", "4", "8"], "Multiples of the base module.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 5, "Rounds of compile and audit (table 1); timed runs per measurement.")
_CAPTURE = flags.DEFINE_bool("capture", True, "Time audit(jax.jit(f)) against the compile.")
_COMPILE_SCALES = flags.DEFINE_bool(
    "compile_scales", False, "Compile real k x 12-layer steps instead of replicating text.")
_CACHE = flags.DEFINE_string(
    "cache_dir", os.path.join(tempfile.gettempdir(), "hlo_audit_bench"),
    "Where compiled modules are kept between runs ('' to always compile).")
_CHILD = flags.DEFINE_string("child", None, "(internal) audit this file and report JSON.")
_CORPUS_MODULES = flags.DEFINE_list(
    "corpus_modules", ["xla_benchmarks/hlo_mixtral_8x7b_bf16_1x8__1.hlo",
                       "xla_benchmarks/hlo_llama31_8b_bf16_1x8__1.hlo",
                       "xla_benchmarks/hlo_gemma4_2b_bf16__1.hlo"],
    "Table 4: third-party modules, relative to the corpus folder.")
_CORPUS_ONLY = flags.DEFINE_bool("corpus_only", False, "Run table 4 only.")
_MODEL_ONLY = flags.DEFINE_bool("model_only", False, "Run tables 1-2 only (the speed goals).")
_MODEL = flags.DEFINE_enum(
    "model", "gpt", ["gpt", "flax", "equinox", "example"],
    "Train step of tables 1-2 (bench_models.py): gpt, a GPT-2-style Flax LM, is a "
    "module the audit's rules were not written against; example is the built-in one.")
_MODEL_LAYERS = flags.DEFINE_integer(
    "layers", None, "Layers of that model (default: 18 for gpt, a ~46k-line step; 12 else).")

_LAYERS = 12
_SMALL = """HloModule m, is_scheduled=true

%fused (p0: f32[128,512], p1: f32[512]) -> f32[128,512] {
  %p0 = f32[128,512]{1,0} parameter(0)
  %p1 = f32[512]{0} parameter(1)
  %b = f32[128,512]{1,0} broadcast(%p1), dimensions={1}
  %a = f32[128,512]{1,0} add(%p0, %b)
  ROOT %t = f32[128,512]{1,0} tanh(%a)
}

ENTRY %main (x: f32[128,256], y: f32[256,512], z: f32[512]) -> f32[128,512] {
  %x = f32[128,256]{1,0} parameter(0)
  %y = f32[256,512]{1,0} parameter(1)
  %z = f32[512]{0} parameter(2)
  %d = f32[128,512]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %f = f32[128,512]{1,0} fusion(%d, %z), kind=kLoop, calls=%fused
}
"""


# ------------------------------------------------------------ replication --

_REF = re.compile(r"%([A-Za-z_][A-Za-z0-9_.\-]*)")
_COMP_START = re.compile(r"^(ENTRY[ \t]+)?%[^\n]*\{[ \t]*$", re.MULTILINE)


def _balanced(text: str, start: int) -> int:
  """End of the parenthesized group that opens at `text[start]`."""
  depth = 0
  for i in range(start, len(text)):
    c = text[i]
    if c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth == 0:
        return i + 1
  raise ValueError("unbalanced parentheses")


def replicate(text: str, k: int) -> str:
  """k copies of a module's computations under one entry (see module doc)."""
  if k == 1:
    return text
  starts = [m.start() for m in _COMP_START.finditer(text)]
  head, blocks = text[:starts[0]], []
  for i, s in enumerate(starts):
    end = text.index("\n}", s) + 2
    blocks.append(text[s:end])
  entry = next(b for b in blocks if b.startswith("ENTRY"))
  others = [b for b in blocks if b is not entry]
  entry_lines = entry.split("\n")
  params = [ln for ln in entry_lines[1:-1] if re.search(r" parameter\(\d+\)", ln)]
  param_names = {_REF.search(ln).group(1) for ln in params}
  body = [ln for ln in entry_lines[1:-1] if ln not in params]
  root_line = next(ln for ln in body if ln.lstrip().startswith("ROOT "))
  eq = root_line.index(" = ") + 3
  root_shape = root_line[eq:_balanced(root_line, eq)] if root_line[eq] == "(" else \
      root_line[eq:root_line.index(" ", eq)]

  def renamer(r):
    return lambda m: (m.group(0) if m.group(1) in param_names
                      else f"%r{r}_{m.group(1)}")

  out_comps, roots = [], []
  for r in range(k):
    sub = functools.partial(_REF.sub, renamer(r))
    out_comps += [sub(b) for b in others]
    roots.append(f"%r{r}_{_REF.search(root_line).group(1)}")
  entry_body = list(params)
  for r in range(k):
    sub = functools.partial(_REF.sub, renamer(r))
    entry_body += [sub(ln).replace("ROOT ", "", 1) if ln is root_line else sub(ln)
                   for ln in body]
  result = "(" + ", ".join([root_shape] * k) + ")"
  entry_body.append(f"  ROOT %replicas = {result} tuple({', '.join(roots)})")
  header = entry_lines[0]
  arrow = header.rindex(") -> ")
  entry_text = "\n".join([header[:arrow + 5] + result + " {", *entry_body, "}"])
  # The layout names the entry's result; aliasing names result indices.
  first, rest = head.split("\n", 1)
  layout = first.index("entry_computation_layout={")
  close = _balanced(first, first.index("(", layout))
  if not first.startswith("->(", close):
    raise ValueError("expected a tuple result in entry_computation_layout")
  end = _balanced(first, close + 2)
  first = first[:close] + "->" + result + first[end:]
  first = re.sub(r", input_output_alias=\{[^\n]*?\}\}", "", first)
  return "\n".join([first, rest.rstrip("\n"), "", "\n\n".join(out_comps), "",
                    entry_text, ""])


# ----------------------------------------------------------------- child --

def _status_bytes(field: str) -> int:
  """A /proc/self/status memory field (VmRSS now, VmHWM its peak). Not
  `ru_maxrss`: Linux carries it across exec from the forking parent."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f"no {field} in /proc/self/status")


def child(path: str, repeats: int) -> None:
  """Audits `path` `repeats` times; prints time and peak RSS as JSON."""
  import hlo_audit
  with open(path, encoding="utf-8") as f:
    text = f.read()
  # Warm-up on a small module: imports and caches count in the baseline.
  hlo_audit.audit_hlo(_SMALL)
  base = _status_bytes("VmRSS")
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    report = hlo_audit.audit_hlo(text)
    times.append(time.perf_counter() - t0)
    instructions = report.module.instruction_count
    del report
  peak = _status_bytes("VmHWM")  # the audit's peak, before the renderings
  report = hlo_audit.audit_hlo(text)
  t0 = time.perf_counter()
  page = report.to_html()
  html_s = time.perf_counter() - t0
  print(json.dumps({"times": times, "base": base, "peak": peak,
                    "instructions": instructions, "bytes": len(text),
                    "html_s": html_s, "html_bytes": len(page.encode())}))


def run_child(path: str, repeats: int) -> dict:
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), f"--child={path}",
       f"--repeats={repeats}"], check=True, capture_output=True, text=True,
      env={**os.environ, "PYTHONPATH": os.pathsep.join(
          [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
           os.environ.get("PYTHONPATH", "")])})
  return json.loads(out.stdout.strip().splitlines()[-1])


def slope(xs, ys) -> float:
  """Least-squares slope of log(ys) on log(xs)."""
  lx = [math.log(x) for x in xs]
  ly = [math.log(y) for y in ys]
  mx, my = statistics.fmean(lx), statistics.fmean(ly)
  return (sum((a - mx) * (b - my) for a, b in zip(lx, ly)) /
          sum((a - mx) ** 2 for a in lx))


# ------------------------------------------------------------------ main --

def best_time(fn, repeats: int) -> float:
  """The fastest of `repeats` runs: on a shared machine the slower ones
  measure the neighbours (as `timeit` advises)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _model_layers() -> int:
  return _MODEL_LAYERS.value or (18 if _MODEL.value == "gpt" else _LAYERS)


def capture_table(repeats: int) -> float:
  """Table 1: audit(jax.jit(f)) against jit's own compile."""
  import hlo_audit

  model, layers = _MODEL.value, _model_layers()

  def fresh():  # a function jax has not compiled: a new trace and compile
    return bench_models.BUILDERS[model](layers=layers)

  # Rounds of (compile, audit) of fresh functions, interleaved so that both
  # see the same machine; each the best of its rounds.
  compiles, colds = [], []
  for _ in range(repeats):
    fn, args = fresh()
    t0 = time.perf_counter()
    fn.lower(*args).compile()
    compiles.append(time.perf_counter() - t0)
    jitted, args = fresh()
    t0 = time.perf_counter()
    hlo_audit.audit(jitted, *args)
    colds.append(time.perf_counter() - t0)
  compile_s, cold_s = min(compiles), min(colds)
  warm_s = best_time(lambda: hlo_audit.audit(jitted, *args), 2 * repeats + 1)
  t0 = time.perf_counter()
  report = hlo_audit.audit(jitted, *args, xla_reports=True)
  reports_s = time.perf_counter() - t0
  print(f"\n1. audit(jax.jit(f)) of the {layers}-layer {model} train step "
        f"({report.module.instruction_count} instructions) vs "
        "jax.jit(f).lower(*args).compile()")
  print(f"{'':42s} {'seconds':>8s} {'/ compile':>10s}  goal")
  print(f"{'lower + compile (fresh function, best)':42s} {compile_s:8.2f} {1:10.3f}")
  print(f"{'audit, not compiled yet (compiles; best)':42s} {cold_s:8.2f} "
        f"{cold_s / compile_s:10.3f}  <= 1.05")
  print(f"{'audit, already compiled (best)':42s} {warm_s:8.2f} "
        f"{warm_s / compile_s:10.3f}  <= 0.08")
  print(f"{'audit, xla_reports=True (compiles again)':42s} {reports_s:8.2f} "
        f"{reports_s / compile_s:10.3f}")
  print(f"XLA's peak from: {report.module.xla_peak_source} (xla_reports=True); "
        f"{hlo_audit.audit(jitted, *args).module.xla_peak_source} (default)")
  return compile_s


def report_table(text: str, compile_s: float, repeats: int) -> None:
  """Table 2: the whole report of the base module against its compile."""
  import hlo_audit

  report = hlo_audit.audit_hlo(text)  # warm-up
  rows = [
      ("audit_hlo (parse + analyses)", lambda: hlo_audit.audit_hlo(text)),
      ("text render (default)", lambda: str(report)),
      ("text render (all=True)", lambda: report.to_text(all=True)),
      ("JSON", lambda: report.to_json()),
      ("HTML", lambda: report.to_html()),
  ]
  print(f"\n2. The whole report of the {_model_layers()}-layer {_MODEL.value} module "
        f"({report.module.instruction_count} instructions, "
        f"{len(text) / 1e6:.1f} MB) vs its compile ({compile_s:.1f} s)")
  total = 0.0
  for name, fn in rows:
    s = best_time(fn, 2 * repeats + 1)
    total += s
    goal = "  (goal <= 8%)" if name.startswith("audit_hlo") else ""
    print(f"{name:32s} {s:7.2f} s {s / compile_s:7.1%}{goal}")
  print(f"{'total':32s} {total:7.2f} s {total / compile_s:7.1%}  (goal <= 10%)")


def scaling_table(base: str, scales, repeats: int, cache_dir: str) -> None:
  """Table 3: audit time and peak RSS at 1x..8x."""
  from jaxlib import _hlo

  work = tempfile.mkdtemp(prefix="bench_audit_")
  rows = []
  for k in scales:
    if _COMPILE_SCALES.value and k > 1:
      text, _ = bench_models.compiled_text("example", cache_dir or None,
                                           layers=_LAYERS * k)
    else:
      text = replicate(base, k)
      if k == 2:
        _hlo.hlo_module_from_text(text)  # XLA accepts the synthesized module
    path = os.path.join(work, f"x{k}.hlo")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    r = run_child(path, repeats if k <= 2 else max(1, repeats - 2))
    r["k"] = k
    r["seconds"] = statistics.median(r["times"])
    r["rss"] = max(r["peak"] - r["base"], 1)
    rows.append(r)
    print(f"  measured {k}x: {r['instructions']} instructions", flush=True)
  how = "compiled" if _COMPILE_SCALES.value else "replicated text"
  print(f"\n3. audit_hlo at 1x..{scales[-1]}x the {_LAYERS}-layer module ({how}; "
        "a fresh process each)")
  print(f"{'scale':>5s} {'instrs':>8s} {'MB':>7s} {'audit s':>8s} "
        f"{'us/instr':>8s} {'peak RSS MB':>11s} {'RSS/text':>8s} "
        f"{'HTML s':>7s} {'HTML MB':>7s}")
  for r in rows:
    print(f"{r['k']:4d}x {r['instructions']:8d} {r['bytes'] / 1e6:7.1f} "
          f"{r['seconds']:8.2f} {1e6 * r['seconds'] / r['instructions']:8.1f} "
          f"{r['rss'] / 1e6:11.0f} {r['rss'] / r['bytes']:8.2f} "
          f"{r['html_s']:7.2f} {r['html_bytes'] / 1e6:7.1f}")
  if len(rows) > 1:
    n = [r["instructions"] for r in rows]
    print(f"log-log exponent vs instructions: time "
          f"{slope(n, [r['seconds'] for r in rows]):.2f}, peak RSS "
          f"{slope(n, [r['rss'] for r in rows]):.2f} (goal <= 1.1); "
          f"RSS/text max {max(r['rss'] / r['bytes'] for r in rows):.2f} (goal < 10)")


def corpus_table(repeats: int) -> None:
  """Table 4: audit_hlo of large third-party modules against their parse."""
  import hlo_audit

  root = os.environ.get("HLO_CORPUS") or os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "hlo_corpus")
  paths = [os.path.join(root, m) for m in _CORPUS_MODULES.value]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    print(f"\n4. skipped: HLO corpus module not found: {missing[0]}")
    return
  hlo_audit.audit_hlo(_SMALL)  # warm-up: imports
  print(f"\n4. audit_hlo of third-party modules against their parse (median of "
        f"{repeats})")
  print(f"{'module':34s} {'instrs':>7s} {'MB':>5s} {'parse s':>8s} {'audit s':>8s} "
        f"{'ratio':>6s} {'exact peaks':>12s}")
  for path in paths:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    parse_s = median_time(lambda: hlo_audit.parse_hlo(text), repeats)
    reports = []
    audit_s = median_time(lambda: reports.append(hlo_audit.audit_hlo(text)), repeats)
    r = reports[-1]
    peaks = [f for f in r.findings if f.peak_after is not None]
    name = os.path.basename(path).removesuffix(".hlo")
    print(f"{name[:34]:34s} {r.module.instruction_count:7d} {len(text) / 1e6:5.1f} "
          f"{parse_s:8.2f} {audit_s:8.2f} {audit_s / parse_s:6.1f} "
          f"{sum(f.peak_exact for f in peaks):5d}/{len(peaks):<6d}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  if _CHILD.value:
    child(_CHILD.value, _REPEATS.value)
    return
  import jax
  print(f"jax {jax.__version__}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs; {_REPEATS.value} rounds (best of them in tables 1-2, medians in 3-4)")
  if _CORPUS_ONLY.value:
    corpus_table(_REPEATS.value)
    return
  scales = sorted(int(s) for s in _SCALES.value)
  text, compile_s = bench_models.compiled_text(_MODEL.value, _CACHE.value or None,
                                               layers=_model_layers())
  if _CAPTURE.value:
    compile_s = capture_table(_REPEATS.value)  # this run's compile time
  else:
    print(f"(compile time {compile_s:.1f} s from when the module was cached)")
  report_table(text, compile_s, _REPEATS.value)
  if _MODEL_ONLY.value:
    return
  base, _ = bench_models.compiled_text("example", _CACHE.value or None)
  scaling_table(base, scales, _REPEATS.value, _CACHE.value)
  corpus_table(_REPEATS.value)


if __name__ == "__main__":
  app.run(main)
