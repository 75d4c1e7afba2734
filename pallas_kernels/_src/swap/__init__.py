"""Swap kernels into unmodified user code, and verify the swap.

`rewrite.swap(f)` traces `f`, finds the patterns of `patterns.REGISTRY` in
the flattened jaxpr (`program.py`; layer norm, RMS norm, softmax and
activations are recognised by probing, `probe.py`), asks each op's guard in a
dry run (`guard_check.py`) and evaluates the program under the caller's trace
with the kernels' public API at the replaced patterns; `report.SwapReport`
says what happened. The acceptance gate that audits a swap, `verify`, is in
`_src/audit/` with everything else that reads hlo_audit.

Why not `jax.experimental.pallas.fuser`: we evaluated `fusible`/`fuse`
(jax 0.10). `fuse(f)` hands a `@fusible` kernel the computation around its one
call site as `Fusion` objects that the kernel body evaluates per block (block
specs pulled through the surrounding ops). It could not serve here because:

* it needs the user's code to call a `fusible` (one per `fuse`d function): it
  fuses whatever surrounds an explicit kernel call, it does not find patterns
  (a dot_general + bias + gelu) in unmodified code;
* its kernels take arbitrary `Fusion`s evaluated inside the body with
  `pull_block_spec`/`push_block_spec` (TPU/Mosaic-oriented); our kernels take
  a fixed, validated, guarded set of epilogues and prologues as keyword
  arguments (bias=, activation=, residual=, ...), so we would still have to
  recognise the surrounding jaxpr as those keywords;
* `fusible_p` has no differentiation rule (`jax.grad` through it fails) and
  batches only a vmap of size 1; the kernels' custom VJPs and batching rules
  are what make `jax.grad`/`jax.vmap` work here;
* the output fusion is "the rest of the function": it cannot stop at an
  epilogue, and it rejects multiple fusibles per function.

What we do use from the same idea: a jaxpr walked equation by equation and
re-evaluated (as `jax.core.eval_jaxpr` does), `jax.extend.core.jaxprs_in_params`
for sub-jaxprs, and the public control-flow API (`lax.scan`, `while_loop`,
`switch`, `jax.checkpoint`) to rebuild bodies that changed.
"""
