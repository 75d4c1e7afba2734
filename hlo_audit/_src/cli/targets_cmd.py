"""`hlo-audit targets`: the GPUs and TPUs `--target` can compile for, and
whether the wheels that compile for them are installed."""

from __future__ import annotations

import argparse
import json
import sys

from hlo_audit._src.cli.common import ExitCode, add_verbose_flag


def add_parser(sub) -> None:
  p = sub.add_parser(
      "targets", help="list the GPUs and TPUs --target can compile for",
      description="List the GPU specs --target NAME picks (the installed CUDA plugin's, "
                  "and hlo-audit's copies of XLA's) and the TPU generations, and check "
                  "the wheels that compile for them.")
  p.add_argument("--json", action="store_true", help="print the list as JSON")
  add_verbose_flag(p)
  p.set_defaults(handler=run)


def run(args: argparse.Namespace, out=None) -> ExitCode:
  from hlo_audit._src.report.units import fmt_bytes
  from hlo_audit._src.target import specs, tpus, wheels
  from hlo_audit._src.target.devices import gpu_facts

  out = out or sys.stdout
  known = specs.known_specs()
  problems = wheels.problems()
  aliases = {}
  for alias, name in specs.ALIASES.items():
    aliases.setdefault(name, []).append(alias)
  facts = {s.name: gpu_facts(s) for s in known}
  tpu_facts = {g.name: tpus.tpu_facts(g) for g in tpus.GENERATIONS}
  try:
    wheels.require_tpu_wheel()
    tpu_problem = None
  except Exception as e:  # noqa: BLE001 - a TargetError's one line
    tpu_problem = str(e)
  if args.json:
    out.write(json.dumps({
        "targets": [{"name": s.name, "aliases": aliases.get(s.name, []),
                     "device_kind": s.device_kind,
                     "compute_capability": s.compute_capability,
                     "sm_count": s.core_count, "memory_bytes": s.memory_bytes,
                     "source": s.source, "device_facts": facts[s.name].to_dict()}
                    for s in known],
        "tpus": [{"name": g.name, "device_kind": g.device_kind,
                  "one_chip": g.one_chip, "cores_per_chip": g.cores_per_chip,
                  "devices_per_chip": g.devices_per_chip,
                  "hbm_bytes_per_chip": g.hbm_bytes, "source": g.source,
                  "device_facts": tpu_facts[g.name].to_dict()} for g in tpus.GENERATIONS],
        "ready": not problems, "problems": problems,
        "install": wheels.pip_command() if problems else None,
        "tpu_ready": tpu_problem is None, "tpu_problem": tpu_problem}, indent=2) + "\n")
    return ExitCode.OK
  rows = [(s.name + (f" ({', '.join(aliases[s.name])})" if s.name in aliases else ""),
           s.device_kind, f"sm_{s.compute_capability}", str(s.core_count),
           fmt_bytes(s.memory_bytes), f"{facts[s.name].memory_bandwidth / 1e12:.2f}",
           f"{facts[s.name].matrix_rate('bf16') / 1e12:.0f}") for s in known]
  head = ("name", "device", "arch", "SMs", "memory", "HBM TB/s", "bf16 TFLOP/s")
  widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
  fmt = lambda r: "  ".join(c.rjust(w) if i >= 3 else c.ljust(w)  # noqa: E731
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip()
  lines = [fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, rows), ""]
  sources = sorted({s.source for s in known})
  lines.append("specs: " + "; ".join(sources))
  lines.append("rates: XLA's spec (dense, per GPU); the time model prices kernels with "
               "them (hlo-audit calibrate measures this machine's CPU)")
  if problems:
    lines.append(f"not ready: {'; '.join(problems)}: {wheels.pip_command()}")
  else:
    lines.append("ready: hlo-audit example --target h200 (or any name above; "
                 "--gpus N for N of them)")
  lines.append("")
  trows = [(g.name, g.device_kind, str(g.cores_per_chip), fmt_bytes(g.hbm_bytes),
            f"{g.hbm_bandwidth / 1e12:.2f}", f"{g.bf16_flops / 1e12:.0f}",
            f"{g.ici_bandwidth / 1e9:.0f}" if g.ici_bandwidth else "-")
           for g in tpus.GENERATIONS]
  thead = ("tpu", "device", "cores", "HBM", "HBM TB/s", "bf16 TFLOP/s", "ICI GB/s")
  twidths = [max(len(r[i]) for r in (thead, *trows)) for i in range(len(thead))]
  tfmt = lambda r: "  ".join(c.rjust(w) if i >= 2 else c.ljust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, twidths))).rstrip()
  lines += [tfmt(thead), tfmt(tuple("-" * w for w in twidths)), *map(tfmt, trows), ""]
  lines.append("per chip, from Google's Cloud TPU pages (" + ", ".join(
      g.source for g in tpus.GENERATIONS) + "); a slice: NAME:AxB (v5e, v6e) or "
      "NAME:AxBxC (v4, v5p) chips")
  if tpu_problem:
    lines.append(f"not ready: {tpu_problem}")
  else:
    lines.append("ready: hlo-audit example --target v5e (or v6e, v5p:2x2x1, ...)")
  out.write("\n".join(lines) + "\n")
  return ExitCode.OK
