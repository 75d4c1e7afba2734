"""The built-in example: a pre-norm transformer language model in plain JAX.

What `hlo-audit example` audits, for benchmarks and for trying the audit on a
program whose optimized HLO shows what XLA fuses and what it leaves
materialized (matmul epilogues, norm statistics, softmax, layout copies):

    import hlo_audit
    from hlo_audit import examples

    fn, args = examples.example(examples.TransformerConfig(layers=2))
    report = hlo_audit.audit(fn, *args)

`train_step` and `loss_fn` are the plain functions behind `example`, to jit
another way (e.g. `donate_argnums`); `init_params` makes concrete parameters
for running them; `data_parallel` shards the example's arguments over
devices, as `hlo-audit example --devices N` (or `--gpus N`) runs it.
"""

from hlo_audit._src.examples.transformer import TransformerConfig as TransformerConfig
from hlo_audit._src.examples.transformer import data_parallel as data_parallel
from hlo_audit._src.examples.transformer import example as example
from hlo_audit._src.examples.transformer import init_params as init_params
from hlo_audit._src.examples.transformer import loss_fn as loss_fn
from hlo_audit._src.examples.transformer import train_step as train_step
