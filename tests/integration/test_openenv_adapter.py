"""The OpenEnv adapter against a real openenv 0.10 server on loopback (run from its own venv, whose
pins clash with ours: OPENENV_PYTHON, default .venv-openenv/bin/python, made by make test)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.environments.adapters.openenv import OpenEnvActionEnv
from grpo_lightning.environments.adapters.openenv_mcp import OpenEnvMCPEnv
from grpo_lightning.environments.base import ENVIRONMENTS, TOOL_PARSERS, Turn
from grpo_lightning.tasks.key_lookup import KeyLookupTaskConfig

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# openenv's pins clash with ours: it lives in a venv of its own, made by `make test` (Makefile).
PYTHON = os.environ.get("OPENENV_PYTHON", str(ROOT / ".venv-openenv" / "bin" / "python"))
SERVER = Path(__file__).resolve().parents[1] / "helpers" / "openenv_counter_server.py"
MCP_SERVER = SERVER.with_name("openenv_mcp_server.py")


def serve(script: Path):
    """Run ``script`` (a real openenv server) from the openenv venv on a free loopback port; yield its URL."""
    if not Path(PYTHON).exists():
        pytest.fail(f"no openenv venv at {PYTHON}: run `make .venv-openenv/.installed` (or set OPENENV_PYTHON)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([PYTHON, str(script), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail("the OpenEnv server did not start: " + process.stderr.read1().decode()[-2000:])
        yield url
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def server_url():
    yield from serve(SERVER)


@pytest.fixture(scope="module")
def mcp_url():
    yield from serve(MCP_SERVER)


def turn(text: str) -> Turn:
    calls, errors = TOOL_PARSERS["hermes"](text)
    return Turn(text=text, token_ids=[], tool_calls=calls, parse_errors=errors)


def call(arguments: str, name: str = "act") -> Turn:
    return turn(f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>')


def test_an_episode_on_a_real_openenv_server(server_url):
    async def play():
        env = OpenEnvActionEnv(server_url, prompt=None)
        reset = await env.reset(3, {"prompt": "Reach the target."})
        target = reset.info["observation"]["target"]
        tool = reset.tools[0]["function"]
        assert tool["name"] == "act" and set(tool["parameters"]["properties"]) == {"delta"}
        assert f'"target": {target}' in reset.messages[0]["content"]
        steps = [await env.step(call('{"delta": "two"}'))]  # refused by the server's validation
        steps.append(await env.step(call('{"delta": 1}')))
        steps.append(await env.step(call(f'{{"delta": {target - 1}}}')))
        same = (await OpenEnvActionEnv(server_url).reset(3, {})).info["observation"]["target"]
        await env.close()
        return steps, target, same

    steps, target, same = asyncio.run(play())
    assert same == target  # the reset seed decides the game
    refused, first, last = steps
    assert refused.messages[0]["content"].startswith("Error: ") and "delta" in refused.messages[0]["content"]
    assert refused.info["tool_error_kinds"] == {"bad_arguments": 1} and not refused.done
    assert '"value": 1' in first.messages[0]["content"] and first.reward == 0.0 and not first.done
    assert last.done and last.reward == 1.0 and f'"value": {target}' in last.messages[0]["content"]


def test_the_tiny_model_trains_five_steps_against_the_server(server_url, tmp_path):
    """Each '+' the tiny model writes adds one (its alphabet has no JSON): the plumbing end to end."""

    @TOOL_PARSERS.register("plus_act")
    def plus_act(text):
        return ([{"name": "act", "arguments": {"delta": text.count("+")}}] if "+" in text else []), []

    @ENVIRONMENTS.register("openenv_counter")
    def counter(options, row):
        return OpenEnvActionEnv(
            server_url, prompt=lambda row, observation: [{"role": "user", "content": row["prompt"]}]
        )

    cfg = TrainConfig(
        task=KeyLookupTaskConfig(
            environment="openenv_counter", key_style="digits", question="{key}?", tool_parser="plus_act", num_keys=20
        )
    )
    cfg.trainer.max_steps, cfg.trainer.output_dir, cfg.logger.kind = 5, str(tmp_path), "none"
    cfg.rollout.max_new_tokens, cfg.rollout.prompts_per_step = 4, 2
    run = build_run(cfg)
    trainer = run.trainer(cfg)
    trainer.fit(run.module, datamodule=run.datamodule)
    assert trainer.global_step == 5
    episodes = run.rollout.episodes.last_episodes
    assert len(episodes) == 2 * cfg.rollout.num_generations
    assert not any(e.failed for e in episodes), [e.error for e in episodes if e.failed]
    assert any(m["role"] == "tool" and '"value"' in m["content"] for e in episodes for m in e.completion_messages)


def test_an_mcp_tool_environment_on_a_real_openenv_server(mcp_url):
    """MCP tools become our tools; every server-side failure is a counted tool message; done and reward pass."""

    async def play():
        env = OpenEnvMCPEnv(mcp_url, max_calls_per_turn=2)
        reset = await env.reset(5, {"prompt": "Find the value."})
        key = reset.info["observation"]["metadata"]["key"]
        steps = [
            await env.step(
                turn(
                    '<tool_call>{"name": "lookup", "arguments": {"key": "nope"}}</tool_call>'
                    '<tool_call>{"name": "lookup", "arguments": {"kez": "x"}}</tool_call>'
                    '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>'
                )
            ),
            await env.step(turn('<tool_call>{"name": "search", "arguments": {}}</tool_call><tool_call>{bad json')),
            await env.step(call(f'{{"key": "{key}"}}', "lookup")),
        ]
        value = steps[-1].messages[0]["content"]
        steps.append(await env.step(call(f'{{"answer": "{value}"}}', "submit")))
        steps.append(await env.step(turn("no call: the answer")))
        same = (await OpenEnvMCPEnv(mcp_url).reset(5, {})).info["observation"]["metadata"]["key"]
        await env.close()
        return reset, steps, key, same

    reset, (errors, unknown, looked_up, submitted, answer), key, same = asyncio.run(play())
    assert same == key  # the reset seed decides the episode
    schemas = {t["function"]["name"]: t["function"] for t in reset.tools}
    assert set(schemas) == {"lookup", "submit"} and schemas["lookup"]["parameters"]["required"] == ["key"]
    assert schemas["lookup"]["description"] == "The value stored under a key."
    assert [m["content"][:7] for m in errors.messages] == ["Error: "] * 3 and not errors.done
    assert "no value under 'nope'" in errors.messages[0]["content"]
    assert errors.info["tool_error_kinds"] == {"exception": 1, "bad_arguments": 1, "too_many_calls": 1}
    assert unknown.info["tool_error_kinds"] == {"parse": 1, "unknown_tool": 1} and unknown.info["parse_errors"] == 1
    assert looked_up.messages == [{"role": "tool", "name": "lookup", "content": looked_up.messages[0]["content"]}]
    assert looked_up.messages[0]["content"].isdigit() and looked_up.info["tool_calls"] == 1 and not looked_up.done
    assert submitted.done and submitted.reward == 1.0 and submitted.messages[0]["content"] == "submitted"
    assert submitted.info["episode_tool_totals"]["calls"] == 2
    assert answer.done and answer.info["stop_reason"] == "answer" and not answer.messages
