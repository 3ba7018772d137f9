"""The engine comparison's accounting (`bwprune.vllm.running.compare`) on hand-made masks and
captures."""

import torch

from bwprune.vllm.running.compare import (
    Capture,
    Mask,
    Tally,
    TopK,
    chosen_by,
    compare_captures,
    compare_kept,
    compare_masks,
)


def mask(scores: list[list[float]], threshold: float = 1.0, keys=(0,)) -> Mask:
    s = torch.tensor(scores)
    return Mask(torch.tensor(keys), s, s > threshold, threshold)


def test_a_flip_within_the_engines_disagreement_is_a_near_tie():
    tally = Tally()
    compare_masks(mask([[0.999, 3.0]]), mask([[1.001, 3.0]]), tally)
    assert (tally.decisions, tally.differing, tally.differing_not_near_tie) == (2, 1, 0)


def test_a_flip_far_from_the_threshold_is_not_a_near_tie():
    """Equal scores, different decisions: no float disagreement explains the flip."""
    a, b = mask([[2.0, 3.0]]), mask([[2.0, 3.0]])
    b.keep = torch.tensor([[False, True]])
    tally = Tally()
    compare_masks(a, b, tally)
    assert (tally.differing, tally.differing_not_near_tie) == (1, 1)


def test_masks_of_other_tokens_differ_entirely():
    tally = Tally()
    compare_masks(mask([[2.0, 3.0]]), mask([[2.0, 3.0]], keys=(1,)), tally)
    assert (tally.decisions, tally.differing_not_near_tie) == (2, 2)


def test_captures_compare_kept_sets_and_logits():
    one = lambda: Capture(lambda s: s)  # noqa: E731
    a, b = one(), one()
    for c, kept in ((a, [0, 2]), (b, [0, 3])):
        c.forwards = [("prefill", 0), ("decode", 0)]
        c.kept = {(1, 0): torch.tensor(kept), (0, 0): None}
    a.logits[0, 0], b.logits[0, 0] = torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.5])
    tally = compare_captures(a, b)
    assert tally.same_forwards and (tally.decisions, tally.differing_not_near_tie) == (1, 1)
    assert tally.max_abs_logit_diff == 0.5 and tally.kl > 0


def test_the_float_disagreement_is_measured_up_to_the_first_flip():
    """What follows a flip disagrees by the flip's consequences, not by float error."""
    one = lambda: Capture(lambda s: s)  # noqa: E731
    a, b = one(), one()
    a.masks = {(0, 0, 0): mask([[2.0, 0.5]]), (0, 1, 0): mask([[1.0000001, 3.0]]),
               (0, 2, 0): mask([[2.0, 3.0]])}  # fmt: skip
    b.masks = {(0, 0, 0): mask([[2.0000002, 0.5]]), (0, 1, 0): mask([[0.9999999, 3.0]]),
               (0, 2, 0): mask([[4.0, 3.0]])}  # fmt: skip
    tally = compare_captures(a, b)
    assert tally.differing == 1 and tally.max_rel_score_diff == 2 / 3
    assert 0 < tally.float_disagreement < 1e-6


def top(scores: list[float], k: int, forward: int = 0) -> TopK:
    s = torch.tensor(scores)
    return TopK(forward, s, k, s.topk(k).indices.sort().values)


def test_kept_sets_parting_at_a_tie_on_the_boundary_are_a_near_tie():
    """Neurons 1 and 2 tie for the last kept place: either engine may keep either one."""
    a, b = top([3.0, 1.0, 1.0, 0.5], 2), top([3.0, 1.0, 1.0, 0.5], 2)
    tally = Tally()
    compare_kept(torch.tensor([0, 1]), torch.tensor([0, 2]), tally, a, b)
    assert (tally.decisions, tally.differing, tally.differing_not_near_tie) == (1, 1, 0)


def test_kept_sets_parting_within_the_float_disagreement_are_a_near_tie():
    a, b = top([3.0, 1.0000001, 1.0, 0.5], 2), top([3.0, 1.0, 1.0000001, 0.5], 2)
    tally = Tally()
    rel, differ = compare_kept(a.kept, b.kept, tally, a, b)
    assert differ and tally.differing_not_near_tie == 0 and 0 < rel < 1e-6


def test_kept_sets_parting_far_from_the_boundary_are_not_a_near_tie():
    """Equal scores, other sets: no tie and no float error explains it."""
    a = top([3.0, 2.0, 1.0, 0.5], 2)
    tally = Tally()
    compare_kept(a.kept, torch.tensor([0, 3]), tally, a, TopK(0, a.scores, 2, torch.tensor([0, 3])))
    assert tally.differing_not_near_tie == 1
    tally = Tally()
    compare_kept(a.kept, torch.tensor([0, 3]), tally)  # no top-k recorded: no margin
    assert tally.differing_not_near_tie == 1


def test_captures_find_the_top_k_each_kept_set_came_from():
    one = lambda: Capture(lambda s: s)  # noqa: E731
    a, b = one(), one()
    for c, t in ((a, top([3.0, 1.0, 1.0], 2)), (b, top([3.0, 1.0, 1.0], 2))):
        c.forwards = [("prefill", 0), ("decode", 0)]
        c.tops = [t]
    b.tops = [TopK(0, b.tops[0].scores, 2, torch.tensor([0, 2]))]
    a.kept = {(1, 0): a.tops[0].kept}
    b.kept = {(1, 0): b.tops[0].kept}
    tally = compare_captures(a, b)
    assert (tally.differing, tally.differing_not_near_tie) == (1, 0)
    assert chosen_by(a.tops, 0, torch.tensor([0, 2])) is None
