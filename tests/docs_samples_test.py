"""The manual's output samples hold: every ```text (or bare ```) block of
README.md and docs/*.md is either made again here and compared with what the
page shows, or says before it, in an HTML comment, why it is not
(`tests/docs_support.py` has the comment's forms).

The comparison is of the sample's shape, not its every character: headings,
column names, row classes, shapes and source lines, counts and bytes; times,
percentages and ratios move from machine to machine and are not compared;
`...` in a sample stands for what it leaves out. Under the jax that made a
sample (its comment names it) the numbers must be the sample's; under
another only the words (`docs_support.compare`).

Each page's Python blocks run once (`docs_support.run_page`, shared with
docs_test.py), and each command once.
"""

from __future__ import annotations

import re

import jax
import pytest

from tests import docs_support as ds
from tests.gpu_target import require_gpu_target
from tests.tpu_target import require_tpu_target

SAMPLES = [f for page in ds.PAGES for f in ds.samples(page)]


def _checked() -> list:
  out = []
  for f in SAMPLES:
    try:
      spec = ds.spec_of(f)
    except ValueError:
      continue  # test_every_sample_is_checked_or_says_why says so
    if spec is not None:
      marks = [pytest.mark.slow] if spec.gpu_target else []
      out.append(pytest.param(f, spec, id=f.where, marks=marks))
  return out


def test_every_sample_is_checked_or_says_why():
  assert SAMPLES, "no output samples found"
  bad = []
  for f in SAMPLES:
    try:
      ds.spec_of(f)
    except ValueError as e:
      bad.append(str(e))
  assert not bad, "\n".join(bad)


def test_the_pages_check_most_samples():
  checked = sum(1 for f in SAMPLES if ds.spec_of(f) is not None)
  assert checked >= 10, f"only {checked} of {len(SAMPLES)} samples are checked"


@pytest.mark.parametrize(("sample", "spec"), _checked())
def test_sample_matches_a_fresh_run(sample, spec):
  if spec.gpu_target:
    require_gpu_target()
  if spec.tpu_target:
    require_tpu_target()
  if spec.command:
    code, output = ds.run_command(spec.command)
    assert code in (0, 1), f"{sample.where}: {spec.command} exited {code}:\n{output[-2000:]}"
  else:
    output = ds.python_output(sample)
  exact = jax.__version__ == spec.jax
  problems = ds.compare(sample.body, output, exact=exact)
  how = ("every number but times" if exact else
         f"words only: this is jax {jax.__version__}, the sample jax {spec.jax}'s")
  assert not problems, (
      f"{sample.where}: the sample no longer matches "
      f"{spec.command or 'what the blocks above it print'} ({how}):\n  "
      + "\n  ".join(problems) + "\n--- what it prints now:\n" + output[-4000:])


# ---------------------------------------------------------------- compare ----

_OUT = """\
hlo-audit: jit_layer on cpu
  137 instructions, 2 kernels (1 cpu library fusion, 1 loop fusion)
  peak 898.00 KiB (allocations 898.00 KiB + heap 0 B); XLA's 898.00 KiB (+0.00%)
  3 findings: 3 propose a change (2 unfused epilogue, 1 layout
      conflict) in 2 groups; 0 keep (reuse, already fused)
  estimated step on cpu (Intel(R) Xeon(R) Processor, 2 cores): 424 us (compute-bound 415 us)

Top 2 of 2 finding groups, by estimated time saved per step
  #     time  step       saves  peak  class               shape         kernel  source
  1  8.20 us  1.9%  512.00 KiB        unfused epilogue x2 f32[128,512]  matmul  layer.py:5
  2  1.00 us  0.1%  128.00 KiB        layout conflict     f32[64,512]   -       layer.py:6
"""


def test_compare_ignores_widths_times_and_the_order_of_a_class_list():
  sample = """\
hlo-audit: jit_layer on cpu
  137 instructions, 2 kernels (1 cpu library fusion, 1 loop fusion)
  ...
  3 findings: 3 propose a change (1 layout conflict, 2 unfused epilogue) in 2 groups; 0 keep
      (reuse, already fused)
  estimated step on cpu (...): 512 us (...)

Top 2 of 2 finding groups, by estimated time saved per step
  #     time  step       saves  peak  class               shape         kernel  source
  1  9.99 us  2.5%  512.00 KiB        unfused epilogue x2 f32[128,512]  matmul  layer.py:5
  ...
"""
  assert ds.compare(sample, _OUT, exact=True) == []
  assert ds.compare(sample, _OUT, exact=False) == []


@pytest.mark.parametrize(("old", "new", "said"), [
    ("512.00 KiB", "500.00 KiB", "500.00 is now 512.00 (bytes)"),
    ("x2", "x3", "3 is now 2 (count)"),
    ("layer.py:5", "layer.py:4", "4 is now 5 (count)"),
    ("3 findings", "4 findings", "4 is now 3 (count)"),
    ("unfused epilogue x2", "unfused prologue x2", "not found"),
    ("kernel  source", "kernel  src", "not found"),
])
def test_compare_catches_a_stale_sample(old, new, said):
  stale = _OUT.replace(old, new, 1)
  assert stale != _OUT
  problems = ds.compare(stale, _OUT, exact=True)
  assert problems and said in problems[0], problems


def test_under_another_jax_only_the_words_count():
  assert ds.compare(_OUT.replace("512.00 KiB", "500.00 KiB"), _OUT, exact=False) == []
  assert ds.compare(_OUT.replace("layer.py:5", "layer.py:4"), _OUT, exact=False) == []
  rows_swapped = re.sub(r"(  1 .*\n)(  2 .*\n)", r"\2\1", _OUT)
  assert rows_swapped != _OUT and ds.compare(rows_swapped, _OUT, exact=False) == []
  assert ds.compare(_OUT.replace("layout conflict", "layout change"), _OUT, exact=False)


def test_a_shown_command_and_elided_rows_are_left_out():
  sample = "$ hlo-audit example \\\n    --top 1\n  ...\n  2  1.00 us  0.1%  128.00 KiB  layout conflict\n"
  assert ds.compare(sample, _OUT, exact=True) == []


def test_a_time_may_change_its_unit_but_nothing_else():
  # A time moves between machines, and its unit with it (933 us here, 1.13
  # ms on a loaded CI runner); the bytes and words beside it do not.
  sample = "  6   933 us         0 B    remat whose recompute dominates  (launch 9.39 us)"
  assert ds.compare(sample, sample.replace("933 us", "1.13 ms").replace("9.39 us", "2 ns"),
                    exact=True) == []
  assert ds.compare(sample, sample.replace("933 us", "1.13 ms").replace("0 B", "0 KiB"),
                    exact=True)
  assert ds.compare(sample, sample.replace("(launch 9.39 us)", "(launch 9.39 us"), exact=True)
