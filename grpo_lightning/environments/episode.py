"""The token-in/token-out episode runner: one engine, many environments, ids the model really sampled.

An episode is one row of the batch: ``prompt_ids`` (the first observation, rendered once) and
``ids`` (everything after it). Each model turn's sampled ids are appended unchanged with loss
mask 1 and the engine's log-probs; the environment's reply is appended as template ids
(:class:`~grpo_lightning.environments.render.ChatRenderer`) with mask 0 and log-prob 0. Every
turn's request to the engine is ``prompt_ids + ids`` so far, so each is a prefix of the final
sequence: what the trainer scores is what the engine was asked to continue.

The episodes of a batch run concurrently on one asyncio loop: each awaits its environment and
its engine turns independently, and a :class:`TurnBatcher` gathers the turns that are waiting
into one ``engine.generate`` call (run in a worker thread, so environments keep stepping while
the engine samples). A synchronous environment's calls each run in a daemon thread of their own
(``environments/daemon.py``), so they overlap too (I/O fully; pure-Python CPU work only as far as
the GIL lets), and one abandoned by its step timeout never keeps the process from exiting. A failed
episode (the environment raised, a timeout fired) keeps the tokens it has, is masked out of the
loss and counted; it is never dropped, which would change group sizes and tensor shapes across
ranks. What ``reset`` and ``step`` return is checked (``environments/returns.py``): a wrong
return is the environment's bug, not a failed episode, and ends the run naming it.

Seeds: the reset seed is one per group (every episode of a group plays the same game); each
turn samples from a seed derived from its sample's seed and the turn index. Both are recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_lightning.environments import returns
from grpo_lightning.environments.base import Environment, Message, Reset, Step, Turn
from grpo_lightning.environments.calls import EnvironmentCallFailed, call_environment, label, made
from grpo_lightning.environments.daemon import in_daemon_thread
from grpo_lightning.environments.images import EpisodeImages, EpisodeVision, message_images, recorded_messages
from grpo_lightning.environments.images import template_messages as plain
from grpo_lightning.environments.limits import (
    DONE,
    EPISODE_TIMEOUT,
    FAILURES,
    MAX_TURNS,
    EpisodeLimits,
)
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.truncation import reward_at_limit
from grpo_lightning.rollout.engine import Completion, GenerationRequest, RolloutEngine, Sampling

ToolParser = Callable[[str], tuple[list[dict[str, Any]], list[str]]]


def turn_seed(sample_seed: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of a sample: turn 0 uses the sample's seed, later turns a hash of both."""
    if turn == 0:
        return sample_seed
    digest = hashlib.blake2b(struct.pack("<2q", sample_seed, turn), digest_size=8, person=b"grpo-turn").digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class Episode:
    """One played episode: the ids, what sampled them, and why it ended."""

    reset_seed: int
    sample_seed: int
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # after the prompt: turns and environment replies
    loss_mask: list[int] = field(default_factory=list)  # 1 on sampled ids, 0 on environment ids
    logprobs: list[float] = field(default_factory=list)  # the engine's, 0.0 on environment ids
    turn_ids: list[int] = field(default_factory=list)  # the turn each id belongs to (a reply: the turn it answers)
    versions: list[int] = field(default_factory=list)  # the weight version that sampled each id (-1: unknown, env)
    messages: list[Message] = field(default_factory=list)  # the whole conversation, for reading and rewards
    num_prompt_messages: int = 0
    tools: list[dict] = field(default_factory=list)
    turn_seeds: list[int] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # the environment's, merged over the episode
    step_infos: list[dict[str, Any]] = field(default_factory=list)  # each step's own info (transcripts, outcomes)
    stop_reason: str = ""
    error: str = ""  # a failure's message: the environment's name, the call, the exception and where it was raised
    error_type: str = ""  # env_error: the exception's type
    tool_calls: int = 0
    parse_errors: int = 0
    cut_turns: int = 0  # turns that ended at their token budget, not at a stop token
    engine_logprobs: bool = True  # every turn came with the engine's log-probs
    vision: EpisodeVision | None = None  # a vision-language policy's: the environment's pictures so far

    @property
    def failed(self) -> bool:
        return self.stop_reason in FAILURES

    @property
    def num_turns(self) -> int:
        return len(self.turn_seeds)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def env_tokens(self) -> int:
        return len(self.ids) - self.sampled_tokens

    @property
    def completion_messages(self) -> list[Message]:
        """The messages after the first observation (TRL's conversational completion)."""
        return self.messages[self.num_prompt_messages :]

    def completion(self) -> Completion:
        """This episode as one completion: a failed one stays in, with loss mask 0 throughout."""
        mask = [0] * len(self.ids) if self.failed else list(self.loss_mask)
        sampled = [v for v in self.versions if v >= 0]
        return Completion(
            token_ids=list(self.ids),
            finished=self.stop_reason == DONE,
            logprobs=list(self.logprobs) if self.engine_logprobs else None,
            weight_version=min(sampled) if sampled else None,
            # Per token: the turns of an episode played across weight syncs (async mode) differ in version.
            token_weight_versions=list(self.versions) if sampled else None,
            loss_mask=mask,
            turn_ids=list(self.turn_ids),
        )


class TurnBatcher:
    """Gathers the episodes' pending turns into engine calls: a call starts when every live
    episode is waiting, or ``window_s`` after the first turn began waiting (so a slow
    environment does not hold the others' turns back)."""

    def __init__(self, engine: RolloutEngine, sampling: Sampling, live: int, window_s: float = 0.02):
        self.engine, self.sampling, self.live, self.window_s = engine, sampling, live, window_s
        self.pending: list[tuple[GenerationRequest, int, asyncio.Future]] = []
        self.first_wait = 0.0
        self.changed = asyncio.Event()
        self.calls = 0

    async def generate(self, request: GenerationRequest, max_new_tokens: int) -> Completion:
        future = asyncio.get_running_loop().create_future()
        if not self.pending:
            self.first_wait = time.monotonic()
        self.pending.append((request, max_new_tokens, future))
        self.changed.set()
        return await future

    def finished(self) -> None:
        """An episode ended: one fewer to wait for."""
        self.live -= 1
        self.changed.set()

    async def serve(self) -> None:
        while self.live > 0:
            self.pending = [p for p in self.pending if not p[2].done()]  # cancelled by a timeout
            ready = self.pending and (
                len(self.pending) >= self.live or time.monotonic() - self.first_wait >= self.window_s
            )
            if not ready:
                self.changed.clear()
                timeout = self.window_s if self.pending else None
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            batch, self.pending = self.pending, []
            await self._run(batch)

    async def _run(self, batch: list[tuple[GenerationRequest, int, asyncio.Future]]) -> None:
        by_budget: dict[int, list[tuple[GenerationRequest, asyncio.Future]]] = {}
        for request, budget, future in batch:
            by_budget.setdefault(budget, []).append((request, future))
        for budget, items in by_budget.items():
            sampling = replace(self.sampling, max_new_tokens=budget)
            self.calls += 1
            try:
                completions = await asyncio.to_thread(self.engine.generate, [r for r, _ in items], sampling)
            except BaseException as err:  # an engine failure ends the run: every waiting episode sees it
                for _, future in items:
                    if not future.done():
                        future.set_exception(err)
                raise
            for (_, future), completion in zip(items, completions, strict=True):
                if not future.done():
                    future.set_result(completion)


class EpisodeRunner:
    """Plays episodes of ``make_env(row)`` environments against ``engine`` (any registered engine:
    each takes prompt token ids and returns sampled token ids, HF, vLLM and the vLLM server alike).

    ``parser`` turns a turn's text into tool calls (a :data:`TOOL_PARSERS` entry; None: no tools).
    ``env_name`` names the environment in failures and errors (its registered name).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        renderer: ChatRenderer,
        make_env: Callable[[dict], Environment],
        limits: EpisodeLimits,
        sampling: Sampling,
        parser: ToolParser | None = None,
        batch_window_s: float = 0.02,
        env_name: str = "",
        images: EpisodeImages | None = None,
    ):
        self.engine, self.renderer, self.make_env = engine, renderer, make_env
        self.limits, self.sampling, self.parser = limits, sampling, parser
        self.batch_window_s = batch_window_s
        self.env_name = env_name
        self.images = images or EpisodeImages(None)  # a text policy's refuses every picture

    # ----------------------------------------------------------------------- the batch
    def run(self, rows: list[dict], reset_seeds: list[int], sample_seeds: list[int]) -> list[Episode]:
        """Play one episode per row (rows of a group repeated, with the group's reset seed), concurrently."""
        coroutine = self.run_async(rows, reset_seeds, sample_seeds)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        # Called inside a running loop (a notebook): play on a loop of our own in a worker thread.
        return in_daemon_thread(asyncio.run, coroutine, name="episode-loop").result()

    async def run_async(self, rows: list[dict], reset_seeds: list[int], sample_seeds: list[int]) -> list[Episode]:
        if not len(rows) == len(reset_seeds) == len(sample_seeds):
            raise ValueError(f"{len(rows)} rows, {len(reset_seeds)} reset seeds, {len(sample_seeds)} sample seeds")
        batcher = TurnBatcher(self.engine, self.sampling, len(rows), self.batch_window_s)
        episodes = [Episode(reset_seed=r, sample_seed=s) for r, s in zip(reset_seeds, sample_seeds, strict=True)]
        server = asyncio.ensure_future(batcher.serve())
        players = [self._play_bounded(row, episode, batcher) for row, episode in zip(rows, episodes, strict=True)]
        try:
            await asyncio.gather(server, *players)
        finally:
            server.cancel()
        return episodes

    # ----------------------------------------------------------------------- one episode
    async def _play_bounded(self, row: dict, episode: Episode, batcher: TurnBatcher) -> None:
        """One episode under the episode timeout; an environment's failure ends it as failed, an
        engine's or the template's failure ends the run."""
        env = None
        try:
            env = made(self.make_env, row, self.env_name)  # a UserError (the user's configuration) ends the run
            await asyncio.wait_for(self._play(env, row, episode, batcher), self.limits.episode_timeout_s)
            await reward_at_limit(env, episode, self._env_call, self.env_name)  # the environment's on_truncated hook
        except TimeoutError:
            episode.stop_reason = EPISODE_TIMEOUT
            timeout = self.limits.episode_timeout_s
            episode.error = f"{label(self.env_name, env)}: the episode took over task.episode_timeout_s={timeout:g} s"
        except EnvironmentCallFailed as err:
            episode.stop_reason, episode.error, episode.error_type = err.kind, str(err), err.error_type
        finally:
            batcher.finished()
            if env is not None:
                try:
                    await self._env_call(env, env.close)
                except EnvironmentCallFailed as err:  # a failing close is recorded, never raised
                    episode.info.setdefault("close_error", str(err))

    async def _play(self, env: Environment, row: dict, episode: Episode, batcher: TurnBatcher) -> None:
        reset: Reset = returns.checked(
            self.env_name or type(env).__name__, "reset", await self._env_call(env, env.reset, episode.reset_seed, row)
        )
        vision = self.images.processor is not None
        episode.vision = EpisodeVision() if vision else None
        pictures = self._pictures(env, "reset", 0, reset.messages, episode)
        episode.messages = recorded_messages(list(reset.messages), pictures[1])
        episode.num_prompt_messages = len(reset.messages)
        episode.tools = list(reset.tools)
        episode.info.update(reset.info)
        if pictures[0]:
            text = self.renderer.render(plain(reset.messages), reset.tools or None, generation_prompt=True)
            episode.prompt_ids, tensors = self.images.expand(text, pictures[0], self.renderer.plain)
            episode.vision.add(0, episode.prompt_ids, self.images.image_token_id, *pictures, tensors)
        else:
            episode.prompt_ids = self.renderer.prompt_ids(plain(reset.messages), reset.tools or None)
        for turn in range(self.limits.max_turns):
            used = len(episode.prompt_ids) + len(episode.ids)
            if (reason := self.limits.out_of_room(used)) is not None:
                episode.stop_reason = reason
                return
            seed = turn_seed(episode.sample_seed, turn)
            episode.turn_seeds.append(seed)
            # A VLM's request always names its image slots: an image token sampled in an earlier turn is text.
            request = GenerationRequest(
                episode.prompt_ids + episode.ids, seed, episode.vision.inputs() if vision else None
            )
            completion = await batcher.generate(request, self.limits.turn_budget(used))
            sampled = list(completion.token_ids)
            self._append(episode, sampled, 1, turn, completion.logprobs, completion.weight_version)
            episode.cut_turns += not completion.finished
            model_turn = self._turn(sampled, completion.finished, episode)
            episode.messages.append(_assistant_message(model_turn))
            step: Step = returns.checked(
                self.env_name or type(env).__name__, "step", await self._env_call(env, env.step, model_turn)
            )
            pictures = self._pictures(env, "step", turn + 1, step.messages, episode)  # turns counted from 1
            episode.messages.extend(recorded_messages(list(step.messages), pictures[1]))
            episode.info.update(step.info)
            episode.step_infos.append(dict(step.info))
            if step.reward is not None:
                episode.step_rewards.append(float(step.reward))
            if step.done:
                episode.stop_reason = DONE
                return
            if turn + 1 < self.limits.max_turns:
                tensors: dict = {}
                if pictures[0]:
                    text = self.renderer.env_text(sampled, plain(step.messages), episode.tools or None)
                    reply, tensors = self.images.expand(text, pictures[0])
                else:
                    reply = self.renderer.env_ids(sampled, plain(step.messages), episode.tools or None)
                if (
                    reason := self.limits.out_of_room(len(episode.prompt_ids) + len(episode.ids) + len(reply))
                ) is not None:
                    episode.stop_reason = reason  # the reply leaves no room for a turn: it is not appended
                    return
                if pictures[0]:  # its image tokens are slots from here on (after the prompt and the ids so far)
                    start = len(episode.prompt_ids) + len(episode.ids)
                    episode.vision.add(start, reply, self.images.image_token_id, *pictures, tensors)
                self._append(episode, reply, 0, turn, None)
        episode.stop_reason = episode.stop_reason or MAX_TURNS

    def _pictures(self, env: Any, method: str, turn: int, messages: list[Message], episode: Episode):
        """The pictures of ``messages`` loaded, and their names ([], [] without any); a picture the policy
        cannot take ends the run (``environments/images.py``)."""
        refs = message_images(messages)
        if not refs:
            return [], []
        already = len(episode.vision.images) if episode.vision is not None else 0
        name = self.env_name or type(env).__name__
        where = (
            f"environment {name!r}: reset()" if method == "reset" else f"environment {name!r}: step() of turn {turn}"
        )
        return self.images.load(refs, where, method, already)

    def _turn(self, sampled: list[int], finished: bool, episode: Episode) -> Turn:
        text = self.renderer.tokenizer.decode(sampled, skip_special_tokens=True)  # for reading, never re-encoded
        calls, errors = self.parser(text) if self.parser is not None else ([], [])
        episode.tool_calls += len(calls)
        episode.parse_errors += len(errors)
        return Turn(text=text, token_ids=list(sampled), tool_calls=calls, parse_errors=errors, finished=finished)

    @staticmethod
    def _append(
        episode: Episode, ids: list[int], mask: int, turn: int, logprobs: list[float] | None, version: int | None = None
    ) -> None:
        episode.ids.extend(ids)
        episode.versions.extend([-1 if version is None else version] * len(ids))
        episode.loss_mask.extend([mask] * len(ids))
        episode.turn_ids.extend([turn] * len(ids))
        if mask and logprobs is None:
            episode.engine_logprobs = False
        episode.logprobs.extend(list(logprobs) if logprobs is not None else [0.0] * len(ids))

    async def _env_call(self, env: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """Call the environment under the step limit (``environments/calls.py``); a failure fails the episode."""
        return await call_environment(env, fn, *args, timeout_s=self.limits.step_timeout_s, name=self.env_name)


def _assistant_message(turn: Turn) -> Message:
    message: Message = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [{"type": "function", "function": call} for call in turn.tool_calls]
    return message


__all__ = ["Episode", "EpisodeRunner", "Step", "TurnBatcher", "turn_seed"]
