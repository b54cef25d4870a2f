"""Run by test_vllm_out_of_process.py in a fresh interpreter: an out-of-process engine end to end.

A separate interpreter because vLLM keeps its parallel state per process: freeing an
out-of-process engine tears down the state the session's in-process engine runs on. Prints
one JSON line with what the test asserts on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main() -> None:
    torch.set_num_threads(1)
    from vllm_helpers import perturbed_policy  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)

    from grpo_lightning.config import RolloutConfig, VLLMConfig  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)
    from grpo_lightning.models import build_char_tokenizer, build_tiny_policy  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)
    from grpo_lightning.rollout import GenerationRequest, Sampling  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)
    from grpo_lightning.rollout.child_watchdog import descendants  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)
    from grpo_lightning.rollout.side_effects import ProcessState  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)
    from grpo_lightning.rollout.vllm import VLLMEngine  # noqa: PLC0415  (vLLM's spawned engine re-imports this file)

    tok = build_char_tokenizer()
    torch.manual_seed(5)
    state = ProcessState.capture()
    engine = VLLMEngine.from_policy(
        build_tiny_policy(tok), tok, VLLMConfig(in_process=False, max_model_len=64, kv_cache_gib=0.25), seed=0
    )
    state_kept = ProcessState.capture().same_as(state)
    if "--wait-to-be-killed" in sys.argv:  # the trainer's SIGKILL, mid-run: what it leaves behind
        engine_pids = sorted(descendants())  # the engine's processes and their watchdog
        print("RESULT " + json.dumps({"engine_pids": engine_pids, "socket_dir": engine._socket_dir.name}), flush=True)
        sys.stdin.read()
        return
    socket_dir = engine._socket_dir.name
    sockets_in_own_folder = any(p.is_socket() for p in Path(socket_dir).iterdir())
    prompt = tok("2+5=")["input_ids"]
    requests = [GenerationRequest(prompt, seed) for seed in (11, 12, 13)]
    before = engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=6, temperature=1.0)))
    trained = perturbed_policy(tok).eval()
    seconds = engine.load_weights(trained.state_dict().items())
    after = engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=6, temperature=1.0)))
    completion = after[0].token_ids
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = trained(ids).logits[0, len(prompt) - 1 : -1]
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
    probe = torch.tensor(engine.sequence_logprobs(prompt, completion))
    result = {
        "state_kept": state_kept,
        "folder_used": engine._sync_dir is not None,
        "sync_seconds": seconds,
        "before": [c.token_ids for c in before],
        "changed": [c.logprobs for c in after] != [c.logprobs for c in before],
        "probe_diff": float((probe - expected).abs().max()),
    }
    engine.close()
    # vLLM's IPC sockets were made in the engine's own folder, which close() removed
    result["sockets_in_own_folder"] = sockets_in_own_folder and not Path(socket_dir).exists()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":  # vLLM's engine process is spawned: the guard is required
    main()
