"""``rollout.*``: how completions are generated (engine, sampling, vLLM and its server)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config.base import Schema, check, choice, option
from grpo_lightning.config.pipeline import PipelineConfig

HF_DECODERS = ("fused", "loop", "generate", "graph")
ROLLOUT_MODES = ("sync", "async", "pipeline")
OFF_POLICY_ACTIONS = ("drop", "mask")  # what async generation does with samples beyond max_off_policy_steps


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


CONNECT_TIMEOUT_S = 10.0  # longest wait for a server's TCP connection (a black-holed address), within timeout_s


@dataclass
class VLLMServerConfig(Schema):
    url: Optional[str] = option(
        None,
        "A running vLLM OpenAI-compatible server (http://host:port) shared by every rank; null: none unless launch.",
    )
    urls: list[str] = option(
        [], "Several running vLLM servers (data-parallel rollouts): weights go to each, requests to the least loaded."
    )
    launch: bool = option(
        False, "Start a vLLM server subprocess on the policy's weights (rank 0); stopped with the run."
    )
    replicas: int = option(1, "launch: how many servers to start (data-parallel rollouts), each on a free port.")
    host: str = option("127.0.0.1", "launch: the address to listen on; loopback only unless allow_remote=true.")
    port: int = option(0, "launch: the port to listen on; 0: a free port. A port already in use is an error.")
    allow_remote: bool = option(
        False, "launch: allow a non-loopback host; the run's random token is then the only guard (a warning says so)."
    )
    api_key_env: Optional[str] = option(
        None, "url: name of the env variable holding the server's key (sent as a Bearer token; never logged)."
    )
    timeout_s: float = option(
        300.0,
        "Longest wait for any one server call (and a url server's first /health); past it the run stops naming it.",
    )
    start_timeout_s: float = option(300.0, "launch: longest wait for the launched server to become healthy.")
    concurrency: int = option(64, "Requests each rank keeps in flight at once (one per sample).")
    sync_dir: Optional[str] = option(
        None,
        "Folder rank 0 writes weights to for the server to reload (several: server-<i> in it); null: a temporary folder.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(
            problems,
            not (self.launch and self.url is not None),
            f"{p}launch=true and {p}url={self.url!r} exclude each other: launch a server, or connect to one",
        )
        check(
            problems,
            not (self.urls and (self.launch or self.url is not None)),
            f"{p}urls=[...] excludes {p}url and {p}launch=true: list every server in urls, or launch them (replicas)",
        )
        bad = [u for u in self.urls if not str(u).startswith(("http://", "https://"))]
        check(problems, not bad, f"{p}urls: {bad} must start with http:// or https:// (http://host:port)")
        check(problems, len(set(self.urls)) == len(self.urls), f"{p}urls={self.urls} names a server twice")
        check(problems, self.replicas >= 1, f"{p}replicas={self.replicas} must be >= 1")
        check(
            problems,
            self.replicas == 1 or (self.launch and self.port == 0),
            f"{p}replicas={self.replicas} needs {p}launch=true and {p}port=0 (each launched server takes a free "
            f"port); for running servers list them in {p}urls",
        )
        check(problems, self.timeout_s > 0, f"{p}timeout_s={self.timeout_s} must be > 0")
        check(problems, self.start_timeout_s > 0, f"{p}start_timeout_s={self.start_timeout_s} must be > 0")
        check(problems, self.concurrency >= 1, f"{p}concurrency={self.concurrency} must be >= 1")
        check(problems, 0 <= self.port < 65536, f"{p}port={self.port} must be in 0..65535 (0: a free port)")
        check(
            problems,
            not self.launch or self.allow_remote or is_loopback_host(self.host),
            f"{p}host={self.host} is not a loopback address: anyone on the network could call the launched server; "
            f"use 127.0.0.1, or set {p}allow_remote=true (its token is then the only guard)",
        )
        check(
            problems,
            not (self.launch and self.api_key_env),
            f"{p}api_key_env={self.api_key_env} is for a server given by url=; a launched server gets its own token",
        )
        return problems


SYNC_TRANSPORTS = ("folder", "network")  # the built-in server transports; a plugin's registered name works too
SYNC_ADAPTER_MODES = ("auto", "merged")


@dataclass
class VLLMSyncConfig(Schema):
    transport: str = option(
        "folder",
        f"How weights reach a vLLM server: one of {SYNC_TRANSPORTS} or a registered name (network: no shared disk).",
    )
    timeout_s: float = option(
        120.0, "Longest one weight sync may take; a watchdog aborts it past this and the engine's version stays."
    )
    retries: int = option(1, "Times a failed or timed-out sync is retried on a fresh connection before the run stops.")
    host: str = option(
        "127.0.0.1", "network: this trainer's address as the server reaches it (rank 0 listens there for the server)."
    )
    port: int = option(
        0, "network: the port rank 0 listens on for the server's weight group (server i of several: port + i); 0: free."
    )
    bucket_mb: float = option(64.0, "network: weights travel in buckets of at most this many MiB, one collective each.")
    adapter: str = option(
        "auto",
        f"One of {SYNC_ADAPTER_MODES}: auto ships only the LoRA adapters when model.lora is set (a vision-language "
        "policy's merged weights); merged never does.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}adapter", self.adapter, SYNC_ADAPTER_MODES)
        check(problems, self.timeout_s > 0, f"{p}timeout_s={self.timeout_s} must be > 0")
        check(problems, self.retries >= 0, f"{p}retries={self.retries} must be >= 0")
        check(problems, 0 <= self.port < 65536, f"{p}port={self.port} must be in 0..65535 (0: a free port)")
        check(problems, self.bucket_mb > 0, f"{p}bucket_mb={self.bucket_mb} must be > 0")
        return problems


@dataclass
class VLLMConfig(Schema):
    in_process: bool = option(
        True, "Run vLLM inside the training process (weights synced in memory); false: a separate engine process."
    )
    kv_cache_gib: float = option(
        1.0, "KV-cache budget in GiB (CPU: VLLM_CPU_KVCACHE_SPACE; GPU: kv_cache_memory_bytes)."
    )
    gpu_memory_utilization: float = option(
        0.3, "GPU only: fraction of GPU memory vLLM may use for weights and activations; leave room for training."
    )
    max_model_len: Optional[int] = option(
        None, "Longest prompt + completion the engine accepts; null takes the model's max_position_embeddings."
    )
    max_num_batched_tokens: Optional[int] = option(
        None,
        "Tokens one vLLM step takes; null: on a CPU the larger of 4096 and the context (a prompt is never split "
        "there), on a GPU vLLM's default.",
    )
    dtype: str = option("float32", "Engine weights dtype: float32 matches the trainer's log-probs; bfloat16 is faster.")
    enforce_eager: bool = option(True, "Skip CUDA-graph / torch.compile capture: faster start, slower decode.")
    sync_every: int = option(1, "Push the policy's weights into the engine every this many optimizer steps.")
    verify_sync: bool = option(
        False,
        "After each sync compare engine and policy log-probs of a fixed canary (before the version bump); fail beyond verify_tolerance.",
    )
    verify_tolerance: float = option(1e-3, "Largest allowed |engine - policy| log-prob difference of the canary.")
    images_per_prompt: int = option(
        4,
        "A vision-language policy: the most images one prompt may carry (vLLM's limit_mm_per_prompt, in process or "
        "on a launched server).",
    )
    sync: VLLMSyncConfig = option(
        VLLMSyncConfig(), "How weights reach the engine: transport, timeout, retries, adapters."
    )
    server: VLLMServerConfig = option(
        VLLMServerConfig(), "A vLLM server shared by every rank instead of an in-process engine (devices > 1)."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.sync_every >= 1, f"{p}sync_every={self.sync_every} must be >= 1")
        check(problems, self.kv_cache_gib > 0, f"{p}kv_cache_gib={self.kv_cache_gib} must be > 0")
        check(
            problems,
            0 < self.gpu_memory_utilization <= 1,
            f"{p}gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]",
        )
        check(problems, self.verify_tolerance > 0, f"{p}verify_tolerance={self.verify_tolerance} must be > 0")
        check(
            problems,
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            f"{p}max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1 or null",
        )
        check(problems, self.images_per_prompt >= 1, f"{p}images_per_prompt={self.images_per_prompt} must be >= 1")
        return problems


@dataclass
class RolloutConfig(Schema):
    engine: str = option("hf", "Generation engine: a registered name (hf, vllm, or one a plugins= file registers).")
    prompts_per_step: int = option(16, "Prompts per generation batch (one optimizer pass each).")
    num_generations: int = option(8, "Completions per prompt: the group size G (>= 2).")
    max_new_tokens: int = option(4, "Completion budget in tokens; also the horizon of seq_mean_token_sum_norm.")
    temperature: float = option(1.0, "Sampling temperature (> 0); the trainer's log-probs use it too.")
    top_p: float = option(1.0, "Nucleus sampling mass in (0, 1].")
    top_k: int = option(0, "Sample among the k most likely tokens; 0 turns it off.")
    generation_batch_size: int = option(256, "Sequences per generate() call (memory bound).")
    hf_decoder: str = option(
        "fused", f"engine=hf: how the policy decodes, one of {HF_DECODERS} (same tokens, speeds differ)."
    )
    mode: str = option(
        "sync",
        f"One of {ROLLOUT_MODES}; async (vllm) generates whole batches ahead, pipeline keeps the engine busy (docs/pipeline.md).",
    )
    max_staleness: int = option(
        1, "async: how many generation batches run ahead of training (each is that many optimizer steps stale)."
    )
    max_off_policy_steps: int = option(
        8, "async, pipeline: most optimizer steps a trained token may lag the weights that sampled it; 0 = synchronous."
    )
    off_policy_action: str = option(
        "drop", f"async, pipeline: what happens to samples beyond max_off_policy_steps, one of {OFF_POLICY_ACTIONS}."
    )
    pipeline: PipelineConfig = option(PipelineConfig(), "rollout.mode=pipeline: how far generation runs ahead.")
    vllm: VLLMConfig = option(VLLMConfig(), "vLLM engine settings (rollout.engine=vllm).")
    dynamic_sampling: bool = option(
        False, "DAPO's dynamic sampling: drop groups with equal rewards and draw more prompts to fill the batch."
    )
    max_sampling_rounds: int = option(
        3, "dynamic_sampling: generation rounds per step at most; a batch still short is topped up with tied groups."
    )
    progress_min_tokens: int = option(
        32, "Show a per-token progress bar for rollouts with max_new_tokens >= this (long, slow ones); 0 never."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}hf_decoder", self.hf_decoder, HF_DECODERS)
        choice(problems, f"{p}mode", self.mode, ROLLOUT_MODES)
        check(
            problems,
            self.num_generations >= 2,
            f"{p}num_generations={self.num_generations} must be >= 2: GRPO compares completions within a group",
        )
        check(problems, self.prompts_per_step >= 1, f"{p}prompts_per_step={self.prompts_per_step} must be >= 1")
        check(problems, self.max_new_tokens >= 1, f"{p}max_new_tokens={self.max_new_tokens} must be >= 1")
        check(problems, self.temperature > 0, f"{p}temperature={self.temperature} must be > 0")
        check(problems, 0 < self.top_p <= 1, f"{p}top_p={self.top_p} must be in (0, 1]")
        check(problems, self.top_k >= 0, f"{p}top_k={self.top_k} must be >= 0 (0 = off)")
        check(
            problems,
            self.generation_batch_size >= 1,
            f"{p}generation_batch_size={self.generation_batch_size} must be >= 1",
        )
        check(
            problems, self.max_sampling_rounds >= 1, f"{p}max_sampling_rounds={self.max_sampling_rounds} must be >= 1"
        )
        check(
            problems,
            not self.dynamic_sampling or self.mode != "async",
            f"{p}dynamic_sampling=true needs {p}mode=sync or pipeline (async batches are queued before their rewards "
            "are known)",
        )
        check(problems, self.max_staleness >= 1, f"{p}max_staleness={self.max_staleness} must be >= 1")
        check(
            problems,
            self.max_off_policy_steps >= 0,
            f"{p}max_off_policy_steps={self.max_off_policy_steps} must be >= 0 (0 = synchronous)",
        )
        choice(problems, f"{p}off_policy_action", self.off_policy_action, OFF_POLICY_ACTIONS)
        check(
            problems,
            self.mode != "async" or self.engine != "hf",
            f"{p}mode=async needs {p}engine=vllm or a plug-in engine that generates in the background "
            "(the HF engine generates with the policy being trained)",
        )
        if self.mode == "pipeline":
            problems += self.pipeline_problems(p)
        return problems

    def pipeline_problems(self, p: str) -> list[str]:
        """mode=pipeline: an engine that takes new weights between decode steps, and a bound the lag can meet."""
        problems: list[str] = []
        check(
            problems,
            self.engine != "vllm" or self.uses_server,
            f"{p}mode=pipeline with {p}engine=vllm needs a vLLM server: the in-process LLM's generate blocks for a "
            "whole batch and cannot pause with its requests kept to take weights mid-sequence; set "
            f"{p}vllm.server.launch=true (or url/urls), or use {p}mode=async with the in-process engine",
        )
        check(
            problems,
            self.engine != "hf" or self.hf_decoder in ("fused", "graph"),
            f"{p}mode=pipeline with {p}hf_decoder={self.hf_decoder}: sequences join and leave the decode batch "
            f"between tokens, which only the fused layers do; use {p}hf_decoder=fused (or graph)",
        )
        check(
            problems,
            self.pipeline.max_lag <= self.max_off_policy_steps,
            f"{p}pipeline.max_lag={self.pipeline.max_lag} exceeds {p}max_off_policy_steps={self.max_off_policy_steps}: "
            "most groups would lag past the bound and be dropped; lower max_lag or raise the bound",
        )
        return problems

    @property
    def uses_server(self) -> bool:
        """A vLLM server (launched or running) generates, not an engine inside this process."""
        server = self.vllm.server
        return self.engine == "vllm" and (server.launch or server.url is not None or bool(server.urls))
