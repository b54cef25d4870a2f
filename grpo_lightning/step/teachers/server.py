"""``kind=server``: a teacher behind a vLLM server (``algorithm.teacher.server.*``), for teachers
too large for the trainer's devices: scale-out.

Each sequence (the student's prompt and completion token ids, never re-rendered text) is sent as a
prompt with ``max_tokens=1`` and ``prompt_logprobs=1``: vLLM answers, at every prompt position, the
log-prob of the token there and its top-1 token (the teacher's argmax). Requests run
``concurrency`` at a time. vLLM computes prompt log-probs from the raw logits, without a
temperature: the run is refused unless ``rollout.temperature=1`` (config/teacher.py). The teacher
returns the sampled tokens' log-probs only, so it serves the advantage-form objective
(``reverse_kl``), not a divergence of full distributions.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.records import RolloutBatch, TokenLogProbs
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_server_client import ServerClient
from grpo_lightning.step.teacher import TeacherScores


def scored_tokens(prompt_logprobs: list, sequence: list[int], first: int) -> tuple[list[float], list[int]]:
    """(log-prob of each token from ``first`` on, the top-1 token there) out of vLLM's
    ``prompt_logprobs`` (per position, ``{token id: {"logprob", "rank"}}``; None at position 0)."""
    logps, best = [], []
    for i in range(first, len(sequence)):
        entries = prompt_logprobs[i] or {}
        mine = entries.get(str(sequence[i]))
        if mine is None:
            raise VLLMServerError(
                f"the teacher server's prompt_logprobs have no entry for token {sequence[i]} at position {i}"
            )
        logps.append(float(mine["logprob"]))
        ranked = [int(k) for k, v in entries.items() if isinstance(v, dict) and v.get("rank") == 1]
        best.append(ranked[0] if ranked else -1)
    return logps, best


def teacher_client(cfg, timeout_s: float | None = None) -> ServerClient:
    """A client of ``algorithm.teacher.server`` (``cfg``: a TrainConfig), with its API key if one is named."""
    s = cfg.algorithm.teacher.server
    token = os.environ.get(s.api_key_env) if s.api_key_env else None
    return ServerClient(s.url.rstrip("/"), timeout_s or s.timeout_s, s.concurrency, token=token)


class ServerTeacher:
    name = "server"

    def __init__(self, client: ServerClient, concurrency: int):
        self.client = client
        self.concurrency = concurrency
        self._model_name: str | None = None

    @classmethod
    def from_config(cls, cfg, tokenizer, policy, formatter=None) -> ServerTeacher:
        return cls(teacher_client(cfg), cfg.algorithm.teacher.server.concurrency)

    def bind(self, policy, reference) -> None:
        """Nothing to share with the module: the teacher lives in the server."""

    def _one(self, prompt: list[int], completion: list[int]) -> tuple[list[float], list[int]]:
        if self._model_name is None:
            self._model_name = self.client.served_model()
        sequence = prompt + completion
        body = {
            "model": self._model_name,
            "prompt": sequence,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 1,
            "n": 1,
        }
        choice = self.client.call("POST", "/v1/completions", "a teacher scoring request", json=body)["choices"][0]
        return scored_tokens(choice["prompt_logprobs"], sequence, len(prompt))

    def score(
        self, rollout: RolloutBatch, batches: list[MicroBatch], need_rows: bool, need_argmax: bool
    ) -> TeacherScores:
        home = rollout.completion_ids.device
        prompts = [
            row[m.bool()].tolist() for row, m in zip(rollout.prompt_ids.cpu(), rollout.prompt_mask.cpu(), strict=True)
        ]
        completions = [
            row[m.bool()].tolist()
            for row, m in zip(rollout.completion_ids.cpu(), rollout.completion_mask.cpu(), strict=True)
        ]
        with ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(self._one, prompts, completions))
        shape = rollout.completion_ids.shape
        logp = torch.zeros(shape)
        argmax = torch.full(shape, -1, dtype=torch.long)
        for i, (values, best) in enumerate(answers):
            logp[i, : len(values)] = torch.tensor(values)
            argmax[i, : len(best)] = torch.tensor(best, dtype=torch.long)
        finite = torch.isfinite(logp)
        logp = torch.where(finite, logp, 0.0)
        return TeacherScores(
            TokenLogProbs(logp.to(home), None, finite.to(home)), argmax.to(home) if need_argmax else None
        )
