"""`python -m pallas_kernels`: validate, benchmark and compile-report the kernels.

Usage:
  python -m pallas_kernels validate [--ops OP,...] [--tags TAG,...] [--dtypes DTYPE,...]
      [--out PATH] [--interpret auto|true|false] [--require-kernel auto|true|false]
      [--no-grads] [--target NAME]
  python -m pallas_kernels bench [--ops OP,...] [--tags TAG,...] [--out PATH]
      [--repeats N] [--warmup N]
  python -m pallas_kernels compile-report [--backend mosaic_gpu|triton] [--case SUBSTRING]
      [--json] [--no-jax] [--arch sm_90a|sm_80]

`python -m pallas_kernels VERB --help` describes each. Exit status: 0 passed,
1 a case failed (validate) or a kernel does not fit (compile-report), 2 bad
flags or a machine that cannot do it (one line on stderr says why).
"""

import sys

from pallas_kernels._src.cli.main import run

if __name__ == "__main__":
  sys.exit(int(run()))
