"""`hlo-audit example`: audit the built-in transformer block."""

from __future__ import annotations

import argparse
import dataclasses

from hlo_audit._src.cli.common import (ExitCode, UsageError, add_devices_flag,
                                       add_output_flags, add_target_flags, emit,
                                       target_prefix, use_devices, use_target)


def add_parser(sub) -> None:
  p = sub.add_parser(
      "example", help="audit the built-in transformer block (forward and backward)",
      description="Compile and audit the built-in transformer block, a training "
                  "step in plain JAX.")
  p.add_argument("--forward-only", action="store_true",
                 help="audit the forward loss only (no backward pass)")
  p.add_argument("--set", metavar="NAME=VALUE", action="append", default=[],
                 help="set a size of the example, e.g. --set batch=8 --set dtype=bfloat16")
  p.add_argument("--swap", action="store_true",
                 help="also swap the kernel library's kernels into the example "
                      "and show the before/after audit and numerics check")
  add_devices_flag(p)
  add_target_flags(p)
  add_output_flags(p)
  p.set_defaults(handler=run)


def config_from(pairs: list[str]):
  from hlo_audit._src.examples.transformer import TransformerConfig

  fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
  values = {}
  for pair in pairs:
    name, sep, value = pair.partition("=")
    if not sep or name not in fields:
      raise UsageError(f"--set {pair!r}: expected NAME=VALUE with NAME one of "
                       + ", ".join(fields))
    if name == "dtype":
      values[name] = value
    else:
      try:
        values[name] = int(value)
      except ValueError:
        raise UsageError(f"--set {pair!r}: {name} must be an integer") from None
  try:
    return TransformerConfig(**values)
  except ValueError as e:
    raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> ExitCode:
  target = use_target(args)  # before anything starts JAX's backends
  use_devices(args.devices)
  from hlo_audit._src.audit import audit
  from hlo_audit._src.examples.transformer import example

  cfg = config_from(args.set)
  n = target.device_count if target is not None else args.devices
  sets = list(args.set)
  if n and n > 1 and cfg.batch % n and not any(p.startswith("batch=") for p in sets):
    # The batch is split over the devices: the default one grows to the next
    # multiple of their count (a batch the user set is theirs to fix).
    cfg = dataclasses.replace(cfg, batch=n * -(-cfg.batch // n))
    sets.append(f"batch={cfg.batch}")
  fn, fn_args = example(cfg, backward=not args.forward_only)
  if n and n > 1:
    if args.swap:
      raise UsageError(f"--swap runs on one device; drop {'--gpus' if target else '--devices'}")
    fn_args = data_parallel(fn_args, n, target)
  if args.swap:
    from hlo_audit._src.cli.swap_cmd import run_swap
    return run_swap(fn, fn_args, args, target=target)
  prefix = ["hlo-audit", "example"] + (["--forward-only"] if args.forward_only else [])
  for pair in sets:
    prefix += ["--set", pair]
  prefix += target_prefix(args)
  return emit(audit(fn, *fn_args, target=target), args, prefix=prefix, swap_hint=True)


def data_parallel(fn_args, n: int, target=None):
  """`examples.data_parallel`, its batch error said as a flag's."""
  from hlo_audit._src.examples import transformer

  tokens = fn_args[1]
  if tokens.shape[0] % n:
    flag = "--gpus" if target is not None else "--devices"
    raise UsageError(f"{flag} {n}: the example's batch ({tokens.shape[0]}) must "
                     f"divide by {n}; add --set batch={n * max(1, tokens.shape[0] // n)}")
  return transformer.data_parallel(fn_args, n, target)
