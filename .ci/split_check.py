"""CI's split, checked: every test that run 1 skips for want of run 2's
extras (the GPU target's plugin wheels, Triton's IR of a newer jax, jax >=
0.11's Mosaic GPU interpreter, Ray) is one that run 2 collects.

Run 2 runs a selection (`RUN2` in `.ci/run`), so a new test of that kind in
a file the selection leaves out would run nowhere; this names it instead.

Usage: python .ci/split_check.py RUN1.xml RUN2.xml (pytest's --junitxml).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

#: Skip reasons that name what run 2 has and run 1 lacks.
EXTRAS = re.compile(r"CUDA plugin|GPU target|Mosaic GPU|[Tt]riton|\bRay\b|hlo-audit\[ray\]|"
                    r"jax(lib)? 0\.10")


def _cases(path: str) -> dict[str, str | None]:
  """{test id: its skip message, or None where it ran}."""
  out = {}
  for case in ET.parse(path).iter("testcase"):
    skipped = case.find("skipped")
    out[f"{case.get('classname')}::{case.get('name')}"] = (
        None if skipped is None else skipped.get("message", ""))
  return out


def main(run1: str, run2: str) -> int:
  first, second = _cases(run1), _cases(run2)
  wanted = {t for t, why in first.items() if why is not None and EXTRAS.search(why)}
  missing = sorted(wanted - second.keys())
  if not missing:
    print(f"== split: the {len(wanted)} tests run 1 skips for want of run 2's extras "
          "are all in run 2")
    return 0
  print(f"error: {len(missing)} test(s) skip in run 1 for want of run 2's extras, and "
        "run 2 does not run them (add their files to RUN2 in .ci/run):", file=sys.stderr)
  for t in missing:
    print(f"  {t}: {first[t][:120]}", file=sys.stderr)
  return 1


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:]))
