"""Per-sample sampling seeds (F1, F2): never a constant, never shared across samples or ranks.

Every completion is drawn from its own random stream whose seed is a hash of
(run seed, rank, step, prompt index, sample index). The same derivation serves every
engine and both the sync and async modes, so a run is reproducible on resume (the step is
restored by the checkpoint) and no two samples of a group, rank or step share a stream.
"""

from __future__ import annotations

import hashlib
import struct

_SEED_BITS = 63  # fits a signed int64 (torch.Generator) and vLLM's SamplingParams.seed


def sample_seed(run_seed: int, rank: int, step: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed unique to one sample; a hash, so nearby inputs give unrelated seeds."""
    packed = struct.pack("<5q", run_seed, rank, step, prompt_index, sample_index)
    digest = hashlib.blake2b(packed, digest_size=8, person=b"grpo-seed").digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def group_seeds(run_seed: int, rank: int, step: int, num_prompts: int, num_generations: int) -> list[int]:
    """Seeds for a generation batch laid out group after group (prompt-major)."""
    return [
        sample_seed(run_seed, rank, step, prompt, sample)
        for prompt in range(num_prompts)
        for sample in range(num_generations)
    ]
