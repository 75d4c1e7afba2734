"""`hlo-audit run MODULE:FUNCTION --arg 'f32[8,128]' ...`: audit a function
of an importable module for abstract arguments (no data needed).

A function of no arguments, given no `--arg`, is called first: when it
returns `(step, args)` or `(step, args, kwargs)`, with `step` callable, the
audit is of `step(*args, **kwargs)`; when it returns arrays, it is the
program; anything else is an error (it would audit a constant). That is how a train step whose
arguments are pytrees (flax or equinox parameters, an optimizer state) is
audited from the command line: `hlo-audit run train.py:make_step --target
h200`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from hlo_audit._src.cli.common import (ExitCode, UsageError, add_devices_flag,
                                       add_output_flags, add_target_flags, emit,
                                       target_prefix, use_devices, use_target)

_SPEC = re.compile(r"^\s*([a-z][a-z0-9]*)\[([0-9,\s]*)\]\s*$")


def add_parser(sub) -> None:
  p = sub.add_parser(
      "run", help="audit MODULE:FUNCTION for abstract arguments",
      description="Import MODULE (a dotted name, or a .py path), take FUNCTION, "
                  "and audit it for arguments given as HLO-style shapes; or, for a "
                  "FUNCTION of no arguments returning (step, args), audit step(*args).")
  p.add_argument("function", metavar="MODULE:FUNCTION",
                 help="module:function, e.g. mypkg.model:forward, model.py:loss, or "
                      "train.py:make_step returning (jitted step, args)")
  p.add_argument("--arg", metavar="SHAPE", action="append", default=[],
                 help="a positional argument, e.g. 'f32[8,128]', 'bf16[128,256]', 's32[]'")
  p.add_argument("--kwarg", metavar="NAME=SHAPE", action="append", default=[],
                 help="a keyword argument, e.g. 'mask=pred[128,128]'")
  add_devices_flag(p)
  add_target_flags(p)
  add_output_flags(p)
  p.set_defaults(handler=run)


def parse_arg_spec(spec: str):
  """'f32[8,128]' -> jax.ShapeDtypeStruct((8, 128), float32)."""
  import jax
  import jax.numpy as jnp

  from hlo_audit._src.hlo import dtypes

  m = _SPEC.match(spec)
  if m is None:
    raise UsageError(f"--arg {spec!r}: expected an HLO shape like f32[8,128]")
  name, dims = m.group(1), m.group(2)
  if not dtypes.is_element_type(name) or name not in dtypes.NUMPY_NAMES:
    raise UsageError(f"--arg {spec!r}: unknown element type {name!r}")
  shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtypes.NUMPY_NAMES[name]))


def load_function(target: str):
  module_name, sep, fn_name = target.rpartition(":")
  if not sep or not module_name or not fn_name:
    raise UsageError(f"{target!r}: expected MODULE:FUNCTION")
  try:
    if module_name.endswith(".py") or os.sep in module_name:
      path = os.path.abspath(module_name)
      if not os.path.exists(path):
        raise UsageError(f"{target!r}: no file {module_name!r}")
      spec = importlib.util.spec_from_file_location(
          os.path.splitext(os.path.basename(path))[0], path)
      module = importlib.util.module_from_spec(spec)
      sys.path.insert(0, os.path.dirname(path))
      spec.loader.exec_module(module)
    else:
      sys.path.insert(0, os.getcwd())
      module = importlib.import_module(module_name)
  except UsageError:
    raise
  except Exception as e:  # the user's module failed to import
    raise UsageError(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from None
  fn = getattr(module, fn_name, None)
  if fn is None:
    raise UsageError(f"{module_name!r} has no attribute {fn_name!r}")
  if not callable(fn):
    raise UsageError(f"{target!r} is not callable")
  return fn


def _takes_no_arguments(fn) -> bool:
  import inspect

  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    return False
  return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
             for p in sig.parameters.values())


#: What a function of no arguments may return, said in errors.
_FACTORY_FORMS = ("(step, args) or (step, args, kwargs), with step callable, args a tuple "
                  "or list and kwargs a dict")


def from_factory(result):
  """(step, args, kwargs) when `result` is what a factory returns --
  `(step, args)` or `(step, args, kwargs)` with a callable step -- else None."""
  if not isinstance(result, tuple) or len(result) not in (2, 3) or not callable(result[0]):
    return None
  step, fn_args = result[0], result[1]
  kwargs = result[2] if len(result) == 3 else {}
  if not isinstance(fn_args, (tuple, list)) or not isinstance(kwargs, dict):
    return None
  return step, tuple(fn_args), kwargs


def _computes_arrays(result) -> bool:
  """Whether `result` is what a computation returns: a pytree of arrays
  (then the function of no arguments is itself the program to audit)."""
  import jax
  import numpy as np

  leaves = jax.tree_util.tree_leaves(result)
  return bool(leaves) and all(isinstance(x, (jax.Array, np.ndarray, np.generic))
                              for x in leaves)


def _describe(value) -> str:
  """A value's kind, for an error: 'int', '(function, str)'."""
  def kind(v) -> str:
    return "function" if callable(v) else type(v).__name__
  if isinstance(value, tuple):
    return "(" + ", ".join(kind(v) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
  return kind(value)


def factory_or_program(name: str, fn, result):
  """What to audit for a function of no arguments that returned `result`:
  `(step, args, kwargs)` from a factory, or `(fn, (), {})` when `fn`
  computes arrays itself.

  Raises:
    UsageError: for anything else (a number, a string, a half-right tuple),
      naming what came back and the forms expected; auditing it would audit
      a constant program, silently.
  """
  made = from_factory(result)
  if made is not None:
    return made
  if _computes_arrays(result):
    return fn, (), {}
  raise UsageError(f"{name}() returned {_describe(result)}: a function of no arguments "
                   f"must return {_FACTORY_FORMS} (a factory), or arrays (a program "
                   "that needs no arguments); or give --arg SHAPE for each argument")


def run(args: argparse.Namespace) -> ExitCode:
  target = use_target(args)  # before anything starts JAX's backends
  use_devices(args.devices)
  from hlo_audit._src.audit import audit

  # Check the argument specs before importing the user's module.
  fn_args = [parse_arg_spec(a) for a in args.arg]
  kwargs = {}
  for kv in args.kwarg:
    name, sep, spec = kv.partition("=")
    if not sep:
      raise UsageError(f"--kwarg {kv!r}: expected NAME=SHAPE")
    kwargs[name] = parse_arg_spec(spec)
  fn = load_function(args.function)
  if not fn_args and not kwargs and _takes_no_arguments(fn):
    try:
      result = fn()
    except Exception as e:  # the user's factory failed
      raise UsageError(f"{args.function}() failed: {type(e).__name__}: {e}") from None
    fn, fn_args, kwargs = factory_or_program(args.function, fn, result)
  prefix = ["hlo-audit", "run", args.function]
  for a in args.arg:
    prefix += ["--arg", a]
  for kv in args.kwarg:
    prefix += ["--kwarg", kv]
  prefix += target_prefix(args)
  return emit(audit(fn, *fn_args, target=target, **kwargs), args, prefix=prefix)
