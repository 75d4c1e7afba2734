"""The `python -m pallas_kernels` command line.

Each verb lives in its own module (`validate`, `bench`, `compile-report`);
`run(argv)` returns an `ExitCode` and is callable from Python. argparse, as
in hlo-audit's CLI: absl's flags are process-global, which does not suit
several verbs with their own flags, or calling `run` repeatedly from tests.
"""

from __future__ import annotations

import argparse
import sys

from pallas_kernels._src.cli import bench_cmd, compile_report_cmd, validate_cmd
from pallas_kernels._src.cli.common import ExitCode, UsageError

PROG = "python -m pallas_kernels"


def build_parser() -> argparse.ArgumentParser:
  return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
  """The top-level parser and each verb's."""
  p = argparse.ArgumentParser(
      prog=PROG, description="Validate, benchmark and compile-report the Pallas kernels.")
  sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
  for verb in (validate_cmd, bench_cmd, compile_report_cmd):
    verb.add_parser(sub)
  return p, dict(sub.choices)


def run(argv: list[str] | None = None) -> ExitCode:
  """Runs the command line on `argv` (without the program name; None:
  `sys.argv[1:]`)."""
  parser, verbs = _parsers()
  try:
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the verb's parser, with the verb's usage
      verbs[args.verb].error(f"unrecognized arguments: {' '.join(extra)}")
  except SystemExit as e:  # argparse printed the usage error (or the help)
    return ExitCode.OK if e.code == 0 else ExitCode.USAGE
  try:
    return args.handler(args)
  except UsageError as e:
    print(f"{PROG} {args.verb}: error: {e}", file=sys.stderr)
    return ExitCode.USAGE
