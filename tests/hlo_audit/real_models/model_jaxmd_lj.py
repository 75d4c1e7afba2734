"""jax-md Lennard-Jones simulation, as jax-md's README and notebooks write it:
a periodic box (`space.periodic`), `energy.lennard_jones_neighbor_list` (an
ordered-sparse neighbor list from `partition.neighbor_list`, rebuilt through
a cell list when particles moved past the skin and pruned with `jnp.cumsum`),
`simulate.nve` (velocity Verlet), a few steps under `lax.fori_loop`, jitted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax_md import energy, partition, quantity, simulate, space

N, DIM, DENSITY, DT, STEPS = 1000, 2, 0.8, 1e-3, 10
BOX = quantity.box_size_at_number_density(N, DENSITY, DIM)

displacement, shift = space.periodic(BOX)  # <space>
neighbor_fn, energy_fn = energy.lennard_jones_neighbor_list(displacement, BOX)  # <lj>
init_fn, apply_fn = simulate.nve(energy_fn, shift, DT)  # <nve>


def simulation(state, nbrs):
  def step(i, state_and_nbrs):
    state, nbrs = state_and_nbrs
    nbrs = nbrs.update(state.position)  # <update>
    return apply_fn(state, neighbor=nbrs), nbrs  # <apply>
  return lax.fori_loop(0, STEPS, step, (state, nbrs))  # <loop>


def build():
  key = jax.random.key(0)
  position = jax.random.uniform(key, (N, DIM), maxval=BOX)
  nbrs = neighbor_fn.allocate(position)
  state = init_fn(key, position, kT=1e-3, neighbor=nbrs)
  return jax.jit(simulation), (state, nbrs)


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2 and 0.12: the same
# kernels; jax 0.10.2 attributes a few instructions of the rebuild to the
# fori_loop's line, hence no marker on those). One while loop (10 trips)
# carries the state and the neighbor list. Each trip: the displacement of
# every particle since the last rebuild, squared and summed (a reduce over
# the 2 coordinates), compared with the skin, OR-reduced over the particles
# (a 1000 -> 32 reduce-window, then a reduce) to choose the conditional's
# branch. The rebuild branch builds the cell list (cell coordinates, their
# hashes as products with [1, 11] summed over the 2 axes, a sort by cell, a
# scatter-add counting each cell's particles and a max over those counts, two
# scatters writing the cells' particles) and prunes the 9 neighboring cells'
# candidates (1000 x 162 = 162000 pairs): their squared distance (a reduce
# over the coordinates), the mask, its `jnp.cumsum` (XLA's prefix sum in
# base-16 reduce-window stages: [10125,16], [633,16], [40,16], [3,16],
# [4,1], and a kernel adding the block offsets back), and two scatters of
# the kept pairs into fill-1000 arrays sliced to the capacity [2,14031].
# Then nve's step: the pairs' displacements, distances and Lennard-Jones
# forces, scatter-added per particle from two copies of one zero broadcast.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

_CANDIDATES = "s32[162000]"  # 1000 particles x 9 cells x 18 per cell
_XY = f"f32[{N},{DIM}]"

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _CANDIDATES, None, says="same-layout copy", count=2,
               why=("copy.6, copy.7: the rebuild copies one fill-1000 broadcast into "
                    "each of the two scatters' destinations (receivers and senders)")),
        Expect(K.STANDALONE_COPY, _XY, None, says="same-layout copy", count=2, why=(
            "copy.15, copy.16: nve's force copies one zero broadcast into each "
            "of the two scatter-adds' destinations (each pair's force on i, on j)")),
        Expect(K.STANDALONE_COPY, _XY, None, says="loop-carry copy", why=(
            "copy.25: the position carried into the body is copied at its top: "
            "the update writes the new position while the displacement check and "
            "the rebuild still read the old one")),
        Expect(K.STANDALONE_COPY, _XY, None, says="loop-init copy", count=4, why=(
            "copy.38-40, copy.42: position, momentum, force and the neighbor "
            "list's reference position, arguments not donated, copied into the "
            "loop's initial state the body overwrites")),
        Expect(K.STANDALONE_COPY, "s32[2,14031]", None, says="loop-init copy", why=(
            "copy.41: the neighbor list's indices (not donated) copied into the "
            "loop's initial state")),
        Expect(K.STANDALONE_COPY, _XY, None, why=(
            "copy.13: the rebuild branch returns the position as the new "
            "reference position, copied into the conditional's result (a copy "
            "kernel like the others, when the list is rebuilt)")),
        Expect(K.EXPANDED_BROADCAST, _CANDIDATES, "update", why=(
            "wrapped_broadcast.1: the fill value written as 162000 elements only "
            "for the two copies that become the scatters' destinations (each "
            "could be written by a broadcast of its own)")),
        Expect(K.EXPANDED_BROADCAST, _XY, "apply", why=(
            "wrapped_broadcast: zeros written only for the two copies that become "
            "the force scatter-adds' destinations")),
        Expect(K.EXPANDED_BROADCAST, f"s32[{N},1]", None, why=(
            "wrapped_broadcast.5: the ones the cell-count scatter-add adds, "
            "written as 1000 elements for its updates operand")),
        Expect(K.SEPARATE_REDUCTION, "f32[162000,2]", "update", why=(
            "add_select_fusion: the candidates' periodic displacements written "
            "only for ynn_fusion, which squares and sums them over the 2 "
            "coordinates")),
        Expect(K.SEPARATE_REDUCTION, "f32[14031,2]", "apply", why=(
            "broadcast_add_fusion: the pairs' displacements written only for "
            "ynn_fusion.1, which squares and sums them over the coordinates")),
        Expect(K.SEPARATE_REDUCTION, f"s32[{N},2]", "update", says="contraction", why=(
            "broadcast_remainder_fusion: the particles' cell coordinates written "
            "for the two hashes, each a product with [1, 11] summed over the 2 "
            "axes (multiply_reduce_fusion, .1)")),
        Expect(K.SEPARATE_REDUCTION, f"pred[{N}]", "update", why=(
            "broadcast_compare_fusion: which particles moved past the skin, "
            "written only for the OR over the particles (a 1000 -> 32 "
            "reduce-window, then a reduce)")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "state and the neighbor list are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("jnp.cumsum's first stage is a prefix sum within blocks of 16 "
                   "(reduce-window size 16, padding 15_0: one output per input), "
                   "not a per-row reduction the mask's kernel could compute",
                   kind=K.SEPARATE_REDUCTION, shape="s32[10125,16]"),
        NotFlagged("jnp.cumsum's second stage: a prefix sum of the blocks' totals, "
                   "not a reduction", kind=K.SEPARATE_REDUCTION, shape="s32[633,16]"),
        NotFlagged("jnp.cumsum's third stage: a prefix sum, not a reduction",
                   kind=K.SEPARATE_REDUCTION, shape="s32[40,16]"),
        NotFlagged("jnp.cumsum's fourth stage: a prefix sum, not a reduction",
                   kind=K.SEPARATE_REDUCTION, shape="s32[3,16]"),
        NotFlagged("copy.42 is the loop-init copy of the reference position; its "
                   "reader, broadcast_compare_fusion, sits in the while body and "
                   "reads the carried state each trip (what the rebuild returned "
                   "since), which the copy before the loop cannot reduce",
                   kind=K.SEPARATE_REDUCTION, shape=_XY),
        NotFlagged("the cell counts are a scatter-add's result, final only after its "
                   "last update: no pass of the scatter can reduce them (their max "
                   "over the cells)", kind=K.SEPARATE_REDUCTION, shape="s32[121]"),
        NotFlagged("no norm, softmax or attention here", says="norm"),
        NotFlagged("no dot anywhere: nothing is a matmul's epilogue or prologue",
                   kind=K.UNFUSED_EPILOGUE),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/jaxmd_lj.hlo.gz, jax
# 0.12). The same loop, fused further: the skin check is one kernel (the
# distances and the OR over the particles); the rebuild hashes the cells in a
# Triton reduce, sorts, scatters the cell list, gathers the 162000
# candidates' distances (one reduce over the coordinates), writes the
# pruning mask pred[1000,162] and runs `jnp.cumsum` as two reduce-window
# kernels ([10125,16] and [633,16] in one, [40,16] and [3,16] in the other)
# whose stages each scatter and the overflow check recompute from the mask.
# The step gathers the pairs' displacements once; each of the two force
# scatter-adds computes distances and forces from them. Copies: one zero
# broadcast (the second output of the position update's fusion) copied for
# one scatter-add's destination, the old position copied at the body's top,
# the new force and the reference position copied into the carry at its
# end, and the no-rebuild branch copying the reference position.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _CANDIDATES, None, says="same-layout copy", why=(
            "copy.3: the fill-1000 broadcast copied for one scatter's destination "
            "(the other scatter writes into the broadcast itself)")),
        Expect(K.STANDALONE_COPY, "s32[2,14031]", None, says="loop-init copy", why=(
            "copy.45: the neighbor list's indices (not donated) copied into the "
            "loop's initial state")),
        Expect(K.STANDALONE_COPY, _XY, None, says="loop-init copy", count=4, why=(
            "copy.42-44, copy.46: position, momentum, force and the reference "
            "position (not donated) copied into the loop's initial state")),
        Expect(K.STANDALONE_COPY, _XY, None, says="loop-carry copy (body entry)", why=(
            "copy.21: the old position copied at the body's top (the update "
            "writes the new one while the skin check and the rebuild read it)")),
        Expect(K.STANDALONE_COPY, _XY, None, says="loop-carry copy (body exit)", count=2,
               why=("copy.30, copy.32: the new force (loop_add_fusion's second "
                    "output) and the conditional's reference position copied into "
                    "the loop state at the end of the body, every trip")),
        Expect(K.STANDALONE_COPY, _XY, None, says="same-layout copy", why=(
            "copy.12: the zero broadcast copied for input_scatter_fusion.5's "
            "destination (input_scatter_fusion.6 writes into the broadcast)")),
        Expect(K.STANDALONE_COPY, _XY, None, why=(
            "copy.9: the no-rebuild branch copies the reference position into "
            "the conditional's result, every trip it skips the rebuild")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "state and the neighbor list are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the pruning mask feeds jnp.cumsum: loop_reduce_window_fusion.1 "
                   "and the scatters' recomputed stages are prefix sums (reduce-"
                   "window size 16, padding 15_0), not per-row reductions the "
                   "mask's kernel could compute", kind=K.SEPARATE_REDUCTION,
                   shape=f"pred[{N},162]"),
        NotFlagged("jnp.cumsum's first two stages: block prefix sums read by the "
                   "next stages, not a reduction", kind=K.SEPARATE_REDUCTION,
                   shape="s32[633,16]"),
        NotFlagged("jnp.cumsum's last stages: the prefix sum of 3 block totals "
                   "(reduce-window size 3, padding 3_0), not a sum over a batch",
                   kind=K.SEPARATE_REDUCTION, shape="s32[3,16]"),
        NotFlagged("jnp.cumsum's stages are prefix sums, not reductions",
                   kind=K.SEPARATE_REDUCTION, shape="s32[10125,16]"),
        NotFlagged("jnp.cumsum's stages are prefix sums, not reductions",
                   kind=K.SEPARATE_REDUCTION, shape="s32[40,16]"),
        NotFlagged("the 9 neighboring cells' hashes are gather indices: "
                   "input_reduce_fusion sums the squared displacements to the "
                   "candidates it gathers with them, not the hashes",
                   kind=K.SEPARATE_REDUCTION, shape=f"s32[{N},9]"),
        NotFlagged("the cell list is a scatter's result that input_reduce_fusion "
                   "gathers (each cell's 18 slots for the 9 cells around every "
                   "particle): the scatter cannot compute the distances it "
                   "gathers", kind=K.SEPARATE_REDUCTION, shape="f32[2178,2]"),
        NotFlagged("loop_broadcast_select_fusion's second output is zeros (the "
                   "force scatter-add's destination); the skin check reads it only "
                   "as the 0 its compares test, and sums nothing over the "
                   "particles of it", kind=K.SEPARATE_REDUCTION, shape=_XY),
        NotFlagged("the cell counts are a scatter-add's result, final only after "
                   "its last update: the scatter cannot reduce them (their max)",
                   kind=K.SEPARATE_REDUCTION, shape="s32[121]"),
        NotFlagged("no norm, softmax or attention here", says="norm"),
    ),
)
