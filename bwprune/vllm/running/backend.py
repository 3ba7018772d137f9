"""`generation.backend=vllm`: vLLM generates a run's batches and streams
(`bwprune.generation.evaluate.Backend`); quality is still teacher-forced through the HF runner.

Chosen where a run is composed (`bwprune.experiment`), so the generation package never imports
this one: this package builds on it (`bwprune.vllm.running.runner`), not the other way round."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from omegaconf import DictConfig

from bwprune.generation.evaluate import BatchProgress, Finisher
from bwprune.generation.prepared import PreparedModel
from bwprune.generation.runner import BatchedRunner
from bwprune.vllm.running.runner import VLLMPairedTiming, VLLMRunner, vllm_engines


class VLLMBackend:
    def engines(
        self,
        cfg: DictConfig,
        prepared: PreparedModel,
        runner: BatchedRunner,
        batches: list,
        timed: bool,
    ) -> tuple[VLLMRunner, VLLMPairedTiming | None]:
        return vllm_engines(cfg, prepared, runner, batches, timed)

    def stream(self, cfg: DictConfig, prepared: PreparedModel, runner: BatchedRunner,
               batches: list, prompts: Sequence[torch.Tensor], on_finish: Finisher,
               progress: BatchProgress) -> None:  # fmt: skip
        engine = vllm_engines(cfg, prepared, runner, batches, timed=False)[0]
        engine.stream(list(prompts), on_finish, progress)
