"""Two engines, one answer: what a method decides in the HF loop and in vLLM, forward by forward.

`compare_batch` generates a batch once with the HF loop, then runs the same tokens through both
engines: teacher forcing, each engine's next token is the HF completion's, chosen at the same
forwards (the prompts' prefill, then one decode forward per token; vLLM's logits are replaced
by the forced token's before its sampler, `forcing`). Both runs record, through the method's
own interface (no method is named here, only the families of `bwprune.methods.host`):

- the kept sets in force at every forward (neuron-set methods), as sets, and every top-k they
  were chosen by (`NeuronSetMethod.top`: its scores and k);
- every keep-mask entry a threshold method decided, with the score it compared with its
  threshold (`ThresholdMethod.scores`), tokens matched across engines by (row, position);
- each row's ledger, and the logits that predict each forced token.

A differing mask entry is a near-tie when both engines' scores lie within the engines' float
disagreement of the threshold, that disagreement measured as the largest |Δ| between the two
engines' scores at that site (layer, hidden state) in that forward. A differing kept set is a
near-tie when every neuron in one set and not the other scores, in both engines, within that
disagreement (between the scores its top-k was given) of the k-th best score: a tie at the
boundary that float rounding, or the order a sort breaks exact ties in, settles either way. A
kept set whose top-k was not recorded (or not a top-k) counts as not a near-tie. This module
runs no engine of its own
(`bwprune.generation.runner`, `bwprune.vllm.running.runner`) and scores nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bwprune.benchmarks.selection import select_examples
from bwprune.config import build, build_method, compose_config
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import BatchedRunner, Completion, Forcing, SamplingConfig
from bwprune.methods.base import Phase, Tokens
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.thresholds import ThresholdMethod
from bwprune.models.loading import load_model
from bwprune.vllm.binding.session import Session, StreamSession
from bwprune.vllm.running import ranks
from bwprune.vllm.running.runner import EngineMethod, VLLMRunner

SHARED = -1  # the key of a decode step's one batch-shared mask row


@dataclass
class Mask:
    """One (forward, layer, site) of a threshold method: the entries it decided."""

    keys: torch.Tensor  # (M,) row * 2**32 + position (prefill), row (decode), SHARED
    scores: torch.Tensor  # (M, D) what was compared with the threshold
    keep: torch.Tensor  # (M, D) bool
    threshold: float


@dataclass(frozen=True)
class TopK:
    """One top-k a neuron-set method chose a kept set by: before forward `forward`."""

    forward: int
    scores: torch.Tensor  # (D,)
    k: int
    kept: torch.Tensor  # sorted

    def boundary(self) -> float:
        """The k-th best score: the one a neuron must reach to be kept."""
        return float(self.scores.double().topk(self.k).values[-1])


def chosen_by(tops: list[TopK], forward: int, kept: torch.Tensor) -> TopK | None:
    """The latest top-k at or before `forward` that chose exactly `kept`."""
    return next((t for t in reversed(tops) if t.forward <= forward and torch.equal(t.kept, kept)),
                None)  # fmt: skip


@dataclass
class Capture:
    """What one engine's run decided and predicted; `origin(slots)` -> the batch rows the method's
    slots hold now."""

    origin: Callable[[torch.Tensor], torch.Tensor]
    forwards: list[tuple[str, int]] = field(default_factory=list)
    kept: dict[tuple[int, int], torch.Tensor | None] = field(default_factory=dict)
    tops: list[TopK] = field(default_factory=list)  # every top-k, in the order it ran
    masks: dict[tuple[int, int, int], Mask] = field(default_factory=dict)
    logits: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (row, i) -> (V,)

    def observe(self, i: int, logits: torch.Tensor, lengths: list[int]) -> None:
        """(B, V) logits predicting every row's i-th token, rows in batch order."""
        for row, n in enumerate(lengths):
            if i < n:
                self.logits[row, i] = logits[row].detach().clone()


@contextmanager
def capturing(driver: MethodDriver, capture: Capture) -> Iterator[Capture]:
    """Record `driver`'s method's decisions into `capture` while inside (instance attributes
    over the method's and the host's hooks, removed on exit)."""
    method, host = driver.method, driver.host
    begin_step, begin, keep = method.begin_step, host.begin, getattr(method, "keep", None)
    top = getattr(method, "top", None)

    def on_begin_step(ctx):
        capture.forwards.append((ctx.phase.value, ctx.step))
        return begin_step(ctx)

    def on_top(scores: torch.Tensor, k: int) -> torch.Tensor:
        kept = top(scores, k)
        capture.tops.append(TopK(len(capture.forwards) - 1, scores.detach().cpu().clone(), int(k),
                                 kept.sort().values.cpu()))  # fmt: skip
        return kept

    def on_begin(ctx, valid, slots):
        out = begin(ctx, valid, slots)
        f = len(capture.forwards) - 1
        for layer, k in enumerate(method.kept):
            capture.kept[f, layer] = None if k is None else k.sort().values.cpu()
        return out

    def on_keep(layer: int, site: int, magnitude: torch.Tensor, tokens: Tokens):
        out = keep(layer, site, magnitude, tokens)
        phase, _ = capture.forwards[-1]
        scores = method.scores(magnitude, tokens)
        if phase == Phase.DECODE.value and method.shared_mask:
            keys, decided = torch.tensor([SHARED]), out[:1]
        else:
            rows = capture.origin(tokens.rows)
            position = torch.zeros_like(rows) if tokens.position is None else tokens.position
            counts = tokens.counts
            keys, scores, decided = (rows * 2**32 + position)[counts], scores[counts], out[counts]
            order = keys.argsort()
            keys, scores, decided = keys[order], scores[order], decided[order]
        capture.masks[len(capture.forwards) - 1, layer, site] = Mask(
            keys.cpu(), scores.detach().cpu().clone(), decided.cpu().clone(),
            float(method.thresholds[layer][site]),
        )  # fmt: skip
        return out

    method.begin_step = on_begin_step
    if isinstance(method, NeuronSetMethod):
        host.begin, method.top = on_begin, on_top
    if isinstance(method, ThresholdMethod) and method.active:
        method.keep = on_keep
    try:
        yield capture
    finally:
        for owner, name in ((method, "begin_step"), (host, "begin"), (method, "keep"),
                            (method, "top")):  # fmt: skip
            owner.__dict__.pop(name, None)


def request_rows(requests: list[str]) -> dict[str, int]:
    """vLLM request ids (`<n>-<suffix>`, n counting up in the order `VLLMRunner.run` added the
    prompts) -> the batch row of each."""
    ordered = sorted(requests, key=lambda r: int(r.split("-", 1)[0]))
    return {r: row for row, r in enumerate(ordered)}


def stream_row(request: str) -> int:
    """A stream's request id -> its row: `VLLMRunner.stream` adds prompt i as request i."""
    return int(request.split("-", 1)[0])


def rows_of(session: Session | StreamSession, requests: list[str]) -> dict[str, int]:
    """The batch row of each of `requests`, in a static batch's session or a stream's."""
    if isinstance(session, StreamSession):
        return {r: stream_row(r) for r in requests}
    return request_rows(session.rows)


@contextmanager
def forcing(model, runner, width: int, tokens: list[list[int]], capture: Capture) -> Iterator[None]:
    """vLLM's next token of each request is `tokens[row][i]`: its logits (the first `width`,
    the vocabulary's, kept in `capture`) are replaced, before the sampler, by a vector that only
    the forced token tops. `model`, `runner`: a worker's (in its own process under tensor
    parallelism, where a rank that is not given the gathered logits gets None and passes it on)."""
    real, produced = model.compute_logits, {}

    def compute_logits(hidden: torch.Tensor) -> torch.Tensor | None:
        logits = real(hidden)
        if logits is None:
            return None
        batch = runner.input_batch
        requests = list(batch.req_ids[: batch.num_reqs])
        rows = rows_of(model.bwprune_session, requests)
        forced = torch.full_like(logits, float("-inf"))
        for j, r in enumerate(requests):
            row = rows[r]
            i = produced[r] = produced.get(r, -1) + 1
            capture.logits[row, i] = logits[j, :width].detach().clone()
            forced[j, tokens[row][i]] = 0.0
        return forced

    model.compute_logits = compute_logits
    try:
        yield
    finally:
        del model.compute_logits


def hf_origin(driver: MethodDriver) -> Callable[[torch.Tensor], torch.Tensor]:
    """The HF loop's slots -> batch rows: its ledger follows compaction."""
    return lambda slots: torch.tensor(driver.ledger.row_ids, device=slots.device)[slots]


def vllm_origin(model, driver: MethodDriver) -> Callable[[torch.Tensor], torch.Tensor]:
    """vLLM's slots -> batch rows: in a static batch slot s holds the request that started in
    the ledger's `row_ids[s]`, the session's `rows` (of the worker's `model`) naming the request
    of each starting slot; in a stream, the request the session seated there."""

    def origin(slots: torch.Tensor) -> torch.Tensor:
        session = model.bwprune_session
        if isinstance(session, StreamSession):  # a stream's slot holds its request while it runs
            of_slot = [-1 if r is None else stream_row(r) for r in session.slots]
        else:
            rows = request_rows(session.rows)
            of_slot = [rows[session.rows[s]] for s in driver.ledger.row_ids]
        return torch.tensor(of_slot, device=slots.device)[slots]

    return origin


@dataclass
class Tally:
    """The comparison of one method over batches (counts over all forwards, layers and sites)."""

    forwards: int = 0
    same_forwards: bool = True
    decisions: int = 0
    differing: int = 0
    differing_not_near_tie: int = 0
    max_abs_logit_diff: float = 0.0
    kl: float = 0.0  # mean over forced tokens of KL(HF || vLLM), nats
    kl_max: float = 0.0
    max_rel_score_diff: float = 0.0  # largest |Δ score| / largest |score| of a site and forward
    # ... over the sites up to the first that differs (forward, layer, site order; all sites
    # when none does): the engines' own float disagreement, before a flip can propagate
    float_disagreement: float = 0.0
    ledgers_differing: int = 0
    tokens: int = 0

    def add(self, other: Tally) -> None:
        n = self.tokens + other.tokens
        self.kl = (self.kl * self.tokens + other.kl * other.tokens) / n if n else 0.0
        for name in ("forwards", "decisions", "differing", "differing_not_near_tie",
                     "ledgers_differing", "tokens"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("max_abs_logit_diff", "kl_max", "max_rel_score_diff", "float_disagreement"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        self.same_forwards &= other.same_forwards


def compare_masks(a: Mask, b: Mask | None, tally: Tally) -> tuple[float, bool]:
    """One site's keep masks, HF's `a` against vLLM's `b`: the site's relative disagreement
    (largest |Δ score| / largest |score|; inf when the engines decided for other tokens) and
    whether a decision differs."""
    decided = a.keep.numel()
    tally.decisions += decided
    if b is None or not torch.equal(a.keys, b.keys):  # other tokens: nothing lines up
        tally.differing += decided
        tally.differing_not_near_tie += decided
        return float("inf"), True
    diff = (a.scores.double() - b.scores.double()).abs()
    eps = float(diff.max()) if diff.numel() else 0.0
    scale = float(a.scores.abs().max()) if a.scores.numel() else 0.0
    rel = eps / scale if scale else eps
    tally.max_rel_score_diff = max(tally.max_rel_score_diff, rel)
    differ = a.keep != b.keep
    tally.differing += int(differ.sum())
    t = a.threshold
    near = ((a.scores.double() - t).abs() <= eps) & ((b.scores.double() - t).abs() <= eps)
    tally.differing_not_near_tie += int((differ & ~near).sum())
    return rel, bool(differ.any())


def compare_kept(
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    tally: Tally,
    top_a: TopK | None = None,
    top_b: TopK | None = None,
) -> tuple[float, bool]:
    """One layer's kept sets, HF's `a` against vLLM's `b`, and the top-k each was chosen by
    (None: not recorded): the relative disagreement of those top-k's scores, and whether the sets
    differ. A differing set is a near-tie when every neuron in one and not the other scores within
    that disagreement of its engine's k-th best score, in both engines."""
    if a is None and b is None:
        return 0.0, False
    tally.decisions += 1
    differ = a is None or b is None or not torch.equal(a, b)
    tally.differing += differ
    if top_a is None or top_b is None or top_a.k != top_b.k:
        tally.differing_not_near_tie += differ
        return 0.0, differ
    eps = float((top_a.scores.double() - top_b.scores.double()).abs().max())
    scale = float(top_a.scores.double().abs().max())
    rel = eps / scale if scale else eps
    if differ:
        moved = torch.tensor(sorted(set(a.tolist()) ^ set(b.tolist())), dtype=torch.long)
        near = all(((t.scores.double()[moved] - t.boundary()).abs() <= eps).all()
                   for t in (top_a, top_b))  # fmt: skip
        tally.differing_not_near_tie += not near
    return rel, differ


def compare_captures(a: Capture, b: Capture) -> Tally:
    """HF's capture `a` against vLLM's `b`, forward by forward, layer by layer."""
    tally = Tally(forwards=len(a.forwards), same_forwards=a.forwards == b.forwards)
    sites = []
    for key, kept in a.kept.items():
        other = b.kept.get(key)
        tops = [None if k is None else chosen_by(c.tops, key[0], k)
                for k, c in ((kept, a), (other, b))]  # fmt: skip
        sites.append(((*key, -1), partial(compare_kept, kept, other, top_a=tops[0],
                                          top_b=tops[1])))  # fmt: skip
    sites += [
        (key, partial(compare_masks, mask, b.masks.get(key))) for key, mask in a.masks.items()
    ]
    flipped = False
    for _, compare in sorted(sites, key=lambda site: site[0]):
        rel, differ = compare(tally)
        if not flipped:
            tally.float_disagreement = max(tally.float_disagreement, rel)
        flipped |= differ
    kls = []
    for key, x in a.logits.items():
        y = b.logits[key]
        tally.max_abs_logit_diff = max(tally.max_abs_logit_diff,
                                       float((x.double() - y.double()).abs().max()))  # fmt: skip
        p, q = x.double().log_softmax(-1), y.double().log_softmax(-1)
        kls.append(float((p.exp() * (p - q)).sum()))
    tally.tokens = len(kls)
    tally.kl = sum(kls) / len(kls) if kls else 0.0
    tally.kl_max = max(kls, default=0.0)
    return tally


def ledgers_differ(a: dict, b: dict, tol: float = 1e-9) -> bool:
    if (a["decode_steps"], a["sparse_steps"]) != (b["decode_steps"], b["sparse_steps"]):
        return True
    values = [(a[k], b[k]) for k in ("ffn", "ffn_sparse_steps", "params")]
    values += list(zip(a["per_layer"], b["per_layer"]))
    return any(abs(x - y) > tol for x, y in values)


def compare_batch(hf: BatchedRunner, vllm: VLLMRunner, driver: EngineMethod,
                  ids: torch.Tensor, attn: torch.Tensor) -> Tally:  # fmt: skip
    """The batch's (left-padded `ids`, `attn`) HF completions, forced through both engines:
    `hf`'s method through `hf`, and through `vllm` by `driver` (that method installed in
    `vllm`'s one worker, in this process: its decisions are recorded where they are made)."""
    if driver.local is None:
        raise UserError("the engines are compared with vLLM's one worker in this process "
                        "(generation.vllm.tensor_parallel_size=1)")  # fmt: skip
    reference, _ = hf.generate_tokens(ids, attn)
    tokens = [c.token_ids for c in reference]
    lengths = [len(t) for t in tokens]
    width = max(lengths)
    padded = torch.tensor([t + [hf.pad_id] * (width - len(t)) for t in tokens])
    forced = Forcing(padded, torch.tensor(lengths))

    mine = Capture(hf_origin(hf.driver))
    with capturing(hf.driver, mine):
        hf_out, _ = hf.generate_tokens(
            ids, attn, forced=forced, observe=lambda i, x: mine.observe(i, x, lengths)
        )
    theirs = Capture(vllm_origin(vllm.model, driver.local))
    width = vllm.prepared.model.config.vocab_size
    with capturing(driver.local, theirs), forcing(vllm.model, vllm.model_runner, width, tokens,
                                                  theirs):  # fmt: skip
        out, _ = vllm.generate_with(driver, ids, attn, lengths, hf.stop_ids.tolist())
    return forced_tally(tokens, (mine, hf_out), (theirs, out))


def start_capture(worker, key: str, tokens: list[list[int]], width: int) -> None:
    """In every worker (`LLM.collective_rpc`): record what its method `key` decides and force
    `tokens`, until `stop_capture`."""
    driver, model = ranks.driver(worker, key), worker.model_runner.model
    capture = Capture(vllm_origin(model, driver))
    stack = ExitStack()
    stack.enter_context(capturing(driver, capture))
    stack.enter_context(forcing(model, worker.model_runner, width, tokens, capture))
    worker.bwprune_capture = capture, stack


def stop_capture(worker) -> Capture:
    """The worker's capture, its hooks removed (and its `origin`, a closure over the worker's
    objects, dropped: the capture leaves the worker's process)."""
    capture, stack = worker.bwprune_capture
    stack.close()
    del worker.bwprune_capture
    capture.origin = None
    return capture


def captured(vllm: VLLMRunner, tokens: list[list[int]], ids: torch.Tensor, attn: torch.Tensor,
             stop: list[int], stream: bool = False,
             ) -> tuple[Capture, list[Completion]]:  # fmt: skip
    """`tokens` forced through `vllm` at any tensor-parallel size, in a static batch or, with
    `stream`, continuously batched through the engine's seats: the first rank's capture (every
    rank decides the same kept sets, `tp_select=global`, and the first is given the logits) and
    the completions, in row order."""
    width = vllm.prepared.model.config.vocab_size
    vllm.rpc(start_capture, args=(vllm.driver.key, tokens, width))
    try:
        if stream:
            done: dict[int, Completion] = {}
            prompts = [row[mask.bool()] for row, mask in zip(ids, attn)]
            vllm.stream(prompts, lambda items, completions, _: done.update(zip(items, completions)))
            out = [done[row] for row in range(len(prompts))]
        else:
            out, _ = vllm.generate_with(vllm.driver, ids, attn, [len(t) for t in tokens], stop)
    finally:
        capture = vllm.rpc(stop_capture)[0]
    return capture, out


def compare_sizes(hf: BatchedRunner, one: VLLMRunner, many: VLLMRunner, ids: torch.Tensor,
                  attn: torch.Tensor, stream: bool = False) -> Tally:  # fmt: skip
    """The HF completions of a batch (of a stream's every prompt, with `stream`) forced through
    vLLM at size 1 (`one`) and at its tensor-parallel size (`many`): the size-N run's
    decisions, ledgers and logits against size 1's, as `compare_batch` compares the HF loop with
    vLLM."""
    reference, _ = hf.generate_tokens(ids, attn)
    tokens = [c.token_ids for c in reference]
    stop = hf.stop_ids.tolist()
    (mine, one_out), (theirs, many_out) = (
        captured(v, tokens, ids, attn, stop, stream) for v in (one, many)
    )
    return forced_tally(tokens, (mine, one_out), (theirs, many_out))


def forced_tally(tokens: list[list[int]], a: tuple[Capture, list[Completion]],
                 b: tuple[Capture, list[Completion]]) -> Tally:  # fmt: skip
    """Two runs forced through `tokens` (each its capture and completions), compared: their
    decisions and logits (`compare_captures`), and how many rows' ledgers differ."""
    check_forced(tokens, a[1], b[1])
    tally = compare_captures(a[0], b[0])
    tally.ledgers_differing = sum(ledgers_differ(x.sparsity, y.sparsity)
                                  for x, y in zip(a[1], b[1]))  # fmt: skip
    return tally


def check_forced(tokens: list[list[int]], *runs: list[Completion]) -> None:
    for run in runs:
        got = [c.token_ids for c in run]
        if got != tokens:
            raise RuntimeError(f"teacher forcing failed: forced {tokens}, an engine ran {got}")


def main(conf_dir: Path, overrides: list[str], tensor_parallel: int = 1) -> list[dict]:
    """One method on a benchmark's selected problems (`subset`, `limit`), in batches of
    `batch_size` (a list, e.g. `batch_size=[1,8]`: each size on the same engine): per batch
    size, the comparison of the two engines as a JSON-able dict: the HF loop against vLLM's one
    worker, or, with `tensor_parallel` N > 1, vLLM's one worker against N workers."""
    cfg = compose_config(conf_dir, overrides)
    sizes = list(cfg.batch_size) if OmegaConf.is_list(cfg.batch_size) else [cfg.batch_size]
    cfg.batch_size = max(int(b) for b in sizes)  # the engine's seats
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    prepared = prepare_loaded(model, tokenizer, build_method(cfg.method))
    hf = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    examples = select_examples(build(cfg.benchmark).examples(), cfg)
    prompts = batch_prompts(tokenizer, cfg.model, [(e, 0) for e in examples])
    longest = max(hf.encode([p])[0].shape[1] for p in prompts)
    stream = cfg.generation.batching == "continuous"
    if stream and tensor_parallel == 1:
        raise UserError("a stream (generation.batching=continuous) is compared between vLLM's "
                        "sizes only: add --tensor-parallel N")  # fmt: skip
    cfg.generation.vllm.tensor_parallel_size = 1
    vllm = VLLMRunner.for_run(cfg, prepared, hf, longest)
    if tensor_parallel > 1:
        cfg.generation.vllm.tensor_parallel_size = tensor_parallel
        many = VLLMRunner.for_run(cfg, prepared, hf, longest)
        compare = partial(compare_sizes, hf, vllm, many, stream=stream)
        engines = f"vllm:1 vs vllm:{tensor_parallel}" + " (stream)" * stream
    else:
        compare, engines = partial(compare_batch, hf, vllm, vllm.driver), "hf vs vllm:1"
    lines = []
    for size in map(int, sizes):
        tally, step = Tally(), len(prompts) if stream else size  # a stream takes every prompt
        for i in range(0, len(prompts), step):
            tally.add(compare(*hf.encode(prompts[i : i + step])))
        lines.append({"method": str(cfg.method.name), "engines": engines, "batch_size": size,
                      "problems": len(examples), **asdict(tally)})  # fmt: skip
    return lines
