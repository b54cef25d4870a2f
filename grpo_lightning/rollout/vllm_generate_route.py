"""vLLM's token-in/token-out route, ``/inference/v1/generate``: its address and how to read its answers.

A launched server runs with ``--enable-scale-out``, which serves it. The pipeline sends every request
there (:mod:`grpo_lightning.rollout.pipeline.vllm_engine`); the server engine sends a prompt with images
there (:mod:`grpo_lightning.rollout.vllm_server`). Each answer carries the sampled token ids, the log-prob
each was sampled with and vLLM's ``weight_versions`` spans.
"""

from __future__ import annotations

from grpo_lightning.records import Completion
from grpo_lightning.rollout.server_guard import VLLMServerError

GENERATE = "/inference/v1/generate"
SCALE_OUT_HINT = " (a server started by hand needs --enable-scale-out for /inference/v1/generate)"


def token_versions(spans: list[dict] | None, n: int) -> list[int]:
    """Each of ``n`` tokens' version from vLLM's ``weight_versions`` spans (``[start, end)`` and a label);
    -1 where the label is not a number (a server that never took weights says ``default``) or absent."""
    versions = [-1] * n
    for span in spans or []:
        label = str(span["version"])
        version = int(label) if label.lstrip("-").isdigit() else -1
        for i in range(max(int(span["start"]), 0), min(int(span["end"]), n)):
            versions[i] = version
    return versions


def parse_choice(choice: dict) -> Completion:
    """One ``/inference/v1/generate`` choice as a :class:`Completion` with per-token versions (its
    ``weight_version`` the oldest of them, as the HF engine's)."""
    tokens = [int(t) for t in choice["token_ids"]]
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(tokens):
        raise VLLMServerError(
            f"the vLLM server answered {len(tokens)} tokens with {len(content)} log-probs (asked for logprobs=0)"
        )
    versions = token_versions(choice.get("weight_versions"), len(tokens))
    known = [v for v in versions if v >= 0]
    return Completion(
        token_ids=tokens,
        finished=choice.get("finish_reason") == "stop",
        logprobs=[float(c["logprob"]) for c in content],
        weight_version=min(known) if known else None,  # the oldest: what a sequence-level bound reads
        token_weight_versions=versions if known else None,
    )
