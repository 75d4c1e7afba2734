"""XLA's own parser, isolated in a subprocess, as the reference for parity tests.

`jaxlib._hlo.hlo_module_from_text` calls XLA's C++ parser, which aborts the
process on a few inputs (CHECK failures) and can damage its heap on others. A
worker process parses files one by one and reports what XLA saw; when it
dies, the parent records the file as a crash and starts a new worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator

_WORKER = r'''
import json, sys
from jaxlib import _hlo

def opcode_text(inst):
    # "%name = f32[2]{0} add(...)": the opcode is the word before the first
    # "(" after the shape; the shape may contain parens (tuples), so use the
    # enum name, kebab-cased, with XLA's exceptions.
    return inst.opcode.name

with open(sys.argv[1], encoding="utf-8") as f:
    paths = f.read().splitlines()[int(sys.argv[2]):]
for path in paths:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read()
        module = _hlo.hlo_module_from_text(text)
        comps = [[c.name, [[i.name, opcode_text(i)] for i in c.instructions()]]
                 for c in module.computations()]
        out = {"path": path, "ok": True, "computations": comps}
    except Exception as e:  # XLA reports errors as RuntimeError
        out = {"path": path, "ok": False, "error": str(e).splitlines()[0][:300]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
'''

_SPECIAL = {
    "kCos": "cosine", "kSin": "sine", "kExp": "exponential",
    "kExpm1": "exponential-minus-one", "kLog1p": "log-plus-one",
    "kClz": "count-leading-zeros", "kPopulationCount": "popcnt",
    "kOptimizationBarrier": "opt-barrier", "kTopK": "topk", "kAtan2": "atan2",
    "kMulhi": "mulhi",
}


def opcode_name(enum_name: str) -> str:
  """XLA's HloOpcode enum name ("kGetTupleElement") -> text ("get-tuple-element")."""
  if enum_name in _SPECIAL:
    return _SPECIAL[enum_name]
  return re.sub(r"(?<!^)([A-Z])", r"-\1", enum_name[1:]).lower()


def parse_with_xla(paths: Iterable[str], timeout: float = 600) -> Iterator[dict]:
  """Yields, per path, {"path", "ok", "computations" | "error" | "crashed"}.

  `computations` is [[name, [[instruction, opcode], ...]], ...] in XLA's order,
  opcodes as printed in HLO text.
  """
  paths = list(paths)
  with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write("\n".join(paths) + "\n")
    listing = f.name
  try:
    start = 0
    while start < len(paths):
      proc = subprocess.Popen(
          [sys.executable, "-c", _WORKER, listing, str(start)],
          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
      assert proc.stdout is not None
      for line in proc.stdout:
        result = json.loads(line)
        if result.get("ok"):
          result["computations"] = [
              [name, [[i, opcode_name(op)] for i, op in insts]]
              for name, insts in result["computations"]]
        yield result
        start += 1
      proc.wait(timeout=timeout)
      if start < len(paths):
        # The worker died on paths[start]: report it and go on after it.
        yield {"path": paths[start], "ok": False, "crashed": True,
               "error": f"XLA's parser crashed (exit {proc.returncode})"}
        start += 1
  finally:
    os.unlink(listing)
