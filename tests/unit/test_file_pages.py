"""A checkpoint tensor's file pages leave the resident set once released (by a loader, or by the
calibration fingerprint that read them); nothing else does."""

import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import PretrainedConfig

from bwprune.methods.calibration import model_fingerprint
from bwprune.models.file_pages import FilePages, released

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise")


def _rss_file_kib() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssFile:"))
    return int(line.split()[1])


@pytest.fixture
def checkpoint(tmp_path):
    weights = {f"w{i}": torch.randn(1024, 1024, generator=torch.Generator().manual_seed(i))
               for i in range(4)}  # fmt: skip
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    return path, weights


def test_released_pages_leave_the_resident_set_and_fault_back_intact(checkpoint):
    path, weights = checkpoint
    with safe_open(str(path), framework="pt") as f:
        loaded = {name: f.get_tensor(name) for name in weights}
        before = _rss_file_kib()
        for tensor in loaded.values():
            tensor.sum()  # touch every page: now resident
        touched = _rss_file_kib()
        assert touched - before > 12 * 1024  # 16 MiB of file pages came in
        names = [name for name, _ in released(loaded.items())]
        assert _rss_file_kib() < touched - 12 * 1024
        assert names == list(weights)
        for name, tensor in loaded.items():  # read again: faulted back from the file
            assert torch.equal(tensor, weights[name])


def test_anonymous_memory_is_never_dropped():
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    assert FilePages().release(tensor) is False
    assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.float32))


def test_a_model_fingerprint_leaves_the_pages_it_read_out_of_the_resident_set(checkpoint):
    """The fingerprint sums a model's first and last tensors (the embedding and the output
    matrix of an LLM): mapped from a checkpoint, they must not stay resident beside vLLM's copy."""
    path, weights = checkpoint
    with safe_open(str(path), framework="pt") as f:
        model = nn.Module()
        model.config = PretrainedConfig()
        for name in weights:
            model.register_parameter(name, nn.Parameter(f.get_tensor(name), requires_grad=False))
        before = _rss_file_kib()
        first = model_fingerprint(model)
        assert _rss_file_kib() - before < 2 * 1024  # 8 MiB read, dropped again
        assert model_fingerprint(model) == first  # read back intact from the file
