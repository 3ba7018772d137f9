"""Offline calibration shared by the baselines that calibrate (TEAL, CATS, Wanda).

`LayerStream` pushes calibration windows through the decoder one layer at a time, as TEAL's
`teal/grab_acts.py` and Wanda's `prune_wanda` do: layer l's inputs are layer l-1's outputs, so a
method can observe a layer with hooks, change its weights, and only then produce the next layer's
inputs (Wanda: pruned outputs feed the next layer's calibration). Only one layer's activations are
alive at a time, which keeps TEAL's whole-tensor histograms affordable. `calibration_artifact`
caches what a method computes from the stream through `bwprune.methods.calibration`. Nothing here
knows a particular method.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError
from bwprune.methods.calibration import artifact_dir, cached_tensors, calibration_windows
from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import ModelAdapter


class _Caught(Exception):
    """Raised by the capture hook: the model's forward stops at layer 0's input."""

    def __init__(self, hidden: torch.Tensor, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.hidden, self.kwargs = hidden, kwargs


class LayerStream:
    """Hidden states of calibration windows entering one decoder layer, advanced layer by layer.

    Layer 0's inputs and call arguments (attention mask, rotary embeddings, ...) are captured from
    one stopped model forward per chunk of windows and reused for every layer, as Wanda's
    `prepare_calibration_input` does; so every layer must take the same attention mask.
    """

    def __init__(
        self, model: nn.Module, adapter: ModelAdapter, windows: torch.Tensor, batch_size: int = 4
    ) -> None:
        layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if len(layer_types) > 1:
            raise UserError(
                f"layer-by-layer calibration needs one attention type for all layers, "
                f"got {sorted(layer_types)}"
            )
        self.layers = adapter.layers
        self.hidden: list[torch.Tensor] = []  # (b, T, D) per chunk
        self.kwargs: list[dict[str, Any]] = []
        device = next(model.parameters()).device

        def catch(module: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Caught(args[0], kwargs)

        with HookSet() as hooks, torch.no_grad():
            hooks.forward_pre(self.layers[0], catch, with_kwargs=True)
            for chunk in windows.split(batch_size):
                try:
                    model(input_ids=chunk.to(device), use_cache=False)
                except _Caught as caught:
                    self.hidden.append(caught.hidden)
                    self.kwargs.append(caught.kwargs)

    @torch.no_grad()
    def forward(self, index: int) -> list[torch.Tensor]:
        """Layer `index` applied to the current hidden states (hooks on it fire); no update."""
        outputs = []
        for hidden, kwargs in zip(self.hidden, self.kwargs):
            out = self.layers[index](hidden, **kwargs)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return outputs

    def advance(self, index: int) -> None:
        """Replace the hidden states by layer `index`'s outputs: the next layer's inputs."""
        self.hidden = self.forward(index)


def _text_digest(path: Path) -> str:
    if not path.exists():
        raise UserError(f"calibration text file {str(path)!r} does not exist")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def calibration_artifact(
    method: str,
    model: nn.Module,
    adapter: ModelAdapter,
    tokenizer: PreTrainedTokenizerBase,
    calibration: Mapping,
    cache_dir: str | None,
    key: dict,
    compute: Callable[[LayerStream], dict[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """`compute(stream)` over the configured calibration windows, cached on disk and reused.

    The cache key is the model fingerprint, `key` (the method arguments the artifact depends
    on), the window arguments and the text file's content hash; tensors come back on the model's
    device.
    """
    cal = {k: v for k, v in dict(calibration).items() if k != "cache_dir"}
    text = Path(cal["text_file"])
    full_key = {**key, **cal, "text_file": text.name, "text_sha256": _text_digest(text)}
    folder = artifact_dir(cache_dir or calibration["cache_dir"], method, model, full_key)

    def build() -> dict[str, torch.Tensor]:
        windows = calibration_windows(
            tokenizer, text, cal["num_sequences"], cal["seq_len"], cal["seed"]
        )
        return compute(LayerStream(model, adapter, windows))

    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in cached_tensors(folder, full_key, build).items()}
