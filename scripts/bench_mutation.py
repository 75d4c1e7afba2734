"""Mutation score of the tests: how many plausible one-line bugs they catch.

Runs mutmut (a mutation tool for Python: it changes one operator, constant or
call at a time and reruns the tests that reach the changed function) over
groups of modules, each with the tests that cover it: `analysis` (the
audit's analyses), `kernels` (the ops, their guards and backend choice) and
`swap`, defined in pyproject.toml's `[tool.bench_mutation.groups]` beside the
package layout they name.

Every mutant of a module is listed, then a seeded sample of each group is run
(a full run of thousands of mutants takes hours on two cores): the score is
killed / (killed + survived + not covered) of the sample, with a 95% interval.
The work happens in a scratch copy, so the checkout gets no `mutants/` folder.
Survivors are written out with their diffs: each is a test to write (or an
equivalent mutant: a change no test can see, listed in DO_NOT_MUTATE with why).

Example:
  pip install -e '.[mutation]'
  python scripts/bench_mutation.py --groups swap --sample 60 --out /tmp/mutation
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

from absl import app
from absl import flags

_GROUPS = flags.DEFINE_list("groups", "analysis,kernels,swap", "Module groups to mutate.")
_SAMPLE = flags.DEFINE_integer("sample", 80, "Mutants run per group (0: all of them).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the sample.")
_CHILDREN = flags.DEFINE_integer("max_children", 2, "Mutants run at once.")
_MUTANTS = flags.DEFINE_list(
    "mutants", [], "Run these mutants (names as survivors.md gives them, fnmatch patterns "
    "allowed) instead of a sample: to check that new tests kill earlier survivors.")
_OUT = flags.DEFINE_string("out", None, "Folder for results.json and survivors.md.")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the scratch copy (its mutants/ folder).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Group:
  """Modules to mutate and the tests that cover them."""

  name: str
  sources: tuple[str, ...]
  tests: tuple[str, ...]
  #: Test files left out: those that cannot run in mutmut's copy.
  ignore: tuple[str, ...] = ()
  #: Whether the workers share one persistent JAX compilation cache (see
  #: `_mutmut`); off where a test reads what only a real compile gives.
  compilation_cache: bool = False


def _groups() -> dict[str, Group]:
  """The groups of pyproject.toml's `[tool.bench_mutation.groups]`."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    table = tomllib.load(f)["tool"]["bench_mutation"]["groups"]
  return {name: Group(name, tuple(g["sources"]), tuple(g["tests"]),
                      tuple(g.get("ignore", ())), bool(g.get("compilation_cache", False)))
          for name, g in table.items()}


GROUPS = _groups()

#: Statuses that count as caught: the tests failed or crashed. A timeout is
#: not judged (on a loaded machine it measures the machine): it is reported.
_CAUGHT = ("killed", "segfault", "caught by type check")


def _copy_project(dest: str) -> None:
  """Tracked and untracked (not ignored) files of the checkout, into dest."""
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode().split("\0")
  for rel in filter(None, files):
    src = os.path.join(ROOT, rel)
    if not os.path.isfile(src):
      continue
    os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
    shutil.copy2(src, os.path.join(dest, rel))


#: Source lines mutmut leaves alone (a regex over each line, and why): each
#: makes only equivalent mutants, which no test can tell from the original.
DO_NOT_MUTATE = (
    # swap/probe.py `_within`: `<` differs from `<=` only when a float error
    # equals its tolerance exactly.
    r"^  return err <= tol$",
)


def _configure(work: str, group: Group) -> None:
  with open(os.path.join(work, "pyproject.toml"), "a") as f:
    f.write("\n[tool.mutmut]\n"
            f"source_paths = {json.dumps(list(group.sources))}\n"
            f"pytest_add_cli_args_test_selection = {json.dumps(list(group.tests))}\n"
            f"pytest_add_cli_args = {json.dumps([f'--ignore={t}' for t in group.ignore])}\n"
            'also_copy = ["hlo_audit", "pallas_kernels", "tests", "scripts", "pyproject.toml"]\n'
            "mutate_only_covered_lines = true\n"
            f"do_not_mutate_patterns = {json.dumps(list(DO_NOT_MUTATE))}\n"
            # JAX starts threads once it imports or computes: a worker forked
            # from a process that did can deadlock, so workers fork from a
            # server that imported neither JAX nor the tests.
            'process_isolation = "forkserver"\n'
            'forkserver_warmup = "none"\n'
            # Each worker compiles its programs afresh: far slower than the
            # warm run mutmut times the tests by.
            "timeout_multiplier = 40.0\n"
            "timeout_constant = 60.0\n")


def _mutmut(work: str, group: Group, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
  if group.compilation_cache:
    # One persistent compilation cache for every worker: the stats run fills
    # it, and a mutant's tests compile only the programs its change alters
    # (the normalization kernels' tests take 35 s cold, 10 s warm). mutmut's
    # clean run of the chosen mutants' tests comes after the stats run, with
    # the cache warm, so a test that the cache would change fails there,
    # before any mutant is judged.
    env.update(JAX_COMPILATION_CACHE_DIR=os.path.join(work, ".jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env,
                        capture_output=True, text=True)


def _exit_codes(work: str) -> dict[str, int | None]:
  """Mutant name -> its test run's exit code (None: not run), from mutmut's
  per-module metadata."""
  out: dict[str, int | None] = {}
  for folder, _, names in os.walk(os.path.join(work, "mutants")):
    for name in names:
      if name.endswith(".meta"):
        with open(os.path.join(folder, name)) as f:
          out.update(json.load(f).get("exit_code_by_key", {}))
  return out


def _wilson(k: int, n: int) -> tuple[float, float]:
  if n == 0:
    return 0.0, 1.0
  z, p = 1.96, k / n
  d = 1 + z * z / n
  c = (p + z * z / (2 * n)) / d
  h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
  return max(0.0, c - h), min(1.0, c + h)


def run_group(group: Group, sample: int, seed: int, children: int, keep: bool,
              only: tuple[str, ...] = ()) -> dict:
  work = tempfile.mkdtemp(prefix=f"mutation-{group.name}-")
  try:
    _copy_project(work)
    _configure(work, group)
    t0 = time.perf_counter()
    # Generates every mutant, and records which tests reach which function,
    # running none (no name matches).
    listed = _mutmut(work, group, "run", "--max-children", str(children), "no.such.mutant")
    if "failed to collect stats" in listed.stdout + listed.stderr:
      # A test fails in mutmut's copy (a file it did not copy, say): no
      # mutant can be judged against a suite that fails unmutated.
      raise RuntimeError(f"the tests of {group.name} fail unmutated in mutmut's copy "
                         f"(set debug = true under [tool.mutmut] to see which):\n"
                         f"{listed.stdout[-2000:]}\n{listed.stderr[-2000:]}")
    names = sorted(_exit_codes(work))
    if not names:
      raise RuntimeError(f"mutmut listed no mutants for {group.name}:\n"
                         f"{listed.stdout[-2000:]}\n{listed.stderr[-2000:]}")
    if only:
      chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in only)]
    elif not sample or sample >= len(names):
      chosen = names
    else:
      chosen = sorted(random.Random(seed).sample(names, sample))
    if not chosen:
      return {"group": group.name, "mutants": len(names), "sampled": 0, "counts": {},
              "killed": 0, "judged": 0, "score": None, "interval": [0.0, 1.0],
              "seconds": time.perf_counter() - t0, "survivors": []}
    ran = _mutmut(work, group, "run", "--max-children", str(children), *chosen)
    if ran.returncode != 0:
      # mutmut stops before any mutant when the chosen mutants' tests fail
      # unmutated (its clean run, with the compilation cache warm).
      raise RuntimeError(f"mutmut failed for {group.name} (exit {ran.returncode}):\n"
                         f"{ran.stdout[-3000:]}\n{ran.stderr[-2000:]}")
    codes = _exit_codes(work)
    from mutmut.stats import status_by_exit_code  # mutmut's own reading of them
    counts: dict[str, int] = {}
    survivors = []
    for name in chosen:
      code = codes.get(name)
      status = status_by_exit_code[code]
      counts[status] = counts.get(status, 0) + 1
      if status in ("survived", "no tests"):
        diff = _mutmut(work, group, "show", name).stdout
        survivors.append({"name": name, "status": status, "diff": diff})
    killed = sum(counts.get(s, 0) for s in _CAUGHT)
    judged = killed + counts.get("survived", 0) + counts.get("no tests", 0)
    lo, hi = _wilson(killed, judged)
    return {"group": group.name, "mutants": len(names), "sampled": len(chosen),
            "counts": counts, "killed": killed, "judged": judged,
            "score": killed / judged if judged else None, "interval": [lo, hi],
            "seconds": time.perf_counter() - t0, "survivors": survivors}
  finally:
    if keep:
      print(f"kept {work}")
    else:
      shutil.rmtree(work, ignore_errors=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    import mutmut  # noqa: F401
  except ImportError:
    raise app.UsageError("needs mutmut: pip install -e '.[mutation]'") from None
  unknown = [g for g in _GROUPS.value if g not in GROUPS]
  if unknown:
    raise app.UsageError(f"unknown groups {unknown}; known: {', '.join(GROUPS)}")
  results = []
  for name in _GROUPS.value:
    r = run_group(GROUPS[name], _SAMPLE.value, _SEED.value, _CHILDREN.value, _KEEP.value,
                  tuple(_MUTANTS.value))
    results.append(r)
    lo, hi = r["interval"]
    print(f"{name:9s} {r['killed']:4d}/{r['judged']:<4d} killed "
          f"({100 * (r['score'] or 0):.1f}%, 95% {100 * lo:.0f}-{100 * hi:.0f}%) of "
          f"{r['sampled']} sampled from {r['mutants']} mutants; {r['counts']}; "
          f"{r['seconds']:.0f} s", flush=True)
  unjudged = [r["group"] for r in results if r["sampled"] and not r["judged"]]
  killed = sum(r["killed"] for r in results)
  judged = sum(r["judged"] for r in results)
  lo, hi = _wilson(killed, judged)
  print(f"{'all':9s} {killed:4d}/{judged:<4d} killed ({100 * killed / max(judged, 1):.1f}%, "
        f"95% {100 * lo:.0f}-{100 * hi:.0f}%)")
  if _OUT.value:
    os.makedirs(_OUT.value, exist_ok=True)
    with open(os.path.join(_OUT.value, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
    with open(os.path.join(_OUT.value, "survivors.md"), "w") as f:
      for r in results:
        f.write(f"# {r['group']}\n\n")
        for s in r["survivors"]:
          f.write(f"## {s['name']} ({s['status']})\n\n```diff\n{s['diff'].strip()}\n```\n\n")
  if unjudged:
    print(f"no mutant of {', '.join(unjudged)} was judged (see the counts): no score",
          file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  app.run(main)
