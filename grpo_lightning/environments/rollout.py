"""Episodes as a training step's generation batch: the runner's episodes -> a scored ``RolloutBatch``.

Plugged into the module's :class:`~grpo_lightning.rollout.generator.RolloutGenerator` as its
``episodes`` (set by ``build_run`` when the task names an environment): the generator keeps
its engine, tokenizer, scorer, seeds and weight sync; only what a step generates changes.
A group is the G episodes of one prompt, all reset with the group's seed (run seed, rank,
step, prompt), each sampling from its own seed (run seed, rank, step, prompt, sample).

The batch's per-episode metrics go out as ``rollout/episodes/*`` (in ``RolloutBatch.timing``,
which the module logs and the episode health checks read): turns, tool calls, parse errors,
sampled and environment tokens, failures, the count of each stop reason, and the tools' outcome
kinds (``environments/outcomes.py``). Each episode also goes into the batch turn by turn
(``RolloutBatch.episodes``, ``environments/transcripts.py``): completions.jsonl and the wandb table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from grpo_lightning.data.vision_prompting import display_text
from grpo_lightning.environments import aggregators, rewards  # noqa: F401  (register the built-ins)
from grpo_lightning.environments.base import ENVIRONMENTS, REWARD_AGGREGATORS, TOOL_PARSERS, Environment
from grpo_lightning.environments.episode import Episode, EpisodeRunner, ToolParser
from grpo_lightning.environments.images import EpisodeImages
from grpo_lightning.environments.limits import DONE, STOP_REASONS, EpisodeLimits
from grpo_lightning.environments.outcomes import outcome_metrics
from grpo_lightning.environments.parsers import AUTO
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.template_checks import resolve_chat_template, startup_report
from grpo_lightning.environments.transcripts import episode_record
from grpo_lightning.environments.truncation import INFO as TRUNCATED_REWARD
from grpo_lightning.records import Completion, RolloutBatch, VisionInputs
from grpo_lightning.rewards.scorer import RewardState
from grpo_lightning.rollout.seeding import group_seeds, sample_seed

METRICS = "rollout/episodes/"
log = logging.getLogger(__name__)


def reset_seed(run_seed: int, rank: int, step: int, prompt_index: int) -> int:
    """The reset seed of a group: one per (run seed, rank, step, prompt), shared by its G episodes."""
    return sample_seed(run_seed, rank, step, prompt_index, -1)


class EpisodeRollout:
    """Generates a step's batch by playing episodes (``RolloutGenerator.episodes``)."""

    def __init__(
        self,
        make_env: Callable[[dict], Environment],
        limits: EpisodeLimits,
        renderer: ChatRenderer,
        parser: ToolParser | None = None,
        aggregator: str = "sum",
        failed_reward: float = 0.0,
        env_name: str = "",
        images: EpisodeImages | None = None,
    ):
        self.make_env, self.limits, self.renderer, self.parser = make_env, limits, renderer, parser
        self.images = images  # a vision-language policy's: the environments' pictures (environments/images.py)
        self.aggregate = REWARD_AGGREGATORS[aggregator]
        self.failed_reward = failed_reward
        self.env_name = env_name  # named in failures and errors
        self.last_episodes: list[Episode] = []  # the latest batch's episodes, for reading and replay
        self._failures_said: set[tuple[str, str]] = set()  # (stop reason, exception type) already shown

    @classmethod
    def from_task(
        cls,
        options: Any,
        tokenizer: Any,
        max_turn_tokens: int,
        context: int | None,
        row: dict[str, Any],
        model_name: str = "",
        images: EpisodeImages | None = None,
    ) -> EpisodeRollout:
        """The episode rollout of an :class:`~grpo_lightning.environments.limits.EpisodeTaskConfig` task.

        Before any step, prints the tool-call parser (configured, or chosen from the template and
        ``model_name``) and the chat template's verdict over the tools an environment reset on ``row``
        offers; warns once about each way the template differs from inference."""
        factory = ENVIRONMENTS[options.environment]
        limits = EpisodeLimits(
            max_turns=options.max_turns,
            max_turn_tokens=max_turn_tokens,
            max_total_tokens=options.max_total_tokens,
            context=context,
            episode_timeout_s=options.episode_timeout_s,
            step_timeout_s=options.step_timeout_s,
        )
        renderer = ChatRenderer(tokenizer, resolve_chat_template(options.chat_template_override))

        def make_env(record: dict) -> Environment:
            return factory(options, record)

        parser, lines = startup_report(
            renderer,
            make_env,
            row,
            getattr(options, "tool_parser", AUTO),
            model_name,
            options.environment,
            options.step_timeout_s,
        )
        for line in lines:
            rank_zero_info(line)
        return cls(
            make_env,
            limits,
            renderer,
            TOOL_PARSERS[parser] if parser else None,
            options.reward_aggregator,
            options.failed_reward,
            options.environment,
            images,
        )

    def play(self, generator: Any, records: list[dict], step: int, rank: int) -> list[Episode]:
        """G episodes per record, prompt-major, over the generator's engine (kept as ``last_episodes``)."""
        self.last_episodes = self.play_only(generator, records, step, rank)
        return self.last_episodes

    def play_only(self, generator: Any, records: list[dict], step: int, rank: int, engine: Any = None) -> list[Episode]:
        """:meth:`play` without touching this object (async mode runs it in a background thread, on ``engine``
        instead of the generator's)."""
        g = generator.num_generations
        rows = [record for record in records for _ in range(g)]
        resets = [reset_seed(generator.seed, rank, step, i) for i in range(len(records)) for _ in range(g)]
        samples = group_seeds(generator.seed, rank, step, len(records), g)
        runner = EpisodeRunner(
            engine or generator.engine,
            self.renderer,
            self.make_env,
            self.limits,
            generator.sampling,
            self.parser,
            env_name=self.env_name,
            images=self.images,
        )
        return runner.run(rows, resets, samples)

    def rollout(self, generator: Any, records: list[dict], step: int, rank: int) -> RolloutBatch:
        start = time.perf_counter()
        episodes = self.play(generator, records, step, rank)
        return self.assemble(generator, records, episodes, step, time.perf_counter() - start)

    def env_reward(self, episode: Episode) -> float:
        final = episode.step_rewards[-1] if episode.stop_reason == DONE and episode.step_rewards else None
        final = episode.info.get(TRUNCATED_REWARD, final)  # a limit ended it: the environment's on_truncated
        return float(self.aggregate(list(episode.step_rewards), final))

    def score(
        self, scorer: Any, rows: list[dict], episodes: list[Episode], completion_ids: list[list[int]], step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The weighted reward of each episode (``rows[i]`` the row episode i played), TRL-style: the first
        messages as prompts, the rest as completions; a failed episode gets ``failed_reward``."""
        fields = {key: [row.get(key) for row in rows] for key in rows[0] if key != "prompt"}
        fields.update(
            env_reward=[self.env_reward(e) for e in episodes],
            messages=[e.messages for e in episodes],
            info=[e.info for e in episodes],
            stop_reason=[e.stop_reason for e in episodes],
            num_turns=[e.num_turns for e in episodes],
            max_new_tokens=[self.limits.horizon()] * len(episodes),
        )
        prompts = [e.messages[: e.num_prompt_messages] for e in episodes]
        total, components = scorer(
            prompts,
            [e.completion_messages for e in episodes],
            fields,
            completion_ids=completion_ids,
            trainer_state=RewardState(global_step=step),
        )
        failed = torch.tensor([e.failed for e in episodes], dtype=torch.bool)
        return torch.where(failed, torch.full_like(total, self.failed_reward), total), components

    def assemble(
        self,
        generator: Any,
        records: list[dict],
        episodes: list[Episode],
        step: int,
        seconds: float,
        completions: list[Completion] | None = None,
    ) -> RolloutBatch:
        """Pad, score and count the episodes into the batch of ``step``; ``completions`` (async mode: after
        the staleness bound masked some tokens) replaces the episodes' own."""
        start = time.perf_counter()
        self.say_failures(episodes, step)
        tokenizer, n = generator.tokenizer, len(episodes)
        rows = [record for record in records for _ in range(generator.num_generations)]
        if completions is None:
            completions = [episode.completion() for episode in episodes]
        pad = tokenizer.pad_token_id
        # An episode that failed before its reset has no prompt; every row needs one prompt token (the
        # position that predicts the first completion token: the training passes pack on it). Its
        # completion is empty and masked out; it stays in its group with the failed reward.
        prompts_ids = [e.prompt_ids or [pad] for e in episodes]
        prompt_ids, prompt_mask = RolloutBatch.pad_prompts(prompts_ids, pad)
        completion_ids, completion_mask, finished, logprobs = RolloutBatch.pad_completions(completions, pad)
        total, components = self.score(generator.scorer, rows, episodes, [c.token_ids for c in completions], step)
        env_rewards = [self.env_reward(e) for e in episodes]
        versions = [c.weight_version for c in completions if c.weight_version is not None]
        timing = {
            "rollout/seconds": seconds,
            "rollout/tokens_per_s": sum(e.sampled_tokens for e in episodes) / max(seconds, 1e-9),
            "rollout/reward_seconds": time.perf_counter() - start,
            **episode_metrics(episodes),
        }
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            rewards=total,
            group_size=generator.num_generations,
            max_new_tokens=self.limits.horizon(),
            temperature=generator.sampling.temperature,
            step=step,
            reward_components=components,
            reward_metrics=generator.scorer.last_logs.metrics,  # what the rewards gave log_metric / log_extra
            reward_extra=generator.scorer.last_logs.extra,
            finished=finished,
            engine_logprobs=logprobs,
            prompts=self.prompt_texts(tokenizer, prompts_ids, episodes),
            completions=tokenizer.batch_decode([c.token_ids for c in completions]),
            timing=timing,
            episode_ids=torch.arange(n),
            episode_limits=asdict(self.limits),  # what the health checks name when a limit cuts
            episodes=[
                episode_record(e, c, tokenizer, r) for e, c, r in zip(episodes, completions, env_rewards, strict=True)
            ],
            weight_version=min(versions) if versions else None,
            vision=episode_vision(episodes) if self.images is not None and self.images.processor is not None else None,
            **RolloutBatch.pad_token_fields(completions),
        )

    def prompt_texts(self, tokenizer: Any, prompts_ids: list[list[int]], episodes: list[Episode]) -> list[str]:
        """The prompts as text; a first observation's pictures shown (and identified) by their hashes."""
        token = self.images.image_token_id if self.images is not None else None
        return [
            display_text(tokenizer, ids, e.vision.inputs(), token)
            if token is not None and e.vision is not None and any(s < len(ids) for s in e.vision.slots)
            else tokenizer.decode(ids)
            for ids, e in zip(prompts_ids, episodes, strict=True)
        ]

    def say_failures(self, episodes: list[Episode], step: int) -> None:
        """The first failure of each kind (stop reason and exception type), once per run: its message
        names the environment, the call, the exception and where it was raised. Later ones are counted
        (``rollout/episodes/failed``) and the ``episode_failures`` check alerts when they are many."""
        failed = [e for e in episodes if e.failed]
        for episode in failed:
            kind = (episode.stop_reason, episode.error_type)
            if kind in self._failures_said:
                continue
            self._failures_said.add(kind)
            alike = sum((e.stop_reason, e.error_type) == kind for e in failed)
            log.warning(
                f"{episode.stop_reason} in {alike} of {len(episodes)} episodes of step {step}, the first: "
                f"{episode.error}. Failed episodes are masked out of the loss with task.failed_reward; "
                f"the episode_failures check alerts when many fail."
            )


def episode_vision(episodes: list[Episode]) -> list[VisionInputs | None]:
    """Each episode's pictures with their image slots (None: an episode without pictures): every pass puts
    their features where the engine did."""
    return [e.vision.inputs() if e.vision is not None and e.vision.images else None for e in episodes]


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Per-batch episode metrics: means per episode, and counts (``failed``, ``stop/<reason>``) the health
    checks sum over ranks."""
    n = max(len(episodes), 1)
    metrics = {
        METRICS + "count": float(len(episodes)),
        METRICS + "failed": float(sum(e.failed for e in episodes)),
        METRICS + "turns": sum(e.num_turns for e in episodes) / n,
        METRICS + "tool_calls": sum(e.tool_calls for e in episodes) / n,
        METRICS + "parse_errors": sum(e.parse_errors for e in episodes) / n,
        METRICS + "cut_turns": sum(e.cut_turns for e in episodes) / n,
        METRICS + "sampled_tokens": sum(e.sampled_tokens for e in episodes) / n,
        METRICS + "env_tokens": sum(e.env_tokens for e in episodes) / n,
    }
    for reason in STOP_REASONS:
        metrics[f"{METRICS}stop/{reason}"] = float(sum(e.stop_reason == reason for e in episodes))
    return {**metrics, **outcome_metrics(episodes)}  # tool outcome kinds, close errors, abandoned threads
