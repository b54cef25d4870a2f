"""Worker for test_server_guard.py: 2 gloo ranks run the launch hand-over of the server engine.

``python tests/helpers/server_share_worker.py OUT_DIR``: rank 0 "launches" (a stand-in for
:class:`VLLMServer`, no vLLM) and hands its port and token to rank 1; then rank 0's launch
fails and rank 1 must hear of it, not wait. Each rank writes ``rank_<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_lightning.config import VLLMConfig, VLLMServerConfig
from grpo_lightning.rollout import vllm_server_process
from grpo_lightning.rollout.vllm_server import VLLMServerError
from grpo_lightning.rollout.vllm_server_process import base_url


class StandIn:
    fail = False

    def __init__(self, policy, tokenizer, config, seed, lora=None):
        if StandIn.fail:
            raise VLLMServerError("rollout.vllm.server.port=1234: something already listens on 127.0.0.1:1234")
        self.port, self.token = 4321, "tok-from-rank-0"


def run(rank: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["SHARE_PORT"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    vllm_server_process.VLLMServer = StandIn
    config = VLLMConfig(server=VLLMServerConfig(launch=True))
    server, port, token = vllm_server_process.launch_shared(None, None, config, seed=0)
    report = {"launched": server is not None, "url": base_url(config.server, port), "token": token}
    StandIn.fail = True
    try:
        vllm_server_process.launch_shared(None, None, config, seed=0)
    except VLLMServerError as err:
        report["failure"] = str(err)
    Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(run, args=(sys.argv[1],), nprocs=2, start_method="fork")  # the ranks inherit the imports
