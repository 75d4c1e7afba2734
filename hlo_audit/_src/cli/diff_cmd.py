"""`hlo-audit diff A B`: what changed between two audits."""

from __future__ import annotations

import argparse
import json
import os

from hlo_audit._src.cli.common import ExitCode, UsageError, add_verbose_flag


def add_parser(sub) -> None:
  p = sub.add_parser(
      "diff", help="compare two audits (HLO files, dump folders or saved JSON reports)",
      description="Audit A and B (or load their saved JSON reports) and print which "
                  "kernels, buffers and findings appeared or vanished.")
  p.add_argument("a")
  p.add_argument("b")
  p.add_argument("--module", metavar="REGEX", help="module to pick in dump folders")
  p.add_argument("--json", action="store_true", help="print the diff as JSON")
  add_verbose_flag(p)
  p.set_defaults(handler=run)


def load_report(path: str, module: str | None):
  """An AuditReport from a saved JSON report, an HLO file or a dump folder."""
  from hlo_audit._src.audit import audit_hlo
  from hlo_audit._src.report.json_report import report_from_dict

  if not os.path.exists(path):
    raise UsageError(f"no such file or folder: {path!r}")
  if os.path.isfile(path) and path.endswith(".json"):
    with open(path, "rb") as f:
      raw = f.read()
    try:
      data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
      raise UsageError(f"{path!r} is not an hlo-audit JSON report: byte "
                       f"0x{raw[e.start]:02x} at offset {e.start} is not UTF-8") from None
    except json.JSONDecodeError as e:
      raise UsageError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    try:
      return report_from_dict(data)
    except ValueError as e:
      raise UsageError(f"{path!r} is not an hlo-audit JSON report: {e}") from None
  return audit_hlo(path, module=module)


def run(args: argparse.Namespace) -> ExitCode:
  d = load_report(args.a, args.module).diff(load_report(args.b, args.module))
  if args.json:
    print(json.dumps(d.to_dict(), indent=2))
  else:
    print(d)
  return ExitCode.OK
