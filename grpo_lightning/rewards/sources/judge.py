"""An LLM judge: an OpenAI-compatible chat endpoint grades each completion (``task.rewards={judge: 1.0}``).

The rubric (``rewards.judge.template``) is filled with ``{prompt}``, ``{completion}`` and any of
the dataset's columns (``{answer}``), sent as one user message to ``rewards.judge.url`` (a vLLM
server of ours, or any provider), and the verdict parsed from the answer (:mod:`.verdicts`).
Requests run concurrently up to ``concurrency``, each with a timeout and retries with
exponential backoff; identical requests are answered from a cache. A request that still fails,
or an answer without a verdict, gets ``failure_reward`` (or None: not applicable, or stops the
run: ``on_failure``) and is counted (``failures``, a warning per batch): never a silent 0.

The API key is read from the environment variable named by ``api_key_env`` when the judge is
built; it is sent only in the Authorization header and never logged or kept in the options.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import Schema, check, choice, option
from grpo_lightning.errors import ConfigError, RewardError
from grpo_lightning.rewards.sources.base import register_source
from grpo_lightning.rewards.sources.text import message_text
from grpo_lightning.rewards.sources.verdicts import NUMBER, VERDICTS, parse_choice, parse_pass_fail, parse_score

DEFAULT_TEMPLATE = (
    "Grade the response to the task below from 0 (useless or wrong) to 10 (fully correct and clear).\n\n"
    "Task:\n{prompt}\n\nResponse:\n{completion}\n\nEnd your reply with a line 'Score: N'."
)
FAILURE_POLICIES = ("reward", "none", "raise")


@dataclass
class JudgeOptions(Schema):
    """An LLM judge behind an OpenAI-compatible /chat/completions endpoint."""

    url: str = option(
        "", "Base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (/chat/completions is added)."
    )
    model: str = option("", "Model name sent with each request (the server's served model name).")
    api_key_env: str = option("", "Environment variable holding the API key (sent as a Bearer token); empty: no key.")
    template: str = option(
        DEFAULT_TEMPLATE, "Rubric: {prompt}, {completion} and dataset columns ({answer}); braces doubled."
    )
    verdict: str = option("score", "How to read the answer: score (a number), pass_fail (PASS / FAIL) or choice.")
    score_pattern: str = option(r"(?i)score\s*[:=]\s*" + NUMBER, "verdict=score: regex whose first group is the score.")
    score_max: float = option(10.0, "verdict=score: the score is divided by this and clipped to [0, 1].")
    choices: dict[str, float] = option({"A": 1.0, "B": 0.0}, "verdict=choice: each choice's word -> its reward.")
    max_tokens: int = option(256, "Most tokens the judge may write per verdict.")
    temperature: float = option(0.0, "Judge's sampling temperature (0: greedy, so the cache and reruns agree).")
    concurrency: int = option(8, "Requests in flight at once.")
    timeout_s: float = option(60.0, "Seconds one request may take before it is retried.")
    retries: int = option(2, "Retries of a failed request (timeout, connection error, HTTP 429 or 5xx).")
    backoff_s: float = option(1.0, "Wait before the first retry; doubled before each next one.")
    cache_size: int = option(10000, "Verdicts kept by request (identical requests are not sent again); 0: no cache.")
    on_failure: str = option(
        "reward", "A request that fails or has no verdict: reward (failure_reward), none (n/a), raise."
    )
    failure_reward: float = option(0.0, "on_failure=reward: the reward of a completion the judge could not grade.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}verdict", self.verdict, VERDICTS)
        choice(problems, f"{p}on_failure", self.on_failure, FAILURE_POLICIES)
        check(problems, self.score_max > 0, f"{p}score_max={self.score_max} must be > 0")
        check(problems, self.concurrency >= 1, f"{p}concurrency={self.concurrency} must be >= 1")
        check(problems, self.timeout_s > 0, f"{p}timeout_s={self.timeout_s} must be > 0")
        check(problems, self.retries >= 0, f"{p}retries={self.retries} must be >= 0")
        check(problems, self.backoff_s >= 0, f"{p}backoff_s={self.backoff_s} must be >= 0")
        check(problems, self.cache_size >= 0, f"{p}cache_size={self.cache_size} must be >= 0 (0 = no cache)")
        check(problems, self.max_tokens >= 1, f"{p}max_tokens={self.max_tokens} must be >= 1")
        check(problems, bool(self.choices) or self.verdict != "choice", f"{p}choices is empty; name each choice")
        return problems


class JudgeRequestError(RewardError):
    """The judge endpoint failed a request after every retry (or refused it)."""


_RETRYABLE = {408, 429, 500, 502, 503, 504}


@register_source("judge", options=JudgeOptions)
class JudgeReward:
    """A TRL reward function that asks an LLM judge for each completion's verdict."""

    def __init__(self, options: JudgeOptions):
        if not options.url:
            raise ConfigError("rewards.judge.url is empty: give the judge's OpenAI-compatible base URL (.../v1)")
        key = None
        if options.api_key_env:
            key = os.environ.get(options.api_key_env)
            if not key:
                raise ConfigError(
                    f"rewards.judge.api_key_env={options.api_key_env!r} but that environment variable is unset or empty"
                )
        self.options = options
        self.endpoint = options.url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()  # requests, cache_hits, retries, failures, no_verdict
        self._fields = {f for _, f, _, _ in string.Formatter().parse(options.template) if f}

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"JudgeReward(url={self.options.url!r}, model={self.options.model!r})"

    def __getstate__(self) -> dict:
        raise TypeError("a JudgeReward holds an API key and is not pickled; build it in the process that uses it")

    def prompt(self, prompt: Any, completion: Any, columns: dict[str, Any]) -> str:
        values = {**columns, "prompt": message_text(prompt), "completion": message_text(completion)}
        missing = sorted(self._fields - values.keys())
        if missing:
            raise ConfigError(
                f"rewards.judge.template names {missing} but the records have only {sorted(values)}; "
                "use those placeholders (a literal brace is written {{ or }})"
            )
        return self.options.template.format_map(values)

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float | None]:
        per_sample = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == len(prompts)}
        texts = [
            self.prompt(p, c, {k: v[i] for k, v in per_sample.items()})
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
        ]
        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            answers = list(pool.map(self._answer, texts))
        rewards = [self._reward(a) for a in answers]
        failed = sum(r is None for r in rewards)
        if failed:
            self._fail(failed, len(rewards), answers, columns.get("log_metric"))
            fallback = None if self.options.on_failure == "none" else self.options.failure_reward
            rewards = [fallback if r is None else r for r in rewards]
        return rewards

    def _reward(self, answer: str | BaseException) -> float | None:
        if isinstance(answer, BaseException):
            return None
        o = self.options
        if o.verdict == "score":
            value = parse_score(answer, o.score_pattern, o.score_max)
        elif o.verdict == "pass_fail":
            value = parse_pass_fail(answer)
        else:
            value = parse_choice(answer, o.choices)
        if value is None:
            with self._lock:
                self.counts["no_verdict"] += 1
        return value

    def _fail(self, failed: int, total: int, answers: list, log_metric: Any) -> None:
        with self._lock:
            self.counts["failures"] += failed
        errors = [a for a in answers if isinstance(a, BaseException)]
        why = f"{type(errors[0]).__name__}: {errors[0]}" if errors else "no verdict in the answer"
        message = f"judge: {failed} of {total} completions not graded ({why})"
        if self.options.on_failure == "raise":
            raise JudgeRequestError(f"{message}; rewards.judge.on_failure=raise stops the run")
        what = "None (not applicable)" if self.options.on_failure == "none" else self.options.failure_reward
        warnings.warn(f"{message}; they get {what} (rewards.judge.on_failure)", stacklevel=2)
        if callable(log_metric):
            log_metric("judge/failures", float(failed))

    def _answer(self, text: str) -> str | BaseException:
        """The judge's reply to ``text`` (cached by the whole request), or the error of its last try."""
        o = self.options
        body = {
            "model": o.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": o.max_tokens,
            "temperature": o.temperature,
        }
        payload = json.dumps(body, sort_keys=True).encode()
        key = hashlib.sha256(self.endpoint.encode() + payload).hexdigest()
        with self._lock:
            self.counts["requests"] += 1
            if key in self._cache:
                self.counts["cache_hits"] += 1
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            answer = self._post(payload)
        except (JudgeRequestError, OSError, ValueError) as err:
            return err
        with self._lock:
            if o.cache_size:
                self._cache[key] = answer
                while len(self._cache) > o.cache_size:
                    self._cache.popitem(last=False)
        return answer

    def _post(self, payload: bytes) -> str:
        o = self.options
        for attempt in range(o.retries + 1):
            if attempt:
                with self._lock:
                    self.counts["retries"] += 1
                time.sleep(o.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.endpoint, data=payload, headers=self._headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=o.timeout_s) as response:
                    reply = json.loads(response.read())
                return str(reply["choices"][0]["message"]["content"] or "")
            except urllib.error.HTTPError as err:
                if err.code not in _RETRYABLE or attempt == o.retries:
                    raise JudgeRequestError(f"{self.endpoint} answered HTTP {err.code} {err.reason}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                if attempt == o.retries:
                    reason = getattr(err, "reason", err)
                    raise JudgeRequestError(f"{self.endpoint} failed after {attempt + 1} tries: {reason}") from None
            except (KeyError, IndexError, TypeError, json.JSONDecodeError) as err:
                raise JudgeRequestError(
                    f"{self.endpoint} answered without choices[0].message.content ({err})"
                ) from None
        raise AssertionError("unreachable")
