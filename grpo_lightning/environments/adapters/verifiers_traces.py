"""verifiers 0.4 traces (``Trace.to_record()``) -> a :class:`~grpo_lightning.records.RolloutBatch`.

A trace's message graph holds each message's token ids as the client rendered or sampled them
(``nodes[i].token_ids``), which of them the model sampled (``mask``) and the engine's log-prob of
each sampled one (``logprobs``, in order). A branch (a root-to-leaf path) is one training
sample: the ids before its first sampled token are the prompt, the rest the completion, with
loss mask 1 exactly on the sampled ids and the log-probs spread onto them (0 elsewhere), as
verifiers' own ``Branch.logprobs`` does. Nothing is re-tokenized. Each token's turn is the number
of sampled spans before it (an environment reply carries the turn it answers, as in our episodes).

A trace whose episode failed (``ok`` false: an error, a timeout) keeps its row with loss mask 0
and ``failed_reward``, never dropped, so groups keep their size. A trace with several trainable
branches (a compaction, sub-agents) is refused: one trace is one sample here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.records import Completion, RolloutBatch


@dataclass
class TraceSample:
    """One trace as our tokens: the prompt and the completion (loss mask, log-probs, turns)."""

    prompt_ids: list[int]
    completion: Completion
    reward: float
    failed: bool


def branch_path(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's one root-to-leaf path of nodes (``ValueError`` when it has several or none)."""
    nodes = record["nodes"]
    parents = {node["parent"] for node in nodes if node.get("parent") is not None}
    leaves = [i for i in range(len(nodes)) if i not in parents]
    if len(leaves) != 1:
        raise ValueError(f"trace {record.get('id')} has {len(leaves)} branches; one trace must be one sample")
    path, current = [], leaves[0]
    while current is not None:
        path.append(nodes[current])
        current = nodes[current].get("parent")
    return path[::-1]


def branch_tokens(path: list[dict[str, Any]]) -> tuple[list[int], list[int], list[float]]:
    """Ids, sampled mask and per-token log-probs (0 off the sampled ids) of a path of nodes."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for node in path:
        node_ids, node_mask = list(node["token_ids"]), [int(bool(m)) for m in node["mask"]]
        values = list(node.get("logprobs") or [])
        if len(node_mask) != len(node_ids):
            raise ValueError(f"a node has {len(node_mask)} mask entries for {len(node_ids)} token ids")
        if values and len(values) != sum(node_mask):
            raise ValueError(f"a node has {len(values)} log-probs for {sum(node_mask)} sampled tokens")
        sampled = iter(values)
        ids += node_ids
        mask += node_mask
        logprobs += [next(sampled, 0.0) if m else 0.0 for m in node_mask]
    return ids, mask, logprobs


def trace_sample(record: dict[str, Any]) -> TraceSample:
    """One trace record as a prompt and a completion, its reward and whether it failed."""
    ids, mask, logprobs = branch_tokens(branch_path(record))
    if 1 not in mask:
        raise ValueError(f"trace {record.get('id')} has no sampled token")
    start = mask.index(1)
    turns, turn = [], -1
    for k in range(start, len(ids)):
        turn += int(mask[k] == 1 and (k == start or mask[k - 1] == 0))
        turns.append(turn)
    calls = [call for call in record.get("calls", []) if call.get("error") is None]
    finished = bool(calls) and calls[-1].get("finish_reason") == "stop"
    failed = not record.get("ok", False)
    loss_mask = [0] * (len(ids) - start) if failed else mask[start:]
    reward = sum(r["score"] * r.get("weight", 1.0) for r in (record.get("rewards") or {}).values() if r is not None)
    completion = Completion(ids[start:], finished, logprobs=logprobs[start:], loss_mask=loss_mask, turn_ids=turns)
    return TraceSample(ids[:start], completion, float(reward), failed)


def traces_to_batch(
    records: list[dict[str, Any]],
    group_size: int,
    pad_id: int,
    max_new_tokens: int,
    temperature: float,
    step: int = 0,
    failed_reward: float = 0.0,
) -> RolloutBatch:
    """The batch of ``records`` laid out group after group (``group_size`` traces of one task each)."""
    samples = [trace_sample(record) for record in records]
    completions = [s.completion for s in samples]
    prompt_ids, prompt_mask = RolloutBatch.pad_prompts([s.prompt_ids for s in samples], pad_id)
    completion_ids, completion_mask, finished, logprobs = RolloutBatch.pad_completions(completions, pad_id)
    rewards = torch.tensor([failed_reward if s.failed else s.reward for s in samples], dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        rewards=rewards,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        step=step,
        reward_components={"verifiers": rewards.clone()},
        finished=finished,
        engine_logprobs=logprobs,
        episode_ids=torch.arange(len(samples)),
        **RolloutBatch.pad_token_fields(completions),
    )
