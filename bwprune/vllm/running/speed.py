"""`make bench`'s vLLM part: our HF loop against vLLM, and methods inside vLLM against dense vLLM.

In one process, alternated and repeated like every other speed number here
(`bwprune.generation.speed`, whose summary and table this part shares): dense through our HF
runner (`dense`), and each method through each vLLM engine, eager and compiled
(`<method>@<engine>`, its speedups against `dense@<engine>`). Every generation is forced to
exactly `new_tokens` tokens per row on the same random prompts, so every trial does the same
work, and the trials alternate until the speedups' intervals are tight (`timed_rows`). A vLLM
step is timed from the start of its forward to the start of the next: the model and what vLLM
does around it, as an HF step includes the loop's own work. One engine serves every batch size
(a batch of B requests queued at once in an engine of more slots is still a static batch).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.realized import combine
from bwprune.generation.paired import weight_bytes
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.speed import run_once, timed_rows
from bwprune.generation.timing import Precision
from bwprune.methods.base import PruningMethod
from bwprune.models.kept_slots import KeptSlots
from bwprune.vllm.binding.packed import ALIGN, ISA, PackedKeptWeights, _ops
from bwprune.vllm.running.runner import VLLMRunner


def measure_vllm(
    engines: Mapping[str, VLLMRunner],
    methods: Mapping[str, PruningMethod],
    batch_sizes: list[int],
    precision: Precision,
    new_tokens: int,
    prompt_len: int,
    warmup: int,
    seed: int,
    log: Callable[[str], None] = lambda _: None,
    own: Mapping[str, Mapping[str, VLLMRunner]] | None = None,
    hf_loop: bool = True,
) -> list[dict]:
    """Rows as `bwprune.generation.speed.measure`'s: `methods` (prepared on the engines' HF
    model; "dense" among them) run in each vLLM engine (label -> engine: rows
    `<method>@<label>`, speedups against `dense@<label>`), and dense in the HF loop, at every
    batch size. `own`: method label -> engines of its own (label -> engine, as `engines`), for a
    method that changed its model (TriSP): rows `<method>@<label>` against `dense@<label>` too,
    its realized sparsity relative to the model as loaded. `hf_loop=False` leaves dense in the HF
    loop out: where the HF model's weights and vLLM's do not both fit in memory (the 1.5B's on
    24 GiB), running it pages the mapped weights and every trial's time with them."""
    engine = next(iter(engines.values()))
    prepared = engine.prepared
    model, adapter, device = prepared.model, prepared.adapter, engine.device
    hf = BatchedRunner(model, prepared.tokenizer, methods["dense"], adapter,
                       SamplingConfig(new_tokens, ignore_eos=True),
                       ledger=SparsityLedger(adapter, device)) if hf_loop else None  # fmt: skip
    drivers = {f"{label}@{name}": (e, e.driver_for(e.method, SparsityLedger(adapter, device)))
               for label, mine in (own or {}).items() for name, e in mine.items()}  # fmt: skip
    drivers |= {f"{label}@{name}": (e, e.driver_for(m, SparsityLedger(adapter, device)))
                for name, e in engines.items() for label, m in methods.items()}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    vocab = min(prepared.tokenizer.vocab_size, 1000)
    rows = []
    for batch in batch_sizes:
        ids = torch.randint(3, vocab, (batch, prompt_len), generator=gen).to(device)
        attn = torch.ones_like(ids)
        trials = {"dense": partial(run_once, hf, ids, attn)} if hf else {}
        trials |= {label: partial(_vllm_once, e, d, ids, attn, new_tokens)
                   for label, (e, d) in drivers.items()}  # fmt: skip
        timed = timed_rows(batch, trials, precision, warmup, weight_bytes(model),
                           lambda line: log(f"vLLM {line}"))  # fmt: skip
        rows += sorted(timed, key=lambda row: row["method"].split("@")[0] in (own or {}))
    return rows


def _vllm_once(engine: VLLMRunner, driver, ids, attn, new_tokens: int) -> dict:
    start = time.perf_counter()
    completions, timing = engine.generate_with(driver, ids, attn, new_tokens, stop=[])
    return {
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "e2e_s": time.perf_counter() - start,  # vLLM's whole generate call
        "step_ms": timing.median_step_ms,
        "tokens_per_s": timing.decode_tokens / timing.decode_s,
        "sparsity": combine(c.sparsity for c in completions),
        "phases": timing.phases,
    }


def measure_ffn_kernels(hidden: int, d_ff: int, kept: int, layers: int, batch_sizes: list[int],
                        repeats: int, seed: int = 0) -> list[dict]:  # fmt: skip
    """The kernel choice for kept sets on this CPU (`bwprune.vllm.binding.packed`): ms for `layers`
    FFNs of random weights (distinct per layer, so the weights stream from memory as in a model),
    each computing `kept` of `d_ff` neurons three ways — vLLM's fused-MoE kernel on packed
    panels, oneDNN on freshly packed kept slices (the alternative to in-place writes), plain
    `F.linear` on the slices — and oneDNN on the whole FFN; alternated, medians of `repeats`."""
    ops, gen = _ops(), torch.Generator().manual_seed(seed)
    mats = [(torch.randn(2 * d_ff, hidden, generator=gen), torch.randn(hidden, d_ff, generator=gen))
            for _ in range(layers)]  # fmt: skip
    sliced = [(w[: 2 * kept].contiguous(), d[:, :kept].contiguous()) for w, d in mats]
    packed = [(ops.cpu_prepack_moe_weight(w[None], ISA), ops.cpu_prepack_moe_weight(d[None], ISA))
              for w, d in sliced]  # fmt: skip
    onednn = [(ops.create_onednn_mm(w.t(), 32), ops.create_onednn_mm(d.t(), 32)) for w, d in sliced]
    dense = [(ops.create_onednn_mm(w.t(), 32), ops.create_onednn_mm(d.t(), 32)) for w, d in mats]

    def glu(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def run(kind: str, x: torch.Tensor) -> None:
        ones, zeros = x.new_ones(len(x), 1), torch.zeros(len(x), 1, dtype=torch.int32)
        for i in range(layers):
            if kind == "moe_packed":
                ops.cpu_fused_moe(torch.empty_like(x), x, *packed[i], None, None, ones, zeros,
                                  "silu", ISA, False)  # fmt: skip
            elif kind == "linear_sliced":
                F.linear(glu(F.linear(x, sliced[i][0])), sliced[i][1])
            else:
                g, d = (onednn if kind == "onednn_sliced" else dense)[i]
                ops.onednn_mm(d, glu(ops.onednn_mm(g, x, None)), None)

    kinds = ["moe_packed", "onednn_sliced", "linear_sliced", "onednn_dense"]
    rows = []
    for batch in batch_sizes:
        x = torch.randn(batch, hidden, generator=gen)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for rep in range(repeats + 1):  # the first round warms up
            for kind in kinds if rep % 2 else kinds[::-1]:
                start = time.perf_counter()
                run(kind, x)
                if rep:
                    times[kind].append(1e3 * (time.perf_counter() - start))
        rows.append({"batch_size": batch, **{k: statistics.median(v) for k, v in times.items()}})
    return rows


def measure_refresh(hidden: int, d_ff: int, kept: int, layers: int, churn: float, repeats: int,
                    seed: int = 0) -> dict:  # fmt: skip
    """What a refresh of the vLLM host costs on one thread: `layers` packed FFNs of random
    weights, each kept set then replacing `churn` of its neurons with random others; ms for the
    slot bookkeeping (`KeptSlots.assign`) and for the writes into the panels, medians of
    `repeats` refreshes, and how many of a layer's gate|up panels a refresh writes into."""
    gen = torch.Generator().manual_seed(seed)
    sources = [[torch.randn(d_ff, hidden, generator=gen) for _ in range(3)]
               for _ in range(layers)]  # fmt: skip
    slots = [KeptSlots(d_ff, ALIGN) for _ in range(layers)]
    index = [torch.randperm(d_ff, generator=gen)[:kept] for _ in range(layers)]
    weights = []
    for s, i, (gate, up, down_rows) in zip(slots, index, sources):
        first = s.assign(i)  # fills every slot
        weights.append(PackedKeptWeights(gate, up, down_rows, s.capacity))
        weights[-1].write(first)
    moved = round(churn * kept)
    assign_ms, write_ms, panels = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            for layer, i in enumerate(index):  # `moved` neurons leave, as many others enter
                out = torch.ones(d_ff, dtype=torch.bool)
                out[i] = False
                others = out.nonzero().flatten()
                stay = i[torch.randperm(kept, generator=gen)[moved:]]
                enter = others[torch.randperm(len(others), generator=gen)[:moved]]
                index[layer] = torch.cat([stay, enter])
            start = time.perf_counter()
            writes = [s.assign(i) for s, i in zip(slots, index)]
            middle = time.perf_counter()
            for w, wr in zip(weights, writes):
                w.write(wr)
            write_ms.append(1e3 * (time.perf_counter() - middle))
            assign_ms.append(1e3 * (middle - start))
            for w, wr in zip(weights, writes):
                rows = torch.cat([wr.slots, wr.slots + w.slots])
                panels.append(len(rows.div(w.p13, rounding_mode="floor").unique()))
    finally:
        torch.set_num_threads(threads)
    return {
        "bookkeeping_ms": statistics.median(assign_ms),
        "writes_ms": statistics.median(write_ms),
        "panels_written": statistics.fmean(panels),
        "panels": 2 * weights[0].slots // weights[0].p13,
    }
