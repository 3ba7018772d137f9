"""Methods in a stream (continuous batching): entering prompts, memory policies, Griffin's slots.

Forwards are real tiny-model forwards over random ids, driven through `MethodDriver` as the runner
drives them: `start` + `prefill`, `decode` steps over every slot, `leave` / `enter` for rows that
finish and rows that take their slots.
"""

from __future__ import annotations

import pytest
import torch

from baselines.griffin import Griffin
from bwprune.errors import UserError
from bwprune.methods.base import RowsEntered, RowsGathered, Tokens
from bwprune.methods.neuron_scores import aggregate, topk_index, unit_sq
from bwprune.methods.neuron_set import PhaseScores
from bwprune.methods.ours import Ours
from tests.conftest import method_from_conf, prepared, tiny_model

PROMPT = 6  # prompt tokens of every row


class Stream:
    """One method on tiny_llama under a `MethodDriver`; `with Stream(m) as s:` attaches it."""

    def __init__(self, method, batch: int = 3) -> None:
        self.model, tok = tiny_model("tiny_llama")
        self.driver = prepared(method, self.model, tok)
        self.method, self.batch = method, batch
        self.hooks = self.driver.attached()
        self.finished = torch.zeros(batch, dtype=torch.bool)
        self.step = 0
        self.dense_forwards: list[bool] = []  # was every layer dense while each forward ran?

    def __enter__(self) -> Stream:
        self.hooks.__enter__()
        self.driver.start(self.batch)
        self.driver.prefill(torch.ones(self.batch, PROMPT, dtype=torch.bool), self._run(self.batch))
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    def _run(self, rows: int, length: int = PROMPT):
        ids = torch.randint(0, self.model.config.vocab_size, (rows, length))

        @torch.no_grad()
        def forward(*_):
            self.dense_forwards.append(all(s.index is None for s in self.driver.host.sliced))
            return self.model(input_ids=ids)

        return forward

    def decode(self, steps: int = 1) -> None:
        for _ in range(steps):
            self.driver.decode(self.step, self.finished.clone(), self._run(self.batch, 1))
            self.step += 1

    def leave(self, *slots: int) -> None:
        self.driver.leave(torch.tensor(slots))
        self.finished[list(slots)] = True

    def enter(self, *slots: int) -> None:
        valid = torch.ones(len(slots), PROMPT, dtype=torch.bool)
        self.driver.enter(torch.tensor(slots), valid, self._run(len(slots)))
        self.finished[list(slots)] = False


def kept(method) -> list[torch.Tensor | None]:
    return [None if k is None else k.clone() for k in method.kept]


def same_kept(a, b) -> bool:
    return all(x is y or (x is not None and torch.equal(x, y)) for x, y in zip(a, b))


def masked_from(method, memory) -> bool:
    """The kept sets are the top-k of `memory` (Eq. 4)."""
    return all(torch.equal(n, topk_index(m, k)) for n, m, k in zip(kept(method), memory, method.k))


class Seen:
    """Mixin: what the kept sets, `_ffn_sparsity` and open phase were when `prompts_entered` ran."""

    def prompts_entered(self, slots, scores):
        self.seen = (kept(self), self._ffn_sparsity, self.phase, scores)
        super().prompts_entered(slots, scores)


class SeenOurs(Seen, Ours):
    pass


class SeenGriffin(Seen, Griffin):
    pass


class Logged(Ours):
    """Ours logging every absorbed phase: (memory before, s̄ computed here, memory after)."""

    def start(self, batch_size):
        super().start(batch_size)
        self.absorbed = []

    def _absorb(self, phase):
        before = [None if m is None else m.clone() for m in self.memory]
        super()._absorb(phase)
        if phase.observed:
            score = [aggregate(phase.scores(i), phase.rows, self.aggregate) for i in range(2)]
            self.absorbed.append((before, score, [m.clone() for m in self.memory]))


def logged(**args) -> Logged:
    return method_from_conf("ours", cls=Logged, sparsity=0.5, **args)


# -- the entering prefill (NeuronSetMethod) --------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "cls", "args"),
    [("ours", SeenOurs, dict(t_init=2, t_explore=2, t_prune=3)), ("griffin", SeenGriffin, {})],
    ids=["ours", "griffin"],
)
def test_entering_prompts_run_dense_and_find_the_kept_sets_as_they_were(name, cls, args):
    method = method_from_conf(name, cls=cls, sparsity=0.5, **args)
    with Stream(method) as s:
        s.decode(3)  # ours: steps 0, 1 dense, step 2 sparse; griffin: sparse from step 0
        before, sparsity = kept(method), method._ffn_sparsity.clone()
        assert all(k is not None for k in before)
        s.leave(1)
        s.enter(1)
    assert s.dense_forwards[-1] and not s.dense_forwards[-2]  # the entering forward ran dense
    seen_kept, seen_sparsity, _, scores = method.seen
    assert same_kept(seen_kept, before)
    assert torch.equal(seen_sparsity, sparsity)
    assert scores.count[0].tolist() == [0, PROMPT, 0]  # one row: the entering prompt alone


def test_entering_prompts_leave_the_open_phase_alone():
    """The open phase only sees its slot handed over (`follow`), never the entering prompt."""
    method = method_from_conf("ours", cls=SeenOurs, sparsity=0.5, t_init=4)
    with Stream(method) as s:
        s.decode(2)  # inside the t_init window: a phase is open, no mask
        phase = method.phase
        before = [phase.scores(i).clone() for i in range(2)]
        count = phase.count[0].clone()
        s.leave(1)
        s.enter(1)
        assert method.phase is phase and method.seen[2] is phase
        assert phase.count[0].tolist() == [count[0], 0, count[2]]
        for i in range(2):
            kept_rows = before[i][[0, 2]]
            after = phase.scores(i)  # the old occupant of slot 1 first, then the 3 slots
            torch.testing.assert_close(after[0], before[i][1])
            torch.testing.assert_close(after[[1, 3]], kept_rows)
            assert not after[2].any()  # the new occupant starts from zero


def test_entering_sets_the_old_occupant_aside_like_a_row_that_left():
    phase = PhaseScores([8], 3)
    phase.follow(RowsEntered(torch.tensor([0])))  # nothing observed yet: no-op
    assert not phase.observed
    z = torch.rand(12, 8)  # 3 rows of 4 tokens, flat
    tokens = Tokens(torch.arange(3).repeat_interleave(4), torch.ones(12, dtype=torch.bool))
    phase.add(0, z, tokens)
    gathered = PhaseScores([8], 3)
    gathered.add(0, z, tokens)
    phase.follow(RowsEntered(torch.tensor([1])))
    gathered.follow(RowsGathered(torch.tensor([0, 2])))
    torch.testing.assert_close(phase.scores(0)[[0, 1, 3]], gathered.scores(0))
    assert phase.rows.tolist() == [True, True, False, True]
    score, observed = phase.slot_scores(0)  # the slots now: the old occupant is not there
    torch.testing.assert_close(score, phase.scores(0)[1:])
    assert observed.tolist() == [True, False, True]


# -- memory policies ------------------------------------------------------------------------------
def run_static(method, steps: int = 24) -> list:
    with Stream(method) as s:
        s.decode(steps)
    return method.absorbed


def test_default_memory_is_the_running_max_of_the_phase_scores():
    """Static batch, paper defaults: m after each phase is the max of every s̄ so far."""
    absorbed = run_static(logged(t_init=2, t_explore=2, t_prune=2))
    assert len(absorbed) >= 5
    running = absorbed[0][1]
    for _, score, after in absorbed:
        running = [torch.maximum(r, s) for r, s in zip(running, score)]
        assert all(torch.equal(a, r) for a, r in zip(after, running))


def test_decay_fades_the_old_memory():
    absorbed = run_static(logged(t_init=2, t_explore=2, t_prune=2, memory_policy="decay",
                                 memory_decay=0.5))  # fmt: skip
    for before, score, after in absorbed[1:]:
        expected = [torch.maximum(0.5 * b, s) for b, s in zip(before, score)]
        assert all(torch.equal(a, e) for a, e in zip(after, expected))
    assert any(  # the fading mattered: a plain max would have kept more
        not torch.equal(a, torch.maximum(b, s))
        for before, score, after in absorbed[1:]
        for a, b, s in zip(after, before, score)
    )


def test_window_remembers_the_last_phases_only():
    absorbed = run_static(logged(t_init=2, t_explore=2, t_prune=2, memory_policy="window",
                                 memory_window=2))  # fmt: skip
    scores = [score for _, score, _ in absorbed]
    forgot = False
    for n, (_, _, after) in enumerate(absorbed):
        last = scores[max(0, n - 1) : n + 1]
        expected = [torch.stack([s[i] for s in last]).amax(dim=0) for i in range(2)]
        assert all(torch.equal(a, e) for a, e in zip(after, expected)), n
        everything = [torch.stack([s[i] for s in scores[: n + 1]]).amax(dim=0) for i in range(2)]
        forgot |= not all(torch.equal(a, e) for a, e in zip(after, everything))
    assert forgot  # some phase older than the window held a larger score


def test_reset_clears_once_every_original_row_has_left_not_before():
    method = logged(t_init=2, t_explore=2, t_prune=2, memory_policy="reset")
    with Stream(method) as s:
        s.decode(3)  # a mask is in force from step 2
        s.leave(2)  # slot 2 stays empty from now on
        s.leave(0)
        s.enter(0)  # row 1 of the first batch is still there: plain max
        before, score, after = method.absorbed[-1]
        assert all(torch.equal(a, torch.maximum(b, x)) for a, b, x in zip(after, before, score))
        s.decode(2)
        s.leave(1)
        memory = [m.clone() for m in method.memory]
        s.decode(1)  # no phase ends: the memory waits for the next one
        assert all(torch.equal(a, b) for a, b in zip(method.memory, memory))
        s.enter(1)  # the last original row has left: m restarts from this phase
        _, score, after = method.absorbed[-1]
        assert all(torch.equal(a, x) for a, x in zip(after, score))
        s.leave(1)
        s.enter(1)  # slot 0's row arrived before the clearing and is still there: max again
        before, score, after = method.absorbed[-1]
        assert all(torch.equal(a, torch.maximum(b, x)) for a, b, x in zip(after, before, score))


def test_reset_never_fires_in_a_static_batch():
    """Rows finishing or compacted away in a static batch are not a renewed batch."""

    def memories(policy):
        method = logged(t_init=2, t_explore=2, t_prune=2, memory_policy=policy)
        torch.manual_seed(1)
        with Stream(method) as s:
            s.decode(5)
            s.finished[0] = True
            s.decode(5)
            s.driver.keep_rows(torch.tensor([1, 2]))
            s.finished = s.finished[[1, 2]]
            s.batch = 2
            s.decode(10)
        return [after for _, _, after in method.absorbed]

    for a, b in zip(memories("max"), memories("reset"), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


# -- memory_policy=request -------------------------------------------------------------------------
class Masks(Ours):
    """Ours logging the kept sets of every decode step."""

    def start(self, batch_size):
        super().start(batch_size)
        self.masks = []

    def before_forward(self, ctx):
        super().before_forward(ctx)
        self.masks.append(kept(self))


class RowsLogged(Ours):
    """Ours logging every absorbed phase's per-slot scores and which slots observed it."""

    def start(self, batch_size):
        super().start(batch_size)
        self.rows_absorbed = []

    def _absorb(self, phase):
        if phase.observed:
            self.rows_absorbed.append([phase.slot_scores(i) for i in range(2)])
        super()._absorb(phase)


NEURONS = torch.arange(0, 128, 16)  # 8 of tiny_llama's 128 FFN neurons per layer


class SlotZeroNeurons:
    """Pre-hooks on tiny_llama's down projections (dense forwards only: a sparse one computes
    from sliced weights): `NEURONS` fire, huge, for the row in slot 0 while `on`, so they top
    its Eq. 2 scores, and never for any other row."""

    def __init__(self, model, batch: int) -> None:
        self.on, self.batch = True, batch
        self.handles = [layer.mlp.down_proj.register_forward_pre_hook(self._hook)
                        for layer in model.model.layers]  # fmt: skip

    def _hook(self, module, args):
        z = args[0].clone()  # (rows, T, D)
        z[..., NEURONS] = 0
        if self.on and z.shape[0] == self.batch:  # every slot's forward, not an entering prefill
            z[0, :, NEURONS] = 10 * z.abs().amax()
        return (z, *args[1:])

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def test_request_is_max_in_a_static_batch_where_no_row_finishes():
    """Max over rows of each row's running max = running max of the max over rows."""

    def masks(policy):
        method = method_from_conf("ours", cls=Masks, sparsity=0.5, t_init=2, t_explore=2,
                                  t_prune=2, memory_policy=policy)  # fmt: skip
        stream = Stream(method)  # loading the model (the first time) seeds torch
        torch.manual_seed(2)  # the same ids in both streams
        with stream as s:
            s.decode(24)
        return method.masks

    request, paper = masks("request"), masks("max")
    sparse = [k[0] for k in paper if k[0] is not None]
    assert len(sparse) == 12 and len({tuple(k.tolist()) for k in sparse}) > 1  # masks moved
    assert all(same_kept(a, b) for a, b in zip(request, paper, strict=True))


@pytest.mark.parametrize("policy", ["request", "max"])
@pytest.mark.parametrize("departure", ["leave", "replace", "finish"])
def test_request_lets_a_departed_row_take_its_neurons_with_it(policy, departure):
    """The row in slot 0 alone fires `NEURONS`; it goes in the middle of an exploration window
    (its slot left empty, taken by a new row, or its row finished in a static batch). At the
    next refresh `request` keeps none of them, while `max` remembers them."""
    method = method_from_conf("ours", sparsity=0.5, t_init=2, t_explore=2, t_prune=2,
                              memory_policy=policy)  # fmt: skip
    stream = Stream(method)
    fires = SlotZeroNeurons(stream.model, stream.batch)
    try:
        with stream as s:
            s.decode(3)  # step 2: the first mask
            assert all(bool(torch.isin(NEURONS, k).all()) for k in kept(method))
            s.decode(2)  # step 4 opens an exploration window, which slot 0's row observes
            fires.on = False
            if departure == "finish":
                s.finished[0] = True
            else:
                s.leave(0)
                if departure == "replace":
                    s.enter(0)
            s.decode(3)  # step 6 closes the window: a fresh mask
    finally:
        fires.remove()
    forced = [int(torch.isin(NEURONS, k).sum()) for k in kept(method)]
    assert forced == ([0, 0] if policy == "request" else [len(NEURONS)] * 2)


@pytest.mark.parametrize(("how", "memory"), [("mean", True), ("max", False)])
def test_request_masks_from_the_rows_own_memories_aggregated_over_the_live_rows(how, memory):
    """m_i <- max(m_i, s_i) (memory=false: s_i) for the rows that observed a phase; the mask is
    the top-k of Eq. 3 over the rows still running (row 2 finishes before the last refresh)."""
    method = method_from_conf("ours", cls=RowsLogged, sparsity=0.5, t_init=2, t_explore=2,
                              t_prune=2, memory_policy="request", aggregate=how,
                              memory=memory)  # fmt: skip
    with Stream(method) as s:
        s.decode(5)
        s.finished[2] = True  # in the exploration window of steps 4, 5: observed step 4 only
        s.decode(2)  # step 6: the window enters the memories, then the mask
    expected = [torch.zeros(3, d) for d in method.shape.d_ff]
    for scores in method.rows_absorbed:  # prompts, t_init window, first exploration window
        for layer, (score, observed) in enumerate(scores):
            new = torch.maximum(expected[layer], score) if memory else score
            expected[layer] = torch.where(observed[:, None], new, expected[layer])
    assert len(method.rows_absorbed) == 3
    assert all(torch.equal(m, e) for m, e in zip(method.slot_state["memory"], expected))
    live = torch.tensor([True, True, False])
    assert masked_from(method, [aggregate(e, live, how) for e in expected])


def test_request_entering_prompts_enter_their_own_rows_memories_alone():
    """An entering prompt is the entering row's first m_i; the other rows did not observe that
    phase, so theirs stay (memory=false would otherwise set them to the phase's zero scores),
    and the mask in force is refreshed from them all."""
    method = method_from_conf("ours", sparsity=0.5, t_init=2, t_explore=2, t_prune=2,
                              memory_policy="request", memory=False)  # fmt: skip
    with Stream(method) as s:
        s.decode(3)  # step 2: the first mask
        before = [m.clone() for m in method.slot_state["memory"]]
        s.leave(1)
        s.enter(1)
    after = method.slot_state["memory"]
    for b, a in zip(before, after, strict=True):
        assert torch.equal(a[[0, 2]], b[[0, 2]])
        assert a[1].all() and not torch.equal(a[1], b[1])
    every = torch.ones(3, dtype=torch.bool)
    assert masked_from(method, [aggregate(a, every, "max") for a in after])


# -- on_enter -------------------------------------------------------------------------------------
def test_on_enter_prompt_refreshes_a_mask_in_force_at_once():
    method = logged(t_init=2, t_explore=2, t_prune=4)
    with Stream(method) as s:
        s.decode(3)  # step 2: the first mask
        old = kept(method)
        s.leave(2)
        s.enter(2)
        before, score, after = method.absorbed[-1]
        assert all(torch.equal(a, torch.maximum(b, x)) for a, b, x in zip(after, before, score))
        new = kept(method)
        assert not same_kept(new, old)  # the entering prompt changed the top-k
        assert masked_from(method, after)
        s.decode(1)
    assert s.dense_forwards[-1] is False  # no dense step added


def test_on_enter_defer_keeps_the_mask_until_the_next_scheduled_refresh():
    """The entering prompt enters the memory at once, as `prompt`'s does, but the mask in force
    stays until the exploration window that follows ends, and is then chosen from that memory."""
    method = logged(t_init=2, t_explore=2, t_prune=4, on_enter="defer")
    with Stream(method) as s:
        s.decode(3)  # step 2: the first mask
        old = kept(method)
        s.leave(2)
        s.enter(2)
        entered = method.absorbed[-1][2]
        assert same_kept(kept(method), old)  # no refresh at the entry
        s.decode(3)  # steps 3-5: sparse; the mask still the old one
        assert same_kept(kept(method), old)
        s.decode(3)  # steps 6-7 explore, step 8 closes the window: the memory's top-k
        before, _, after = method.absorbed[-1]
        assert all(torch.equal(torch.maximum(b, e), b) for b, e in zip(before, entered))
        assert masked_from(method, after)


def test_on_enter_prompt_in_the_initial_window_carries_into_the_first_mask():
    method = logged(t_init=4, t_explore=2, t_prune=4)
    with Stream(method) as s:
        s.decode(2)
        s.leave(0)
        s.enter(0)
        assert all(k is None for k in kept(method))  # still no mask
        entered = method.absorbed[-1][2]
        s.decode(3)  # step 4 absorbs the t_init phase into that memory, then masks
        before, _, after = method.absorbed[-1]
        assert all(torch.equal(b, e) for b, e in zip(before, entered))
        assert masked_from(method, after)


def test_on_enter_explore_restarts_the_schedule_from_the_entry():
    t_init, t_explore, t_prune = 3, 2, 4
    method = method_from_conf("ours", sparsity=0.5, t_init=t_init, t_explore=t_explore,
                              t_prune=t_prune, on_enter="explore")  # fmt: skip
    with Stream(method) as s:
        s.decode(5)  # steps 3, 4 sparse
        s.leave(1)
        s.enter(1)
        assert method.phase is None  # the prompts were absorbed; nothing observed since
        mark = len(s.dense_forwards)
        s.decode(t_init + t_prune + t_explore + 1)
    dense = s.dense_forwards[mark:]
    expected = [True] * t_init + [False] * t_prune + [True] * t_explore + [False]
    assert dense == expected


def test_on_enter_explore_observes_its_window_and_masks_from_it():
    method = logged(t_init=2, t_explore=2, t_prune=4, on_enter="explore")
    with Stream(method) as s:
        s.decode(3)
        s.leave(0)
        s.enter(0)
        s.decode(1)
        assert method.phase is not None and method.phase.count[0].tolist() == [1, 1, 1]
        s.decode(2)  # the window of 2 ends: absorbed, then the mask
    _, _, after = method.absorbed[-1]
    assert masked_from(method, after)


# -- griffin ---------------------------------------------------------------------------------------
def test_griffin_reselects_from_the_prompts_of_the_rows_in_the_batch():
    model, _ = tiny_model("tiny_llama")
    prompts = []  # per forward: layer 0's Z, (rows, T, D)
    handle = model.model.layers[0].mlp.down_proj.register_forward_pre_hook(
        lambda m, a: prompts.append(a[0].detach()) if a[0].shape[1] > 1 else None
    )
    method = method_from_conf("griffin", sparsity=0.5)
    try:
        with Stream(method) as s:
            s.decode(2)
            s.leave(0, 1)
            s.enter(1)  # slot 0 stays empty: its row no longer counts
    finally:
        handle.remove()
    first, entered = prompts

    def score(z):  # GRIFFIN's s_j per row
        return (z / z.norm(dim=-1, keepdim=True)).norm(dim=1)

    rows = torch.stack([score(entered)[0], score(first)[2]])
    expected = topk_index(rows.mean(dim=0), method.k[0])
    assert torch.equal(method.kept[0], expected)
    with_left = torch.cat([score(first)[:1], rows]).mean(dim=0)
    assert not torch.equal(topk_index(with_left, method.k[0]), expected)


# -- arguments -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(memory_policy="lru"),
            r"memory_policy='lru' .* \['decay', 'max', 'request', 'reset', 'window'\]",
        ),
        (
            dict(on_enter="skip"),
            r"on_enter='skip' is not valid; choose one of \['defer', 'explore', 'prompt'\]",
        ),
        (dict(memory_decay=0.0), r"memory_decay=0.0 is outside \(0, 1\]"),
        (dict(memory_decay=1.5), r"memory_decay=1.5 is outside \(0, 1\]"),
        (dict(memory_window=0), "memory_window=0 must be >= 1"),
    ],
)
def test_bad_stream_arguments(kw, message):
    with pytest.raises(UserError, match=message):
        method_from_conf("ours", sparsity=0.5, **kw)


def test_a_forwards_layers_fold_into_the_phase_as_each_alone_would():
    """Layers held and folded in together (one op per statistic for each run of one width)
    give, bit for bit, each layer's own Eq. 2 sums; widths may differ from layer to layer."""
    widths, rows = [8, 8, 6, 8], torch.tensor([0, 2, 2, 1])
    phase = PhaseScores(widths, 3)
    expected = [torch.zeros(3, d) for d in widths]
    for _ in range(3):  # forwards: a new `Tokens` each, as a host makes them
        tokens = Tokens(rows, torch.tensor([True, True, False, True]))
        for layer, d in enumerate(widths):
            z = torch.randn(4, d) * torch.rand(4, 1) * 10
            phase.add(layer, z, tokens)
            expected[layer].index_add_(0, rows, unit_sq(z) * tokens.counts.float()[:, None])
    count = torch.zeros(3).index_add_(0, rows, torch.tensor([1.0, 1.0, 0.0, 1.0]))
    for layer in range(len(widths)):
        assert torch.equal(phase.sum_sq[layer], expected[layer])
        assert torch.equal(phase.count[layer], 3 * count)


def test_every_layers_scores_at_once_are_each_layers_scores_padded_with_zeros():
    """`all_scores` (what ours' memory takes, one op per statistic) against `scores(l)`, with
    layers of two widths and a row set aside."""
    phase = PhaseScores([8, 5, 8], 3)
    tokens = Tokens(torch.arange(3).repeat_interleave(2), torch.ones(6, dtype=torch.bool))
    for layer, width in enumerate(phase.d_ff):
        phase.add(layer, torch.rand(6, width), tokens)
    phase.follow(RowsGathered(torch.tensor([0, 2])))
    every = phase.all_scores()
    assert every.shape == (3, 3, 8)  # layers, rows (the one set aside first), widest layer
    for layer, width in enumerate(phase.d_ff):
        assert torch.equal(every[layer, :, :width], phase.scores(layer))
        assert not every[layer, :, width:].any()


def test_a_run_of_layers_handed_in_at_once_folds_as_each_layer_alone_would():
    """`add_now` (a host's sinks: consecutive layers stacked, overwritten in place) against
    `add` layer by layer, bit for bit, with a token that does not count."""
    widths, rows = [8, 8, 6], torch.tensor([2, 0, 1])
    tokens = Tokens(rows, torch.tensor([True, False, True]))
    z = torch.randn(3, 3, 8) * torch.rand(3, 3, 1) * 10
    z[2, :, 6:] = 0  # the narrower layer's padding in the host's buffer
    by_layer, at_once = PhaseScores(widths, 3), PhaseScores(widths, 3)
    for layer, d in enumerate(widths):
        by_layer.add(layer, z[layer, :, :d].clone(), tokens)
    at_once.add_now([(0, z[:2].clone()), (2, z[2:, :, :6].clone())], tokens)
    for layer in range(len(widths)):
        assert torch.equal(at_once.sum_sq[layer], by_layer.sum_sq[layer])
    assert torch.equal(at_once.count, by_layer.count)


@pytest.mark.parametrize("foreign", [False, True], ids=["sinks", "hooks"])
def test_observed_decode_steps_leave_z_in_sinks_unless_another_hook_must_fire(foreign):
    """A decode step the method observes gives every dense layer a sink (one copy of Z per layer
    and one fold per step, instead of a hook per layer); a hook of someone else's on a down
    projection keeps every layer on hooks. Either way the phase holds the same sums, bit for bit,
    as the hooks alone gave: the same forwards, the same scores."""
    sums = {}
    tiny_model("tiny_llama")  # built once (cached): each run below draws the same ids
    for foreign_hook in (True, foreign):
        torch.manual_seed(0)
        method = method_from_conf("ours", sparsity=0.5, t_init=50, t_explore=2, t_prune=3)
        with Stream(method) as s:
            extra = [v.down.register_forward_pre_hook(lambda m, a: None)
                     for v in s.driver.adapter.ffns()] if foreign_hook else []  # fmt: skip
            s.decode(3)
            assert all((sliced.sink is None) == foreign_hook for sliced in s.driver.host.sliced)
            for handle in extra:
                handle.remove()
            sums[foreign_hook] = [t.clone() for t in method.phase.sum_sq], method.phase.count
    (hooked, count), (ours, our_count) = sums[True], sums[foreign]
    assert all(torch.equal(a, b) for a, b in zip(ours, hooked)) and torch.equal(our_count, count)
