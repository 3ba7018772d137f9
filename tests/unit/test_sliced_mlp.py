"""SlicedMLP runs smaller matmuls that give exactly what masking the dense MLP gives."""

import pytest
import torch

from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import adapter_for
from bwprune.models.sliced_mlp import SlicedMLP


def masked_reference(mlp, x, keep):
    z = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
    mask = torch.zeros(z.shape[-1], dtype=z.dtype)
    mask[keep] = 1
    return mlp.down_proj(z * mask)


def test_sliced_equals_masked_dense(tiny):
    model, _ = tiny
    mlp = adapter_for(model).ffn(0).mlp
    sliced = SlicedMLP(mlp)
    x = torch.randn(3, 5, model.config.hidden_size)
    keep = torch.randperm(sliced.d_ff)[:37]
    sliced.set_index(keep)
    assert sliced.kept == 37
    torch.testing.assert_close(sliced(x), masked_reference(mlp, x, keep), atol=1e-5, rtol=1e-5)


def test_keep_all_and_no_index_equal_dense(tiny):
    model, _ = tiny
    mlp = adapter_for(model).ffn(1).mlp
    sliced = SlicedMLP(mlp)
    x = torch.randn(2, 4, model.config.hidden_size)
    assert torch.equal(sliced(x), mlp(x))  # no index: the original modules run
    sliced.set_index(torch.arange(sliced.d_ff))
    torch.testing.assert_close(sliced(x), mlp(x), atol=1e-5, rtol=1e-5)


def test_a_refresh_writes_only_the_neurons_that_changed(tiny):
    """A new kept set of the same size moves only the neurons that entered, into the slots of
    those that left, in buffers that never move; the output is the new set's."""
    model, _ = tiny
    mlp = adapter_for(model).ffn(0).mlp
    sliced = SlicedMLP(mlp)
    x = torch.randn(2, 3, model.config.hidden_size)
    first = torch.randperm(sliced.d_ff)[:40]
    assert sliced.set_index(first).refill
    buffers = [sliced.weights.gate_up.data_ptr(), sliced.weights.down_rows.data_ptr()]
    reordered = sliced.set_index(first.flip(0))  # the same set in another order
    assert reordered is not None and len(reordered) == 0
    second = torch.cat([first[:30], torch.tensor(sorted(set(range(sliced.d_ff)) - set(
        first.tolist())))[:10]])  # fmt: skip
    writes = sliced.set_index(second)
    assert not writes.refill and len(writes) == writes.entered == 10
    assert set(sliced.slots.slots.tolist()) == set(second.tolist())
    assert [sliced.weights.gate_up.data_ptr(), sliced.weights.down_rows.data_ptr()] == buffers
    torch.testing.assert_close(sliced(x), masked_reference(mlp, x, second), atol=1e-5, rtol=1e-5)
    sliced.set_index(None)
    assert sliced.kept == sliced.d_ff and torch.equal(sliced(x), mlp(x))
    sliced.set_index(torch.arange(12))  # another size: buffers of its own
    assert sliced.weights.gate_up.shape[0] == 24


def test_hookset_restores_model_on_error(tiny):
    model, _ = tiny
    view = adapter_for(model).ffn(0)
    x = torch.randn(1, 3, model.config.hidden_size)
    before = view.mlp(x)
    fired = []
    with pytest.raises(RuntimeError), HookSet() as hooks:
        hooks.swap(view.layer, "mlp", SlicedMLP(view.mlp))
        hooks.forward_pre(view.down, lambda m, args: fired.append(args[0].shape))
        view.layer.mlp(x)
        raise RuntimeError("boom")
    assert fired  # the pre-hook on down_proj fires inside the sliced module's dense path
    assert view.layer.mlp is view.mlp
    assert not view.down._forward_pre_hooks
    assert torch.equal(view.mlp(x), before)


def test_a_restart_fills_the_slots_afresh_in_the_buffers_it_has(tiny):
    """A generation computes the same whatever ran before it: after `restart` the next kept set
    fills the slots in its own order, into the same buffers."""
    model, _ = tiny
    sliced = SlicedMLP(adapter_for(model).ffn(0).mlp)
    x = torch.randn(2, 3, model.config.hidden_size)
    first, second = torch.arange(20), torch.arange(5, 25)
    sliced.set_index(first)
    buffer = sliced.weights.gate_up
    sliced.set_index(second)  # moves 5 neurons into the slots of 0-4: another order
    assert sliced.slots.slots.tolist() != second.tolist()
    moved = sliced(x)
    sliced.restart()
    assert sliced.kept == sliced.d_ff
    assert sliced.set_index(second).refill and sliced.weights.gate_up is buffer
    assert sliced.slots.slots.tolist() == second.tolist()
    fresh = SlicedMLP(adapter_for(model).ffn(0).mlp)
    fresh.set_index(second)
    assert torch.equal(sliced(x), fresh(x))  # bit for bit: the same order as a fresh start
    torch.testing.assert_close(moved, fresh(x), atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_a_sink_takes_z_in_place_of_the_down_projections_hooks_compiled_or_eager(tiny):
    """With a sink (an observed decode step, `bwprune.methods.host.Host`), the compiled dense
    graph and the eager module alike copy Z into it and call no hook on the down projection, and
    the output is dense's; without one, the hook sees Z."""
    model, _ = tiny
    sliced = SlicedMLP(adapter_for(model).ffn(0).mlp)
    xs = [torch.randn(3, 1, model.config.hidden_size) for _ in range(3)]
    zs = [sliced.act_fn(sliced.gate_proj(x)) * sliced.up_proj(x) for x in xs]
    seen: list[torch.Tensor] = []
    hook = sliced.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    dense = [sliced.dense(x) for x in xs]  # the hook sees these
    assert len(seen) == 3
    torch._dynamo.reset()
    step = torch.compile(sliced, backend="aot_eager", dynamic=False)
    try:
        for run, x, z, out in zip((step, step, sliced), xs, zs, dense):  # a replay, then eager
            sink = torch.zeros(2, *z.shape)[1]  # a view into a larger buffer, as the host's
            sliced.sink = sink
            torch.testing.assert_close(run(x), out)
            assert sliced.sink is sink
            torch.testing.assert_close(sink, z)
        assert len(seen) == 3
        sliced.sink = None
        assert torch.equal(sliced(xs[0]), dense[0]) and len(seen) == 4
    finally:
        hook.remove()
        torch._dynamo.reset()


def test_compiled_dense_path_is_traced_and_its_observers_fire_at_run_time(tiny):
    """Off CUDA a compiled step runs a kept set as the opaque op, and a dense step as a graph of
    its own: gate, up and their product traced (compiled as dense is), the down projection
    called as a module through an op, so an observer on it sees Z at every call, not once at
    tracing. Both give the eager output."""
    model, _ = tiny
    mlp = adapter_for(model).ffn(0).mlp
    sliced = SlicedMLP(mlp)
    seen: list[torch.Tensor] = []
    hook = sliced.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    graphs: list[set[str]] = []

    def backend(gm: torch.fx.GraphModule, inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    torch._dynamo.reset()
    step = torch.compile(sliced, backend=backend, dynamic=False)
    x = torch.randn(3, 1, model.config.hidden_size)
    try:
        for call in range(3):
            seen.clear()
            assert torch.equal(step(x * call), sliced.dense(x * call))
            assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the op's call, dense's
        sliced.set_index(torch.randperm(sliced.d_ff)[:37])
        torch.testing.assert_close(step(x), masked_reference(mlp, x, sliced.index))
        assert len(graphs) == 2
        dense, kept = graphs
        assert "bwprune.observed" in dense and "bwprune.ffn" not in dense
        assert any("linear" in t for t in dense)  # gate and up in the graph
        assert kept == {"bwprune.ffn"}
    finally:
        hook.remove()
        torch._dynamo.reset()
