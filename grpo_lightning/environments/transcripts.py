"""An episode as a reader wants it: turn by turn, with the ids and the mask the step trained on.

One plain-data record per episode (``RolloutBatch.episodes``; a line of completions.jsonl, the
``turns`` column of the wandb table): the prompt, then each model turn and each environment reply
as ``{role, text, tokens, loss_mask}``. ``tokens`` are the ids of the sequence exactly as trained
(never re-encoded), ``text`` their decoding with the special tokens shown, ``loss_mask`` the mask
the loss used on them (0 for the prompt, the environment's replies and the template's text; 1
for the ids the model sampled, 0 for those of a failed episode). A model turn adds the sum of
the engine's log-probs of its ids and its tool calls with their outcome kinds; a reply adds the
environment's chat messages. The last reply of an episode the environment ended is never
appended to the ids: it is shown with no tokens. Then the stop reason, turns, tool outcomes,
rewards, the environment's info and the seeds that replay the episode.

Tool outcomes per episode: :func:`grpo_lightning.environments.outcomes.tool_outcomes`.
"""

from __future__ import annotations

from typing import Any

from grpo_lightning.environments.episode import Episode
from grpo_lightning.environments.outcomes import tool_outcomes
from grpo_lightning.records import Completion

ASSISTANT, ENVIRONMENT, PROMPT = "assistant", "environment", "prompt"


def segments(episode: Episode, trained: list[int]) -> list[tuple[int, int, int, int]]:
    """(start, end, turn, sampled) of each run of ids after the prompt with one turn, one author and one
    trained mask (``trained``: the loss mask the step used)."""
    key = lambda j: (episode.turn_ids[j], episode.loss_mask[j], trained[j])  # noqa: E731
    out: list[tuple[int, int, int, int]] = []
    start, n = 0, len(episode.ids)
    for i in range(1, n + 1):
        if i == n or key(i) != key(start):
            out.append((start, i, episode.turn_ids[start], episode.loss_mask[start]))
            start = i
    return out


def replies(episode: Episode) -> list[list[dict]]:
    """The environment's messages after each model turn (from the conversation: what follows each
    assistant message up to the next)."""
    out: list[list[dict]] = []
    for message in episode.completion_messages:
        if message.get("role") == ASSISTANT:
            out.append([])
        elif out:
            out[-1].append({"role": message.get("role"), "content": message.get("content")})
    return out


def episode_record(episode: Episode, completion: Completion, tokenizer: Any, env_reward: float) -> dict[str, Any]:
    """The reader's record of one episode (see the module docstring); ``completion``: what the step
    trained on (its loss mask)."""
    trained = list(completion.loss_mask) if completion.loss_mask is not None else [1] * len(episode.ids)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    turns: list[dict[str, Any]] = [
        {"role": PROMPT, "text": decode(episode.prompt_ids), "tokens": list(episode.prompt_ids), "loss_mask": 0}
    ]
    said = replies(episode)
    shown: set[int] = set()
    for start, end, turn, sampled in segments(episode, trained):
        ids = episode.ids[start:end]
        entry: dict[str, Any] = {
            "role": ASSISTANT if sampled else ENVIRONMENT,
            "text": decode(ids),
            "tokens": list(ids),
            "loss_mask": trained[start],
        }
        if sampled:
            if episode.engine_logprobs:
                entry["logprob_sum"] = float(sum(episode.logprobs[start:end]))
            entry["tool_calls"] = _calls(episode, turn)
        elif turn not in shown and turn < len(said):
            entry["messages"] = said[turn]
            shown.add(turn)
        turns.append(entry)
    last = episode.num_turns - 1
    if last >= 0 and last not in shown and last < len(said) and said[last]:  # the reply that ended it
        turns.append({"role": ENVIRONMENT, "text": "", "tokens": [], "loss_mask": 0, "messages": said[last]})
    return {
        "turns": turns,
        "stop_reason": episode.stop_reason,
        "num_turns": episode.num_turns,
        "tool_outcomes": dict(tool_outcomes(episode)),
        "env_reward": env_reward,
        "step_rewards": list(episode.step_rewards),
        "error": episode.error or None,
        "env_info": {k: v for k, v in episode.info.items() if k != "episode_tool_totals"},
        "reset_seed": episode.reset_seed,
        "sample_seed": episode.sample_seed,
    }


def _calls(episode: Episode, turn: int) -> list[dict[str, Any]]:
    """The tool calls of model turn ``turn`` with their outcomes (the environment's ``tool_outcomes``
    when it reports them, else the calls the runner parsed, outcome unknown)."""
    info = episode.step_infos[turn] if turn < len(episode.step_infos) else {}
    if "tool_outcomes" in info:
        return list(info["tool_outcomes"])
    messages = [m for m in episode.completion_messages if m.get("role") == ASSISTANT]
    parsed = messages[turn].get("tool_calls", []) if turn < len(messages) else []
    return [{**call.get("function", call), "outcome": None} for call in parsed]


def turns_text(record: dict[str, Any]) -> str:
    """The turns after the prompt as one readable string (the wandb table's ``turns`` cell): ``[role mask] text``
    per turn, the environment's last reply as its messages."""
    lines = []
    for t in record["turns"]:
        if t["role"] != PROMPT:
            text = t["text"] if t["tokens"] else " ".join(str(m.get("content")) for m in t.get("messages", []))
            lines.append(f"[{t['role']} {t['loss_mask']}] {text}")
    return "\n".join(lines)
