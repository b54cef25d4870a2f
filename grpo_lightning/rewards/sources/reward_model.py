"""A learned reward model: any ``AutoModelForSequenceClassification`` in a local folder scores
prompt + completion (``task.rewards={reward_model: 1.0}``, ``rewards.reward_model.path=DIR``).

The text scored is the conversation when the reward model's tokenizer has a chat template (the
prompt as the user's turn, the completion as the assistant's, the way reward models such as
Skywork's and ArmoRM are trained), else prompt and completion joined. The model runs in eval
mode without gradients, in batches, in its own dtype and on its own device (the policy's GPU or
another), and the score is one logit (``label``). Several reward models: register more instances
(module docstring of :mod:`.base`).

Every weight of the classifier must come from the folder: a folder whose checkpoint lacks one
(a causal language model has no ``score`` head) would load with it freshly initialised and score
at random, so it is refused, naming the folder and the weights. A text longer than
``max_length`` tokens loses its start; each batch logs how many did (``reward/reward_model/truncated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_lightning.config.base import Schema, check, choice, option
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.sources.base import register_source
from grpo_lightning.rewards.sources.text import message_text

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RewardModelOptions(Schema):
    """A sequence-classification reward model from a local folder."""

    path: str = option("", "Folder of an AutoModelForSequenceClassification with its tokenizer (save_pretrained).")
    device: str = option("auto", "Where it runs: auto (cuda:0 if there is a GPU, else cpu), cpu, cuda, cuda:1, ...")
    dtype: str = option("float32", "Its weights' dtype: float32, bfloat16 or float16.")
    batch_size: int = option(16, "Completions scored per forward pass.")
    max_length: int = option(
        2048, "Tokens kept per prompt + completion; a longer text loses its start (counted: reward_model/truncated)."
    )
    label: int = option(0, "Which output logit is the reward (num_labels > 1: e.g. 1 for a 'good' class).")
    chat_template: bool = option(True, "Score the conversation in the tokenizer's chat template when it has one.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}dtype", self.dtype, list(DTYPES))
        check(problems, self.batch_size >= 1, f"{p}batch_size={self.batch_size} must be >= 1")
        check(problems, self.max_length >= 2, f"{p}max_length={self.max_length} must be >= 2")
        check(problems, self.label >= 0, f"{p}label={self.label} must be >= 0")
        check(
            problems,
            not self.path or (Path(self.path).expanduser() / "config.json").is_file(),
            f"{p}path={self.path!r} is not a model folder (no config.json): give a local folder written by "
            "save_pretrained (model and tokenizer)",
        )
        return problems


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@register_source("reward_model", options=RewardModelOptions)
class RewardModelReward:
    """A TRL reward function backed by a sequence-classification model."""

    bounds_itself = True  # by its options, or by compute alone: task.reward_timeout_s leaves it alone

    def __init__(self, options: RewardModelOptions):
        folder = Path(options.path).expanduser()
        if not options.path or not (folder / "config.json").is_file():
            raise ConfigError(
                f"rewards.reward_model.path={options.path!r} is not a model folder (no config.json): "
                "give a local folder written by save_pretrained (model and tokenizer)"
            )
        from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415  (model classes: seconds, only when used)

        self.options = options
        self.device = resolve_device(options.device)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.truncation_side = "left"
        self.model, loaded = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=DTYPES[options.dtype], output_loading_info=True
        )
        fresh = sorted({*loaded.get("missing_keys", ()), *(str(k[0]) for k in loaded.get("mismatched_keys", ()))})
        if fresh:
            raise ConfigError(
                f"rewards.reward_model.path={options.path!r} has no trained weights for {fresh[:4]}"
                f"{f' and {len(fresh) - 4} more' if len(fresh) > 4 else ''}: they would be initialised at random and "
                "score at random; give a folder saved from a trained sequence-classification reward model (a causal "
                "language model has no reward head)"
            )
        self.model.to(self.device).eval().requires_grad_(False)
        if self.tokenizer.pad_token_id is None:  # batching needs one; the classifier reads the last real token
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if options.label >= self.model.config.num_labels:
            raise ConfigError(
                f"rewards.reward_model.label={options.label} but the model has {self.model.config.num_labels} labels"
            )
        self.use_template = options.chat_template and bool(getattr(self.tokenizer, "chat_template", None))

    def text(self, prompt: Any, completion: Any) -> str:
        """What the model reads: the conversation in its chat template, or prompt + completion."""
        answer = message_text(completion)
        if self.use_template:
            messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            messages.append({"role": "assistant", "content": answer})
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return message_text(prompt) + answer

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        texts = [self.text(p, c) for p, c in zip(prompts, completions, strict=True)]
        log_metric = columns.get("log_metric")
        if callable(log_metric):
            lengths = self.tokenizer(texts, add_special_tokens=not self.use_template)["input_ids"]
            log_metric("reward_model/truncated", float(sum(len(ids) > self.options.max_length for ids in lengths)))
        scores: list[float] = []
        for start in range(0, len(texts), self.options.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.options.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.options.max_length,
                add_special_tokens=not self.use_template,  # the template wrote them already
            ).to(self.device)
            logits = self.model(**batch).logits[:, self.options.label]
            scores += logits.float().cpu().tolist()
        return scores
