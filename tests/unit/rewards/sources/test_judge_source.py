"""The judge source against a scripted loopback server: verdicts, columns, retries, timeouts,
concurrency, the cache, the failure policy and the API key's handling."""

from __future__ import annotations

import re
import threading
import time

import pytest

from grpo_lightning.config import TrainConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.sources.judge import JudgeOptions, JudgeRequestError, JudgeReward
from grpo_lightning.rewards.sources.verdicts import parse_choice, parse_pass_fail, parse_score
from tests.helpers.scripted_judge import ScriptedJudge


def judge(url, **options):
    return JudgeReward(JudgeOptions(url=url, model="m", backoff_s=0.01, **options))


def completion_in(text):
    """The completion of a rubric: the lines between the response markers."""
    return text.split(">>>\n", 1)[1].rsplit("\n<<<end of response", 1)[0]


def echo_score(text, headers):
    """Scores the completion's length in characters."""
    if "<<<response" not in text:
        return 200, "Score: 1"
    return 200, f"Thinking... Score: 2. On reflection, Score: {min(len(completion_in(text)), 10)}"


def test_scores_each_completion_with_its_columns_in_the_rubric():
    with ScriptedJudge(echo_score) as server:
        rewards = judge(server.url)(prompts=["a", "b"], completions=["xxx", "xxxxxxxxxxxx"])
        assert rewards == [0.3, 1.0]  # the last verdict counts; clipped to [0, 1]
        template = "Q: {prompt} A: {completion} Gold: {answer} Score: 1"
        judge(server.url, template=template)(
            prompts=[[{"role": "user", "content": "2+2?"}]],
            completions=[[{"role": "assistant", "content": "4"}]],
            answer=["4"],
        )
        sent = server.requests[-1]["messages"][0]["content"]
        assert re.fullmatch(r"Q: 2\+2\? A: <<<response (\w{12})>>>\n4\n<<<end of response \1>>> Gold: 4 Score: 1", sent)


def test_a_placeholder_without_a_column_names_the_columns():
    with pytest.raises(ConfigError, match=r"names \['solution'\].*\['answer', 'completion', 'prompt'\]"):
        judge("http://127.0.0.1:9/v1", template="{solution}")(prompts=["p"], completions=["c"], answer=["1"])


@pytest.mark.parametrize(
    ("text", "verdict", "expected"),
    [
        ("Score: 7/10", "score", 0.7),
        ("score = 10", "score", 1.0),
        ("Score: 12", "score", "out_of_range"),  # above score_max: no verdict, not a clipped 1.0
        ("Score: 1e9", "score", "out_of_range"),  # read whole, not as 1
        ("Score: -3", "score", "out_of_range"),
        ("no number", "score", None),
        ("It would FAIL, but fixed: PASS", "pass_fail", 1.0),
        ("passes? no. Verdict: fail", "pass_fail", 0.0),
        ("B is worse than A", "choice", 1.0),
        ("Answer: B", "choice", 0.0),
        ("Both bad", "choice", None),
    ],
)
def test_verdict_parsers(text, verdict, expected):
    if verdict == "score":
        got = parse_score(text, JudgeOptions().score_pattern, 10.0)
    elif verdict == "pass_fail":
        got = parse_pass_fail(text)
    else:
        got = parse_choice(text, {"A": 1.0, "B": 0.0})
    assert got == expected


def test_retries_with_backoff_then_succeeds():
    calls = []

    def flaky(text, headers):
        calls.append(time.monotonic())
        return (503, "busy") if len(calls) < 3 else (200, "PASS")

    with ScriptedJudge(flaky) as server:
        reward = JudgeReward(JudgeOptions(url=server.url, verdict="pass_fail", retries=2, backoff_s=0.05))
        assert reward(prompts=["p"], completions=["c"]) == [1.0]
    assert reward.counts["retries"] == 2 and calls[2] - calls[1] >= 0.09  # the second wait is doubled


def test_failures_get_the_configured_reward_and_are_counted_never_a_silent_zero():
    with ScriptedJudge(lambda text, h: (500, "down")) as server:
        reward = judge(server.url, retries=1, failure_reward=-1.0)
        with pytest.warns(UserWarning, match=r"judge: 2 of 2 completions not graded \(2 failures; .*HTTP 500"):
            assert reward(prompts=["p", "q"], completions=["c", "d"]) == [-1.0, -1.0]
        assert reward.counts["failures"] == 2 and len(server.requests) == 4
        with pytest.warns(UserWarning, match="None"):
            assert judge(server.url, retries=0, on_failure="none")(prompts=["p"], completions=["c"]) == [None]
        with pytest.raises(JudgeRequestError, match="on_failure=raise"):
            judge(server.url, retries=0, on_failure="raise")(prompts=["p"], completions=["c"])
    with ScriptedJudge(lambda text, h: (200, "I cannot decide")) as server:
        reward = judge(server.url)
        with pytest.warns(UserWarning, match="no verdict"):
            assert reward(prompts=["p"], completions=["c"]) == [0.0]
        assert reward.counts["no_verdict"] == 1


def test_a_slow_answer_times_out_and_a_dead_port_fails_fast():
    with ScriptedJudge(lambda text, h: (200, 1.0)) as server:
        start = time.monotonic()
        with pytest.warns(UserWarning, match="failed after 1 tries"):
            assert judge(server.url, timeout_s=0.2, retries=0)(prompts=["p"], completions=["c"]) == [0.0]
        assert time.monotonic() - start < 0.9
    with pytest.warns(UserWarning, match="not graded"):
        judge("http://127.0.0.1:9/v1", retries=0)(prompts=["p"], completions=["c"])


def test_concurrency_is_limited():
    live, peak, lock = [0], [0], threading.Lock()

    def slow(text, headers):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return 200, "Score: 5"

    with ScriptedJudge(slow) as server:
        judge(server.url, concurrency=3)(prompts=[str(i) for i in range(12)], completions=["c"] * 12)
    assert peak[0] == 3


def test_identical_requests_are_answered_from_the_cache():
    with ScriptedJudge(echo_score) as server:
        reward = judge(server.url)
        first = reward(prompts=["p", "p"], completions=["abc", "abcd"])
        again = reward(prompts=["p", "p"], completions=["abc", "abcd"])
        assert first == again and len(server.requests) == 2 and reward.counts["cache_hits"] == 2
        judge(server.url, cache_size=0)(prompts=["p", "p"], completions=["abc", "abc"])
        assert len(server.requests) == 4


def test_the_api_key_goes_in_the_header_only(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret-123")
    with ScriptedJudge(lambda text, h: (401, "no")) as server:
        reward = judge(server.url, api_key_env="JUDGE_TEST_KEY", retries=0)
        with pytest.warns(UserWarning) as caught:
            reward(prompts=["p"], completions=["c"])
        assert server.headers[0]["Authorization"] == "Bearer sk-secret-123"
    said = repr(reward) + repr(reward.options) + "".join(str(w.message) for w in caught)
    assert "sk-secret" not in said and "HTTP 401" in said
    with pytest.raises(TypeError, match="not pickled"):
        reward.__getstate__()
    monkeypatch.delenv("JUDGE_TEST_KEY")
    with pytest.raises(ConfigError, match="JUDGE_TEST_KEY"):
        judge(server.url, api_key_env="JUDGE_TEST_KEY")


def test_options_are_checked_in_the_config():
    cfg = TrainConfig()
    cfg.rewards.judge.verdict = "stars"
    cfg.rewards.judge.concurrency = 0
    problems = cfg.validate()
    assert any(re.match(r"rewards\.judge\.verdict='stars' is not allowed", p) for p in problems)
    assert any(p.startswith("rewards.judge.concurrency=0") for p in problems)
