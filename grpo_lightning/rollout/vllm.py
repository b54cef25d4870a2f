"""Rollouts with vLLM, behind the same interface as the HF engine.

Contract (shared with :class:`~grpo_lightning.rollout.hf.HFEngine`):

* one vLLM request per sample (``n=1``) with ``SamplingParams(seed=request.seed)``, the seed
  derived by :func:`~grpo_lightning.rollout.seeding.sample_seed` from (run seed, rank, step,
  prompt, sample): samples are distinct and reproducible whatever engine, mode or rank
  produced them (F1, F2);
* ``Completion.token_ids`` end with EOS when the sample finished, and
  ``Completion.logprobs`` are vLLM's log-probs of the sampled tokens after temperature
  (``logprobs_mode="processed_logprobs"``), the same quantity the trainer computes from
  logits divided by the temperature, so the two can be compared token by token.

The engine runs in the training process by default (``in_process=True``): the policy is
saved once into a temporary safetensors folder that vLLM loads, and later weights are pushed
in memory (the ``memory`` transport: ``collective_rpc("reload_weights", weights_iterator=...)``).
Out of process, the weights travel through a safetensors folder instead (the ``folder``
transport; :mod:`grpo_lightning.rollout.transports`).

Registered as the ``vllm`` engine (options: ``rollout.vllm``, :class:`VLLMConfig`); with
``rollout.vllm.server.launch`` or ``.url`` it is a server's client instead
(:class:`~grpo_lightning.rollout.vllm_server.VLLMServerEngine`). Starting the engine must not change
the trainer's RNG streams or thread count (:mod:`grpo_lightning.rollout.side_effects`).

Every call into vLLM goes through one worker thread, in submission order. That is what makes
the async mode deterministic: a weight sync submitted after a background generation always
runs after it, so each generation batch sees exactly the weights of the step it was
launched at, however long either takes.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import torch

from grpo_lightning.config import TrainConfig, VLLMConfig
from grpo_lightning.env_vars import environment_variable
from grpo_lightning.models.adapter_sync import adapter_rank
from grpo_lightning.models.lora import is_peft_model, save_merged
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.child_watchdog import Watchdog, descendants, watch
from grpo_lightning.rollout.engine import ENGINES, Completion, GenerationRequest, RolloutEngine, Sampling
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.pipeline.vllm_engine import VLLMPipelineEngine
from grpo_lightning.rollout.side_effects import preserved_process_state
from grpo_lightning.rollout.temp_folders import owned_socket_dir, owned_temp_dir
from grpo_lightning.rollout.transports import TRANSPORTS
from grpo_lightning.rollout.vllm_cpu_steps import cpu_step_tokens
from grpo_lightning.rollout.vllm_server import VLLMServerEngine
from grpo_lightning.rollout.vllm_server_pool import VLLMServerPool
from grpo_lightning.rollout.vllm_vision import (
    EngineVision,
    checked_prompt,
    prepare_vllm,
    refuse_unsupported,
    write_engine_weights,
)


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform  # noqa: PLC0415  (vllm: optional, the vllm extra)

    return current_platform.is_cpu()


RPC_BASE_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM puts its IPC sockets (default: the temp folder)


class VLLMEngine:
    """A vLLM ``LLM`` serving the policy's current weights; see the module docstring."""

    owns_weights = True  # the trainer pushes every update (load_weights)
    supports_async = True  # generate_async runs on the engine's own thread

    def __init__(
        self,
        model_dir: str | Path,
        config: VLLMConfig,
        seed: int,
        eos_token_id: int | None = None,
        transport: str | None = None,
        vision: EngineVision | None = None,
    ):
        """``config`` is ``rollout.vllm``, ``seed`` the run's; ``transport`` names how weights are
        pushed (None: ``memory`` in process, ``folder`` out of process); ``vision``: a
        vision-language policy's image token and family (its prompts carry images: vllm_vision.py)."""
        self.config = config
        self.vision = vision
        self.seed = seed
        self.transport = TRANSPORTS[transport or ("memory" if config.in_process else "folder")]()
        self.model_dir = str(model_dir)
        self.eos_token_id = eos_token_id
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._sync_dir: tempfile.TemporaryDirectory | None = None
        # Out of process, vLLM's IPC sockets go in a folder of ours, removed on close (or, after
        # a SIGKILL, at the next start): vLLM leaves them in the temp folder otherwise.
        self._socket_dir = None if config.in_process else owned_socket_dir("vllm-ipc")
        self.weight_version: int | None = None  # the optimizer step of the last load_weights
        self._watchdog: Watchdog | None = None
        start = time.perf_counter()
        before = set() if config.in_process else descendants()
        self.llm = self._start()
        if not config.in_process:  # the EngineCore and its worker: stopped if the trainer dies
            self._watchdog = watch(descendants() - before)
        self.start_seconds = time.perf_counter() - start

    # ------------------------------------------------------------------ start
    @classmethod
    def from_policy(cls, policy, tokenizer, config: VLLMConfig, seed: int) -> VLLMEngine:
        """Save ``policy`` and ``tokenizer`` into a temporary folder and start vLLM on it.

        The folder lives as long as the engine (vLLM reads the config and tokenizer from it).
        """
        prepare_vllm(policy)  # a vision-language policy's family, without torchvision
        folder = owned_temp_dir("vllm-model")
        save_merged(policy, folder.name, tokenizer)  # a LoRA policy: its merged weights; a VLM: its processor
        vision = EngineVision.of(policy)
        if vision is not None:
            write_engine_weights(policy, folder.name)  # under the names vLLM's loader takes
        engine = cls(folder.name, config, seed, eos_token_id=tokenizer.eos_token_id, vision=vision)
        engine._model_folder = folder  # keep it alive
        return engine

    def _start(self):
        s = self.config
        # vLLM reads these lazily (also after start-up), so they stay set for the process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if s.in_process else "1"
        # An explicit KV budget (CPU and GPU alike; on CPU it replaces VLLM_CPU_KVCACHE_SPACE,
        # which takes whole GiB only), so the engine never sizes itself from free memory.
        kwargs = {"kv_cache_memory_bytes": int(s.kv_cache_gib * 2**30)}
        if not _is_cpu_platform():
            kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
        if s.max_model_len is not None:
            kwargs["max_model_len"] = s.max_model_len
        if _is_cpu_platform():  # never a prefill split across steps: vllm_cpu_steps.py says why
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = cpu_step_tokens(
                self.model_dir, s.max_model_len, s.max_num_batched_tokens
            )
        elif s.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = s.max_num_batched_tokens
        if self.vision is not None:
            kwargs["limit_mm_per_prompt"] = {"image": s.images_per_prompt}
        from vllm import LLM  # noqa: PLC0415  (vllm: optional, the vllm extra)

        def start():
            return LLM(
                model=self.model_dir,
                dtype=s.dtype,
                enforce_eager=s.enforce_eager,
                seed=self.seed,
                logprobs_mode="processed_logprobs",
                **kwargs,
            )

        # Started in the worker thread that runs every later call: vLLM's CPU worker binds
        # the OpenMP threads of the thread that starts it, and its kernels must run there.
        # The trainer's thread keeps its thread count, its RNG streams and its affinity.
        self.engine_thread = self._submit(threading.get_ident).result()
        sockets = self._socket_dir
        with (
            preserved_process_state(engine_thread=self.engine_thread),
            environment_variable(RPC_BASE_ENV, sockets.name) if sockets is not None else nullcontext(),
        ):
            return self._submit(start).result()

    # ------------------------------------------------------------------ the worker thread
    def _submit(self, fn, *args, **kwargs) -> Future:
        return self._worker.submit(fn, *args, **kwargs)

    # ------------------------------------------------------------------ generation
    def _blocking(self, future: Future):
        """Wait for ``future`` and give the caller back its torch RNG state.

        vLLM's CPU sampler draws a throw-away seed per row from the global torch generator
        before overwriting it with the request's own seed: samples do not depend on it, but
        the trainer's stream would advance. The caller is blocked meanwhile, so restoring is
        exact. (Async generation overlaps with training; see docs/vllm.md.)
        """
        torch_state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            return future.result()
        finally:
            torch.set_rng_state(torch_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state_all(cuda_state)

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        return self._blocking(self.generate_async(requests, sampling))

    def generate_async(self, requests: list[GenerationRequest], sampling: Sampling) -> Future:
        """Queue a generation behind every call submitted before it; returns its future.

        ``future.timing["seconds"]`` is set to the time vLLM itself spent on it (not the
        time it waited in the queue), for the tokens/s metric.
        """
        timing: dict[str, float] = {}
        future = self._submit(self._timed_generate, list(requests), sampling, timing)
        future.timing = timing
        return future

    def _timed_generate(self, requests, sampling, timing: dict[str, float]) -> list[Completion]:
        start, version = time.perf_counter(), self.weight_version
        completions = self._generate(requests, sampling)
        for completion in completions:
            completion.weight_version = version
        timing["seconds"] = time.perf_counter() - start
        return completions

    @staticmethod
    def sampling_params(request: GenerationRequest, sampling: Sampling):
        """One request's ``SamplingParams``: n=1 and the request's own seed, never a shared one."""
        from vllm import SamplingParams  # noqa: PLC0415  (vllm: optional, the vllm extra)

        return SamplingParams(
            n=1,
            seed=request.seed,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
        )

    def _generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        from vllm.inputs import TokensPrompt  # noqa: PLC0415  (vllm: optional, the vllm extra)

        if self.vision is not None:  # images as multimodal data (vllm_vision.py)
            prompts = [self.vision.prompt(r) for r in requests]
        else:
            prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [self.sampling_params(r, sampling) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        completions = []
        for request, output in zip(requests, outputs, strict=True):
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens, strict=True)]
            completion = Completion(token_ids=tokens, finished=sample.finish_reason == "stop", logprobs=logprobs)
            completions.append(checked_prompt(request, output.prompt_token_ids, completion))
        return completions

    # ------------------------------------------------------------------ scoring
    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The engine's log-probs (temperature 1) of ``completion_ids`` after ``prompt_ids``.

        Read from vLLM's prompt log-probs of the concatenated sequence: what the weight-sync
        check compares with the trainer's log-probs of the same tokens.
        """
        return self._blocking(self._submit(self._sequence_logprobs, list(prompt_ids), list(completion_ids)))

    def _sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        from vllm import SamplingParams  # noqa: PLC0415  (vllm: optional, the vllm extra)
        from vllm.inputs import TokensPrompt  # noqa: PLC0415  (vllm: optional, the vllm extra)

        sequence = prompt_ids + completion_ids
        params = SamplingParams(n=1, seed=0, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=sequence)], params, use_tqdm=False)[0]
        first = len(prompt_ids)
        return [output.prompt_logprobs[i][sequence[i]].logprob for i in range(first, len(sequence))]

    # ------------------------------------------------------------------ weights
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> float:
        """Replace the engine's weights (Hugging Face names); returns the seconds it took.

        ``version`` (the optimizer step of the weights) is recorded for the completions
        generated after the reload (``Completion.weight_version``).

        Runs in the worker thread after any queued generation. In process the tensors are
        handed over in memory; out of process they are written to a safetensors folder that
        the engine process reads. The prefix cache is reset: cached KV blocks were computed
        with the old weights.
        """
        # No copy: the caller (the weight-sync callback) blocks until the reload is done, so
        # the policy cannot change underneath it.
        snapshot = [(name, tensor.detach()) for name, tensor in named_tensors]
        return self._blocking(self._submit(self._load_weights, snapshot, version))

    def _load_weights(self, snapshot: list[tuple[str, torch.Tensor]], version: int | None) -> float:
        start = time.perf_counter()
        self.weight_version = version
        self.transport.push(PolicyWeights(snapshot, version), self)
        self.llm.reset_prefix_cache()
        if self.vision is not None:  # image embeddings cached by image: made by the old tower
            self.llm.llm_engine.reset_encoder_cache()
        return time.perf_counter() - start

    def reload_weights(self, **source) -> None:
        """vLLM's ``reload_weights`` (what a transport calls), on the worker thread it runs on."""
        self.llm.collective_rpc("reload_weights", kwargs=source)

    def sync_folder(self) -> str:
        """A temporary folder the engine process reads pushed weights from (``folder`` transport)."""
        if self._sync_dir is None:
            self._sync_dir = owned_temp_dir("vllm-sync")
        return self._sync_dir.name

    def close(self) -> None:
        """Finish queued work, stop an out-of-process engine core, stop the worker thread.

        The engine is unusable after. An in-process engine is freed with the object.
        """
        if not self.config.in_process:
            core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                self._submit(core.shutdown).result()
        self._worker.shutdown(wait=True)
        if self._watchdog is not None:
            self._watchdog.release()
        if self._socket_dir is not None:
            self._socket_dir.cleanup()


@ENGINES.register("vllm", options=VLLMConfig)
def vllm_engine(policy, tokenizer, cfg: TrainConfig) -> RolloutEngine:
    """vLLM on the policy's weights: in this process (or its own), or a server's client when
    ``rollout.vllm.server`` names one (``launch`` or ``url``)."""
    vision = EngineVision.of(policy) is not None
    if vision:  # a vision-language policy: what vLLM cannot do with one here is refused (vllm_vision.py)
        refuse_unsupported(policy.config.model_type, cfg.rollout)
    if cfg.rollout.uses_server:
        lora = None
        # Adapter-only sync; a VLM's merged weights (its adapters' names are not mapped to vLLM's).
        if cfg.rollout.vllm.sync.adapter == "auto" and is_peft_model(policy) and not vision:
            slots = (cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0) + 1
            lora = LoraServing(adapter_rank(policy), max(slots, 2))
        server = cfg.rollout.vllm.server
        engine_cls = VLLMServerPool if server.urls or server.replicas > 1 else VLLMServerEngine  # data-parallel
        engine = engine_cls.from_policy(policy, tokenizer, cfg.rollout.vllm, cfg.trainer.seed, lora)
        if cfg.rollout.mode == "pipeline":  # requests kept through each weight sync (pipeline/vllm_engine.py)
            return VLLMPipelineEngine(engine)
        return engine
    return VLLMEngine.from_policy(policy, tokenizer, cfg.rollout.vllm, cfg.trainer.seed)
