"""Pipelined rollouts (``rollout.mode=pipeline``, docs/pipeline.md): a producer keeps the engine
generating while the trainer steps, weights change between decode steps, every token records its
version. The engines that serve it: ``hf_engine.py`` (the policy's own decoder over a generation
copy of the weights) and ``vllm_engine.py`` (vLLM servers, paused with their requests kept at each
sync); any engine with ``streams = True`` and the :class:`StreamingEngine` methods serves it too
(the in-process vLLM ``LLM`` cannot: refused at start-up, docs/pipeline.md)."""

from grpo_lightning.rollout.pipeline import config_check
from grpo_lightning.rollout.pipeline.engine import StreamingEngine
from grpo_lightning.rollout.pipeline.generator import PipelineRolloutGenerator
from grpo_lightning.rollout.pipeline.stream import PromptStream

__all__ = ["PipelineRolloutGenerator", "config_check", "PromptStream", "StreamingEngine"]
