"""Episodes through a vLLM server's token-id completions endpoint (a stand-in server,
``tests/helpers/fake_vllm_server.py``): each turn sends the episode's ids so far as the prompt."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from grpo_lightning.config import VLLMConfig
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.rollout.engine import Sampling
from grpo_lightning.rollout.vllm_server import VLLMServerEngine
from tests.helpers.episodes import ScriptedEnv, chatml_tokenizer
from tests.helpers.fake_vllm_server import _completion

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_vllm_server.py"


def test_each_turn_sends_the_ids_so_far_and_trains_on_what_came_back(tmp_path):
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, str(FAKE), str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            assert server.poll() is None and time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.05)
        tokenizer = chatml_tokenizer()
        engine = VLLMServerEngine(VLLMConfig(), f"http://127.0.0.1:{port_file.read_text()}", tokenizer.eos_token_id)
        limits = EpisodeLimits(max_turns=3, max_turn_tokens=4, context=500)
        runner = EpisodeRunner(
            engine, ChatRenderer(tokenizer), lambda row: ScriptedEnv(turns=3), limits, Sampling(4, 1, 1, 0)
        )
        episodes = runner.run([{"prompt": "a"}, {"prompt": "a"}], [7, 7], [1, 2])
        engine.close()
    finally:
        server.kill()
        server.wait()
    for episode in episodes:
        assert episode.stop_reason == "done" and episode.num_turns == 3
        starts = [i for i, m in enumerate(episode.loss_mask) if m and (i == 0 or not episode.loss_mask[i - 1])]
        for turn, start in enumerate(starts):
            prompt = episode.prompt_ids + episode.ids[:start]  # what this turn must have sent
            expected = _completion({"prompt": prompt, "seed": episode.turn_seeds[turn], "max_tokens": 4})["token_ids"]
            assert episode.ids[start : start + 4] == expected and episode.loss_mask[start : start + 4] == [1] * 4
        assert [p for p, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m] == [-1.0] * 12
