"""The lm-eval model `bwprune`: any lm-eval task under any pruning method, batched as in run.py.

- `generate_until` goes through `BatchedRunner`, so a method sees exactly what it sees in run.py:
  a `start` per batch, a PREFILL step, then DECODE steps with valid/finished rows. Requests are
  grouped by their generation kwargs and sorted by length (longest first) before batches of
  `batch_size` are cut, so a batch-shared mask is shared by requests of similar length (run.py
  batches in file order); results come back in request order. lm-eval's `until` stops a row
  (it counts as finished for the method and the ledger) and is cut from the text.
- `loglikelihood` / `loglikelihood_rolling` run one scoring forward per batch of requests
  (`bwprune.generation.scoring_forward`, as perplexity does) through the same `MethodDriver`,
  which the method sees as a prompt prefill (a new batch, then one PREFILL step whose `valid`
  marks the real tokens). There is no decode phase, so each method acts as on a prompt (with the
  methods' defaults): `dense`, `ours` (prefill only scores the prompt) and `griffin` (the
  prompt pass picks the experts for decode) score with the dense model; `teal` thresholds the
  last half of each request's tokens per token (`prefill_fraction` 0.5), `cats` all of them;
  `wanda` and `trisp` prune weights in `prepare`, so they apply in full.

Results: `get_model_info` adds `config.bwprune` to lm-eval's results: the resolved config, the
realized sparsity of `generate_until` (its decode steps) and, apart, of the scoring forwards
(`scoring_sparsity`; `scoring_forwards` counts their rows per request type), both by the ledger's
one definition, decode speed and provenance.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

import lm_eval.models  # noqa: F401  (built-in names first: the registry loads them only when empty)
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from omegaconf import OmegaConf
from tqdm import tqdm

from bwprune.engine.protocol import MethodDriver
from bwprune.engine.realized import combine
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_model
from bwprune.generation.prompts import left_pad, render_messages
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.scoring_forward import score_forward
from bwprune.lmeval.compose import compose_with_method
from bwprune.runs.identity import method_name
from bwprune.runs.provenance import provenance

log = logging.getLogger(__name__)

GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p")

# (request key for lm-eval's cache, context ids, continuation ids), as `TemplateLM` builds them
TokenRequest = tuple[Any, list[int], list[int]]


@register_model("bwprune")
class BWPruneLM(TemplateLM):
    """A pruned model for lm-eval; `model_args` are Hydra overrides of conf/config.yaml."""

    def __init__(
        self,
        model_args: Mapping[str, Any] | None = None,
        batch_size: int | str | None = None,
    ) -> None:
        super().__init__()
        self.cfg, method = compose_with_method(model_args or {}, batch_size)
        self.prepared = prepare_model(self.cfg, method)
        self.tokenizer = self.prepared.tokenizer
        self._device = self.prepared.device
        self.batch_size = int(self.cfg.batch_size)
        self.max_length = int(self.prepared.model.config.max_position_embeddings)
        self._runners: dict[SamplingConfig, BatchedRunner] = {}
        self._sparsity: list[dict] = []  # ledger rows of generated completions
        # Scoring forwards keep a ledger of their own (a copy of the one built before `prepare`,
        # so fractions stay relative to the model as loaded): generation sparsity stays apart.
        self._scoring = MethodDriver(method, self.prepared.model, self.prepared.adapter,
                                     copy.copy(self.prepared.ledger))  # fmt: skip
        self._scoring_sparsity: list[dict] = []
        self._forwards: Counter[str] = Counter()  # rows scored per loglikelihood request type
        self._decode = {"tokens": 0, "seconds": 0.0}

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: Mapping[str, Any], additional_config: Mapping[str, Any] | None = None
    ) -> BWPruneLM:
        """lm-eval's `--batch_size` becomes our `batch_size`. Its `--device` is not used (the CLI
        passes `cuda:0` when none is given): `model.device` in `model_args` sets the device, as
        for run.py (default `auto`). `max_batch_size` only serves `batch_size=auto` (refused)."""
        return cls(dict(arg_dict), (additional_config or {}).get("batch_size"))

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: Mapping[str, Any] | None = None
    ) -> BWPruneLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- what TemplateLM needs ------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is conditioned on: BOS where the tokenizer has one (as HF's)."""
        bos = self.tokenizer.bos_token_id
        return self.eot_token_id if bos is None else bos

    @property
    def tokenizer_name(self) -> str:
        return str(self.cfg.model.name)

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        """No special tokens unless asked: prompts are tokenized as the runner tokenizes them."""
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The model's chat template with the model config's options and system prompt, as
        `bwprune.generation.prompts.render_prompt` renders run.py's prompts."""
        return render_messages(
            self.tokenizer, self.cfg.model, list(chat_history), add_generation_prompt
        )

    # -- generate_until ---------------------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        collator = Collator(
            [r.args for r in requests],
            sort_fn=lambda a: (-len(self.tok_encode(a[0])), a[0]),
            group_by="gen_kwargs",
            group_fn=lambda a: a[1],
        )
        texts = []
        bar = self._bar(len(requests), "generate_until", disable_tqdm)
        for chunk in collator.get_batched(n=self.batch_size):
            sampling, until = self._decoding(chunk[0][1])
            rows = [self._context_ids(context, sampling.max_new_tokens) for context, _ in chunk]
            ids, attn = left_pad(rows, self.tokenizer.pad_token_id, self._device)
            completions, timing = self._runner(sampling).generate_tokens(ids, attn, until)
            self._decode["tokens"] += timing.decode_tokens
            self._decode["seconds"] += timing.decode_s
            for (context, gen_kwargs), c in zip(chunk, completions):
                text = postprocess_generated_text(c.text, until, None)
                self._sparsity.append(c.sparsity)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                texts.append(text)
            bar.update(len(chunk))
        bar.close()
        self._log_sparsity()
        return collator.get_original(texts)

    def _decoding(self, gen_kwargs: dict) -> tuple[SamplingConfig, list[str]]:
        """lm-eval's generation kwargs -> our sampling config and the stop strings.

        The task (or `--gen_kwargs`) decides decoding, as for lm-eval's other models; a task that
        sets no `max_gen_toks` gets `generation.max_new_tokens`. Temperature 0 is greedy.
        """
        kw = dict(normalize_gen_kwargs(gen_kwargs, int(self.cfg.generation.max_new_tokens)))
        unknown = sorted(set(kw) - set(GEN_KWARGS))
        if unknown:
            raise UserError(f"gen_kwargs {unknown} are not supported; bwprune takes {GEN_KWARGS}")
        if kw["max_gen_toks"] < 1:
            raise UserError(f"max_gen_toks={kw['max_gen_toks']} must be >= 1")
        temperature = float(kw.get("temperature", 0.0))
        sample = bool(kw["do_sample"]) and temperature > 0
        sampling = SamplingConfig(
            kw["max_gen_toks"],
            do_sample=sample,
            temperature=temperature if sample else 1.0,
            top_p=float(kw.get("top_p", 1.0)) if sample else 1.0,
        )
        return sampling, list(kw["until"])

    def _runner(self, sampling: SamplingConfig) -> BatchedRunner:
        """One runner per decoding setting, each seeded once with `seed` (as run.py's one)."""
        if sampling not in self._runners:
            self._runners[sampling] = self.prepared.runner(
                sampling, int(self.cfg.seed), self.cfg.generation
            )
        return self._runners[sampling]

    def _context_ids(self, context: str, max_new_tokens: int) -> list[int]:
        """Prompt ids, cut from the left to leave room for the generation (as lm-eval's HF)."""
        ids = self.tok_encode(context)
        room = self.max_length - max_new_tokens
        if room < 1:
            raise UserError(
                f"max_gen_toks={max_new_tokens} leaves no room for a prompt in the model's "
                f"{self.max_length} positions"
            )
        if len(ids) > room:
            log.warning("prompt of %d tokens cut to its last %d", len(ids), room)
        return ids[-room:]

    # -- loglikelihood ----------------------------------------------------------------------------
    def _loglikelihood_tokens(
        self,
        requests: list[TokenRequest],
        disable_tqdm: bool = False,
        kind: str = "loglikelihood",
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), continuation is greedy) per request, in order."""
        collator = Collator(
            requests, sort_fn=lambda r: (-len(r[1]) - len(r[2]), tuple(r[1] + r[2]))
        )
        answers = []
        bar = self._bar(len(requests), kind, disable_tqdm)
        with self._scoring.attached():
            for chunk in collator.get_batched(n=self.batch_size):
                answers += self._score_batch(chunk, kind)
                bar.update(len(chunk))
        bar.close()
        return collator.get_original(answers)

    @torch.inference_mode()
    def _score_batch(self, chunk: list[TokenRequest], kind: str) -> list[tuple[float, bool]]:
        """One scoring forward over the batch, seen by the method as a prefill of its tokens."""
        rows = [(ctx + cont)[-(self.max_length + 1) :][:-1] for _, ctx, cont in chunk]
        ids, attn = left_pad(rows, self.tokenizer.pad_token_id, self._device)
        keep = max(len(cont) for _, _, cont in chunk)  # rows end together: predictors are last
        logits, ledger_rows = score_forward(self._scoring, self.prepared.model, ids, attn, keep)
        self._scoring_sparsity += ledger_rows
        self._forwards[kind] += len(rows)
        answers = []
        for (key, _, cont), row in zip(chunk, F.log_softmax(logits.float(), dim=-1)):
            row = row[keep - len(cont) :]
            target = torch.tensor(cont, device=row.device)
            logprob = float(row.gather(-1, target[:, None]).sum())
            answer = (logprob, bool((row.argmax(-1) == target).all()))
            if key is not None:  # rolling windows are cached per document instead
                self.cache_hook.add_partial("loglikelihood", key, answer)
            answers.append(answer)
        return answers

    def loglikelihood_rolling(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[float]:
        """Each text scored in disjoint windows of the model's length (lm-eval's convention);
        windows of all texts are batched together."""
        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            pairs = get_rolling_token_windows(
                self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1
            )
            for ctx, cont in map(make_disjoint_window, pairs):
                windows.append((None, ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm, kind="loglikelihood_rolling")
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, scores):
            totals[i] += logprob
        for r, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
        return totals

    # -- records ----------------------------------------------------------------------------------
    def get_model_info(self) -> dict:
        """Added by lm-eval to `results["config"]`: what was run, what it skipped, where."""
        tokens, seconds = self._decode["tokens"], self._decode["seconds"]
        return {
            "bwprune": {
                "model": str(self.cfg.model.name),
                "method": method_name(self.cfg),
                "target_sparsity": float(self.cfg.method.get("sparsity", 0.0)),
                "batch_size": self.batch_size,
                "realized_sparsity": combine(self._sparsity),
                "scoring_forwards": dict(self._forwards),
                "scoring_sparsity": combine(self._scoring_sparsity),
                "decode_tokens_per_s": tokens / seconds if seconds else 0.0,
                "config": OmegaConf.to_container(self.cfg, resolve=True),
                "provenance": provenance(int(self.cfg.seed), str(self._device)),
            }
        }

    def _log_sparsity(self) -> None:
        s = combine(self._sparsity)
        log.info(
            "%s: realized sparsity ffn %.3f params %.3f over %d decode steps",
            method_name(self.cfg), s["ffn"], s["params"], s["decode_steps"],
        )  # fmt: skip

    def _bar(self, total: int, kind: str, disable: bool) -> tqdm:
        return tqdm(total=total, desc=f"bwprune {kind}", disable=disable or not self.cfg.progress)
