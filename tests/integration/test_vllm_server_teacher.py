"""A teacher behind a real vLLM server (step/teachers/server.py, the session's launched server): its
prompt log-probs of the student's tokens equal the same teacher's log-softmax in the trainer at
temperature 1, its top-1 is the teacher's argmax, and /tokenize answers the start-up check."""

from __future__ import annotations

import pytest
import torch
from conftest import make_config

from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout.vllm_server_client import ServerClient
from grpo_lightning.step.teachers.checks import _server_probe
from grpo_lightning.step.teachers.server import ServerTeacher


@pytest.mark.slow
def test_served_log_probs_are_the_teachers_own(vllm_server, rollout):
    tokenizer = build_char_tokenizer()
    teacher = build_tiny_policy(tokenizer, seed=11).eval()
    vllm_server.load_weights(teacher.state_dict().items(), version=41)
    client = ServerClient(vllm_server.client.url, 60.0, 4, token=vllm_server.server.token)
    try:
        scores = ServerTeacher(client, concurrency=4).score(rollout, [], need_rows=False, need_argmax=True)
    finally:
        client.close()
    mask = rollout.completion_mask.bool()
    for row in range(rollout.num_sequences):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()]
        completion = rollout.completion_ids[row][mask[row]]
        ids = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            logits = teacher(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
        want = torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]
        got = scores.logprobs.logp[row, : len(completion)].double()
        assert torch.allclose(got, want, atol=1e-3), (row, got, want)
        top2 = logits.topk(2).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-3  # a near tie may fall either way in another kernel
        assert torch.equal(scores.argmax[row, : len(completion)][clear], logits.argmax(-1)[clear])


def test_the_tokenizer_probe_reads_the_servers_tokenizer_and_context(vllm_server, monkeypatch):
    cfg = make_config(1, **{"algorithm.teacher.kind": "server", "algorithm.teacher.server.url": vllm_server.client.url})
    monkeypatch.setenv("GRPO_TEST_TEACHER_KEY", vllm_server.server.token)
    cfg.algorithm.teacher.server.api_key_env = "GRPO_TEST_TEACHER_KEY"
    assert _server_probe(cfg, build_char_tokenizer(), "12+30=") == 128
