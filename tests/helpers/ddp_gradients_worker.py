"""Worker for test_ddp_gradients.py: 2 ranks x B sequences vs 1 rank x 2B, every aggregation mode.

Run as ``python tests/helpers/ddp_gradients_worker.py OUT_DIR [ddp] [fsdp]`` (each into OUT_DIR/<kind>):
it spawns two gloo processes; each wraps the policy in torch's DistributedDataParallel (the gradient averaging Lightning's DDP
strategy uses) or, with ``fsdp``, shards policy and reference with FSDP2 as
``trainer.strategy=fsdp`` does (:func:`grpo_lightning.models.sharding.shard_module`), gives GRPOModule a minimal trainer whose strategy reduces over the process
group, and runs ``prepare`` + ``accumulate_gradients`` on its half of a fixed batch. Rank 0
also computes the gradient of the whole batch in one process. Writes one JSON per mode.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from grpo_lightning.algorithm import LOSS_AGG_MODES
from grpo_lightning.config import AlgorithmConfig, TinyModelConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.sharding import shard_module
from grpo_lightning.rollout import RolloutBatch
from grpo_lightning.step.module import GRPOModule

GROUPS, GROUP_SIZE, MAX_NEW = 4, 4, 6  # 2 groups per rank


def fixed_batch() -> RolloutBatch:
    """A deterministic batch with varied completion lengths (so every mode differs)."""
    g = torch.Generator().manual_seed(0)
    n = GROUPS * GROUP_SIZE
    prompt_ids = torch.randint(3, 19, (n, 4), generator=g)
    prompt_ids = prompt_ids.view(GROUPS, GROUP_SIZE, 4)[:, :1].expand(-1, GROUP_SIZE, -1).reshape(n, 4)
    lengths = torch.randint(1, MAX_NEW + 1, (n,), generator=g)
    completion_mask = (torch.arange(MAX_NEW)[None, :] < lengths[:, None]).long()
    completion_ids = torch.randint(3, 19, (n, MAX_NEW), generator=g) * completion_mask
    rewards = torch.rand(n, generator=g)
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        rewards=rewards,
        group_size=GROUP_SIZE,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
    )


def rows(batch: RolloutBatch, part: slice) -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[part],
        prompt_mask=batch.prompt_mask[part],
        completion_ids=batch.completion_ids[part],
        completion_mask=batch.completion_mask[part],
        rewards=batch.rewards[part],
        group_size=GROUP_SIZE,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
    )


def make_module(mode: str) -> GRPOModule:
    tokenizer = build_char_tokenizer(TinyModelConfig().alphabet)
    policy = build_tiny_policy(tokenizer, seed=0)
    cfg = AlgorithmConfig(loss_agg=mode, beta=0.1, micro_batch_size=2, num_iterations=1)
    module = GRPOModule(policy, cfg)
    with torch.no_grad():  # move the policy away from the reference so the KL term has a gradient
        for p in module.policy.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return module


def flat_grad(module: GRPOModule) -> torch.Tensor:
    policy = module.policy.module if isinstance(module.policy, DistributedDataParallel) else module.policy
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in policy.parameters()]
    return torch.cat([g.reshape(-1) for g in grads])


def wrap(module: GRPOModule, kind: str, world: int):
    """DDP around the policy, or FSDP2 units over policy and reference; returns the no-sync context."""
    if kind == "fsdp":
        shard_module(module, init_device_mesh("cpu", (world,)))
        return None  # FSDP2 reduce-scatters every micro-batch's gradient: nothing to block
    module.policy = DistributedDataParallel(module.policy)
    return module.policy.no_sync


def worker(rank: int, world: int, out_dir: str, port: int, kinds: list[str]) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for kind in kinds:  # one process group for all: start-up is most of the worker's time
        compare(rank, world, os.path.join(out_dir, kind), kind)
    auto_micro_batches(rank, world, out_dir)
    dist.barrier()  # both ranks done, every result written
    # Exit without tearing down. torch's gloo teardown can deadlock here: freeing the DDP reducer
    # destroys the process group, which joins gloo's work thread while holding the GIL, and that
    # thread needs the GIL to free a finished all-reduce (seen once in a clean-clone run: a rank
    # hung at exit until the test's 300 s timeout). The results are on disk; nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def process_group_strategy(block_backward_sync=None) -> SimpleNamespace:
    """What GRPOModule asks of Lightning's strategy, over the gloo process group."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    return SimpleNamespace(
        reduce=lambda t, reduce_op="sum": (dist.all_reduce(t, op=ops[reduce_op]), t)[1],
        backward=lambda loss, optimizer, *a, **k: loss.backward(),
        block_backward_sync=block_backward_sync,
    )


def auto_micro_batches(rank: int, world: int, out_dir: str) -> None:
    """micro_batch_size=auto on ranks whose rollouts differ in width: each writes its micro-batch sizes
    (``auto_rank<r>.json``). Rank 0's 64 rows are 4 + 12 tokens wide, rank 1's 4 + 96."""
    rows, width = 64, (12, 96)[rank]
    g = torch.Generator().manual_seed(rank)
    prompt_ids = torch.randint(3, 19, (rows, 4), generator=g)
    completion_mask = torch.ones(rows, width, dtype=torch.long)
    completion_mask[1:, width // 2 :] = 0  # one row uses the full width
    batch = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=torch.randint(3, 19, (rows, width), generator=g) * completion_mask,
        completion_mask=completion_mask,
        rewards=torch.rand(rows, generator=g),
        group_size=GROUP_SIZE,
        max_new_tokens=width,
        temperature=1.0,
    )
    tokenizer = build_char_tokenizer(TinyModelConfig().alphabet)
    module = GRPOModule(build_tiny_policy(tokenizer, seed=0), AlgorithmConfig(beta=0.0))
    module._trainer = SimpleNamespace(world_size=world, strategy=process_group_strategy())
    prepared = module.prepare(batch)
    with open(os.path.join(out_dir, f"auto_rank{rank}.json"), "w") as f:
        json.dump(
            {"used_width": batch.used_width, "sizes": [mb.input_ids.shape[0] for mb in prepared.micro_batches]}, f
        )


def compare(rank: int, world: int, out_dir: str, kind: str) -> None:
    """Per loss mode, rank 0 writes ``<mode>.json``: the 2-rank gradient against the 1-rank one."""
    os.makedirs(out_dir, exist_ok=True)
    batch = fixed_batch()
    share = GROUPS * GROUP_SIZE // world
    for mode in LOSS_AGG_MODES:
        reference = None
        if rank == 0:  # 1 rank x 2B: the whole batch in one process
            single = make_module(mode)
            prepared = single.prepare(batch)
            single.accumulate_gradients(batch, prepared)
            reference = flat_grad(single)
        module = make_module(mode)
        module._trainer = SimpleNamespace(world_size=world, strategy=process_group_strategy(wrap(module, kind, world)))
        mine = rows(batch, slice(rank * share, (rank + 1) * share))
        prepared = module.prepare(mine)
        stats = module.accumulate_gradients(mine, prepared)
        grad = flat_grad(module)
        if rank == 0:
            with open(os.path.join(out_dir, f"{mode}.json"), "w") as f:
                json.dump(
                    {
                        "mode": mode,
                        "max_abs_diff": float((grad - reference).abs().max()),
                        "grad_norm": float(reference.norm()),
                        "normalizer": float(prepared.normalizer),
                        "aggregation": {k: [v.mode, v.normalizer] for k, v in stats.aggregation.items()},
                    },
                    f,
                )


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    # fork: the ranks inherit this process's imports (torch, Lightning) instead of importing them again
    mp.start_processes(
        worker, args=(2, sys.argv[1], free_port, sys.argv[2:] or ["ddp"]), nprocs=2, join=True, start_method="fork"
    )
