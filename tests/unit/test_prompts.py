"""Prompts (bwprune/generation/prompts.py): the chat the model is given, and the left-padded
token batch every forward takes."""

import pytest
import torch
from omegaconf import OmegaConf

from bwprune.benchmarks.base import Example
from bwprune.generation.prompts import batch_prompts, left_pad, render_messages, render_prompt


class TemplateSpy:
    """Renders a chat as `role: content` lines and remembers the template options it got."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        self.kwargs = kwargs
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return text + ("\nassistant:" if add_generation_prompt else "")


def model_cfg(**kw):
    return OmegaConf.create({"chat_template": True, "system_prompt": None,
                             "chat_template_kwargs": {}} | kw)  # fmt: skip


def test_rows_are_right_aligned_after_padding():
    ids, attn = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == attn.dtype == torch.long


def test_a_given_width_pads_tensor_rows_further_and_never_cuts_one():
    ids, attn = left_pad([torch.tensor([3, 4]), torch.tensor([9])], pad_id=1, width=4)
    assert ids.tolist() == [[1, 1, 3, 4], [1, 1, 1, 9]] and attn.sum(dim=1).tolist() == [2, 1]
    with pytest.raises(ValueError, match="does not fit width 1"):
        left_pad([[3, 4]], pad_id=1, width=1)


def test_a_model_without_a_chat_template_gets_the_question_as_is():
    assert render_prompt(TemplateSpy(), model_cfg(chat_template=False), "2+3?") == "2+3?"


def test_the_system_prompt_and_template_options_come_from_the_model_config():
    spy = TemplateSpy()
    cfg = model_cfg(system_prompt="Be brief.", chat_template_kwargs={"enable_thinking": False})
    assert render_prompt(spy, cfg, "2+3?") == "system: Be brief.\nuser: 2+3?\nassistant:"
    assert spy.kwargs == {"continue_final_message": False, "enable_thinking": False}
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Hi"}]
    assert render_messages(spy, cfg, own, add_generation_prompt=False) == "system: Mine.\nuser: Hi"
    assert spy.kwargs["continue_final_message"] is True  # an unfinished turn is continued


def test_a_batch_has_one_prompt_per_example_and_sample():
    first, second = Example(0, "a", "Q0", "1"), Example(1, "b", "Q1", "2")
    batch = [(first, 0), (first, 1), (second, 0)]
    assert batch_prompts(TemplateSpy(), model_cfg(chat_template=False), batch) == ["Q0", "Q0", "Q1"]
