"""`KeptSlots`: each slot holds one kept neuron, a new kept set moves only the neurons that
changed, and the plain and packed slot weights hold exactly the weights of the slots' neurons."""

import pytest
import torch

from bwprune.models.kept_slots import EMPTY, KeptSlots, capacity
from bwprune.models.sliced_mlp import KeptWeights, neuron_rows


def random_sets(d_ff: int, sizes: list[int], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(d_ff, generator=g)[:k] for k in sizes]


@pytest.mark.parametrize("align", [1, 32])
def test_slots_hold_exactly_the_kept_set_and_move_only_what_changed(align):
    d_ff = 200
    slots = KeptSlots(d_ff, align)
    previous: set[int] = set()
    # sizes within one capacity (align 32: 40..64 share 64 slots) and across capacities
    for index in random_sets(d_ff, [50, 50, 41, 60, 50, 64, 90, 90, 33]):
        writes = slots.assign(index)
        held = slots.slots
        assert len(held) == capacity(len(index), align)
        assert set(held[held >= 0].tolist()) == set(index.tolist())
        assert int((held == EMPTY).sum()) == len(held) - len(index)
        if not writes.refill:
            entered = set(index.tolist()) - previous
            assert writes.entered == len(entered)
            assert set(writes.neurons[writes.neurons >= 0].tolist()) == entered
            left = len(previous - set(index.tolist()))
            assert len(writes) == max(len(entered), left)  # nothing else is written
        previous = set(index.tolist())


def test_growing_slots_keep_their_capacity_for_smaller_sets():
    """A tensor-parallel rank's share of a global kept set moves with each refresh: with `grow`,
    only a set larger than every one before refills, and a smaller one moves only what changed
    into the same slots (empty slots hold zeros)."""
    slots = KeptSlots(200, 8, grow=True)
    sizes = [30, 20, 25, 12, 0, 40, 33]
    expected = [32, 32, 32, 32, 32, 40, 40]
    refills = [True, False, False, False, False, True, False]
    for index, cap, refill in zip(random_sets(200, sizes), expected, refills):
        writes = slots.assign(index)
        assert (slots.capacity, writes.refill) == (cap, refill)
        held = slots.slots
        assert set(held[held >= 0].tolist()) == set(index.tolist())
    fixed = KeptSlots(200, 8)
    fixed.assign(random_sets(200, [30])[0])
    assert fixed.assign(random_sets(200, [12])[0]).refill  # without `grow`: a smaller capacity


def test_plain_weights_follow_the_slots():
    d_ff, hidden = 64, 8
    gate, up, down = torch.randn(d_ff, hidden), torch.randn(d_ff, hidden), torch.randn(hidden, d_ff)
    slots = KeptSlots(d_ff, 8)
    weights = None
    for index in random_sets(d_ff, [20, 20, 18, 24, 20]):
        writes = slots.assign(index)
        if writes.refill:
            weights = KeptWeights(
                gate, up, neuron_rows(down), (None, None, None), lambda t: t, slots.capacity
            )
        weights.write(writes)
        held = slots.slots
        live = held >= 0
        c = slots.capacity
        assert torch.equal(weights.gate_up[:c][live], gate[held[live]])
        assert torch.equal(weights.gate_up[c:][live], up[held[live]])
        assert torch.equal(weights.down_rows[live], down[:, held[live]].T)
        assert not weights.gate_up[:c][~live].any() and not weights.down_rows[~live].any()
