"""`hlo-audit file PATH`: audit an HLO text file or an XLA dump folder."""

from __future__ import annotations

import argparse
import json

from hlo_audit._src.cli.common import ExitCode, add_device_flag, add_output_flags, emit
from hlo_audit._src.report.safe import printable


def add_parser(sub) -> None:
  p = sub.add_parser(
      "file", help="audit an HLO text file or an XLA dump folder",
      description="Audit optimized HLO from a text file, or from a folder written "
                  "by XLA_FLAGS=--xla_dump_to=DIR (CPU, GPU or TPU).")
  p.add_argument("path", help="HLO text file or XLA dump folder")
  p.add_argument("--module", metavar="REGEX",
                 help="pick the dump's module whose name matches, or the one with this id "
                      "(--list shows ids; default: the largest)")
  p.add_argument("--list", action="store_true",
                 help="list the dump's optimized modules and exit (with --json: as JSON)")
  add_device_flag(p, target_alias=True)
  add_output_flags(p)
  p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> ExitCode:
  from hlo_audit._src.analysis.options import AuditOptions
  from hlo_audit._src.audit import audit_capture
  from hlo_audit._src.capture.dump import load_dump

  dump = load_dump(args.path, args.module)
  if args.list:
    if args.json:
      print(json.dumps([{"id": m.id, "name": m.name, "stage": m.stage, "bytes": m.size,
                         "path": m.text_path} for m in dump.modules], indent=2))
      return ExitCode.OK
    for m in dump.modules:
      print(f"{m.id:6d}  {printable(m.name):40s}  {printable(m.stage):36s}  "
            f"{m.size:>10d} bytes")
    return ExitCode.OK
  prefix = ["hlo-audit", "file", args.path] + (["--module", args.module] if args.module else [])
  prefix += ["--device", args.device] if args.device else []
  options = AuditOptions(device=args.device)
  return emit(audit_capture(dump.capture(args.module), options), args, prefix=prefix)
