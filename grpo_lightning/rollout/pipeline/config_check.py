"""The rules of ``rollout.mode=pipeline`` that span groups: what the pipeline does not serve yet.

Registered with :func:`grpo_lightning.config.register_config_check` on import, so a run is refused
in one line before any model loads.
"""

from __future__ import annotations

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.models.lora import lora_enabled
from grpo_lightning.models.vision.loading import vision_model_type


@register_config_check
def pipeline_problems(cfg: TrainConfig) -> list[str]:
    """Episodes, a vision-language policy, a sharded policy and LoRA adapters alone to a vLLM server, refused
    with the reason."""
    if cfg.rollout.mode != "pipeline":
        return []
    problems = []
    if getattr(cfg.task.promoted(), "environment", None):
        problems.append(
            "rollout.mode=pipeline does not play episodes (task.environment) yet: an episode's turns wait on its "
            "environment between requests, and the producer schedules whole single-turn groups; use "
            "rollout.mode=sync, or async with a vLLM engine (each turn then records its weight version)"
        )
    if vision_model_type(cfg.model) is not None:
        problems.append(
            "rollout.mode=pipeline with a vision-language policy: the pipeline decodes text prompts only (the HF "
            "engine's rows join and leave between tokens without the image encoder; a vLLM server's streamed "
            "requests carry no images); use rollout.mode=sync"
        )
    if cfg.trainer.strategy == "fsdp":
        problems.append(
            "rollout.mode=pipeline with trainer.strategy=fsdp: the HF engine generates from a whole copy of the "
            "weights beside the trainer's, and under fsdp each rank holds a shard; use trainer.strategy=ddp"
        )
    r = cfg.rollout
    if r.engine == "vllm" and lora_enabled(cfg.model.lora) and r.vllm.sync.adapter == "auto":
        problems.append(
            "rollout.mode=pipeline with a vLLM server does not sync LoRA adapters alone (an adapter is chosen per "
            "request, and a request kept through a sync would change adapters mid-sequence); set "
            "rollout.vllm.sync.adapter=merged"
        )
    return problems
