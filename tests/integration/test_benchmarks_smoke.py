"""Every script in benchmarks/ imports and runs: its smallest setting, for seconds, in this process.

A benchmark is run rarely and by hand, so a call it makes into the package can break for weeks
before anyone notices (lora_sync.py's weight sync did). Here each one runs its smallest setting
through its own ``main()`` (or its child's, for the scripts that run each measurement in a
fresh process) and the test checks what it printed or wrote. Where a real run needs TRL's venv
(``.venv-bench``, which CI does not build), a GPU, a vLLM engine or server, root, or minutes,
the script is asked for ``--help`` and the parts of it that run without those (its
configuration, its sync loop) are run on their own. Nothing here is a measurement.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

import grpo_lightning.build
import grpo_lightning.step.hooks as hooks_file
import grpo_lightning.step.module as module_file
from grpo_lightning.algorithm.corrections import CORRECTIONS
from grpo_lightning.config import ModelConfig, validate_config
from grpo_lightning.config.compose import compose
from grpo_lightning.health.mismatch import MismatchCheck
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy, load_policy
from grpo_lightning.step.module import GRPOModule
from tests.helpers.lying_engines import OwnWeightsEngine

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NAMES = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import each other by name (trl_vs_ours, memory, gpu_qwen2)

# The module-scoped fixture (the tiny model's folder) is cheap: each worker may make its own.
pytestmark = pytest.mark.spread_over_workers


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def result_line(printed: str) -> dict | list:
    """The JSON after ``RESULT `` on the last such line: what a benchmark's child hands its parent."""
    lines = [line for line in printed.splitlines() if line.startswith("RESULT ")]
    assert lines, printed[-2000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture
def run_main(monkeypatch, capsys, tmp_path):
    """``run_main(name, *args)``: benchmarks/<name>.py's ``main()`` with that command line, in this
    process; returns what it printed. Its temporary folders go under the test's, and what its
    children set in the environment (huge pages, tokenizer threads) is put back afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name, value in (("THP_MEM_ALLOC_ENABLE", "0"), ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(name, os.environ.get(name, value))

    def run(name: str, *args: str) -> str:
        module = importlib.import_module(name)
        monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / f"{name}.py"), *args])
        capsys.readouterr()
        module.main()
        return capsys.readouterr().out

    return run


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny in-code policy saved as a folder, as trl_vs_ours.py saves it for both trainers."""
    trl_vs_ours = importlib.import_module("trl_vs_ours")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tiny_model")))
        return trl_vs_ours.save_tiny_model()


def keep_attributes(monkeypatch, owner, names) -> None:
    """Have ``monkeypatch`` put ``owner``'s attributes back after a benchmark wraps them in place."""
    for name in names:
        monkeypatch.setattr(owner, name, getattr(owner, name))


# ------------------------------------------------------------------------------------------ imports
@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_imports_and_has_a_main(name):
    module = importlib.import_module(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"


# ---------------------------------------------------------------------------- --help where a run can't
HELP_ONLY = {  # script -> an option its --help must list (what it needs that this suite has not)
    "code_task_smollm2": "--eval-every",  # vLLM and SmolLM2, minutes
    "distill_context_smollm2": "--shots",  # SmolLM2, minutes (its commands: below)
    "distill_tiny": "--teacher-steps",  # a teacher and 15 runs, minutes (its reading of a run: below)
    "gpu_decode_step": "--skip-compile",  # a GPU
    "gpu_head": "--budgets-mb",  # a GPU
    "lora_sync": "--syncs",  # vLLM and SmolLM2 (its sync loop: below)
    "nccl_watchdog_check": "--timeout-s",  # a GPU and NCCL
    "pipeline_learning": "--warm-steps",  # a warm start and 30 runs, an hour (its commands and stops: below)
    "network_other_user": "--start-timeout",  # root and a vLLM server
    "scale_out_runs": "--steps",  # two ranks and a vLLM server, minutes (its config: below)
    "sync_cost": "--bucket-mb",  # a launched vLLM server
    "weight_sync": "--server",  # vLLM and SmolLM2 (its config: below)
}


@pytest.mark.parametrize("name", sorted(HELP_ONLY))
def test_benchmarks_that_need_more_than_a_cpu_answer_help(name, run_main, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_main(name, "--help")
    assert stopped.value.code == 0
    assert HELP_ONLY[name] in capsys.readouterr().out


def test_lora_sync_times_verified_merged_syncs(monkeypatch):
    """lora_sync.py's loop (it passed the module to WeightSync.sync, which takes PolicyWeights since
    weight_push.py was split out of the module) against an engine with weights of its own."""
    lora_sync = importlib.import_module("lora_sync")
    for rank in (0, 4):
        policy, tokenizer = lora_sync.lora_policy("tiny", rank)
        engine = OwnWeightsEngine(load_policy(ModelConfig(name_or_path="tiny"))[0], tokenizer.eos_token_id)
        result = lora_sync.timed_syncs(policy, tokenizer, engine, rank, syncs=2)
        assert len(result["sync_seconds"]) == 2 and finite(*result["sync_seconds"])
        assert result["max_probe_diff"] < 1e-3  # the engine serves the merged weights
        assert engine.weight_version == 1
        assert (result["trained_params"] < 20_000) == (rank > 0)  # adapters only, or the whole tiny model


def test_code_task_and_scale_out_configs_compose():
    """The overrides code_task_smollm2.py and scale_out_runs.py run with still name real options."""
    code_task = importlib.import_module("code_task_smollm2")
    cfg = code_task.train_config([*code_task.DEFAULTS, "trainer.max_steps=2", "trainer.output_dir=out"])
    assert (cfg.task.name, cfg.rollout.engine, cfg.model.name_or_path) == ("code", "vllm", "smollm2_135m")
    scale_out = importlib.import_module("scale_out_runs")
    for extra in scale_out.RUNS.values():
        cfg = compose([*scale_out.COMMON, *extra, "trainer.max_steps=2", "trainer.output_dir=out"])[0]
        assert cfg.rollout.vllm.sync.transport == "network" and cfg.trainer.devices == 2


@pytest.mark.slow
def test_distill_benchmarks_commands_compose_and_a_run_is_read(tmp_path):
    """distill_tiny.py's and distill_context_smollm2.py's commands name real options (their teacher a tiny
    folder), and a run's metrics.csv rows become steps and seconds to the threshold."""
    distill_tiny = importlib.import_module("distill_tiny")
    context = importlib.import_module("distill_context_smollm2")
    teacher = str(tmp_path / "teacher")
    tokenizer = build_char_tokenizer()
    build_tiny_policy(tokenizer).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    # Every method's overrides in one composition (each key checked once; later values win).
    every = dict.fromkeys(o.format(teacher=teacher) for extra, _ in distill_tiny.METHODS.values() for o in extra)
    cfg = compose([*distill_tiny.STUDENT, *every, "trainer.output_dir=o"])[0]
    validate_config(cfg)
    assert cfg.algorithm.teacher.objective == "jsd" and cfg.algorithm.teacher.path == teacher
    student = [*context.TASK, *context.PURE, "algorithm.teacher.kind=context", "trainer.output_dir=o"]
    cfg = compose([*student, context.quoted("algorithm.teacher.context.system_prompt", context.few_shot_prompt(3))])[0]
    assert cfg.algorithm.teacher.context.system_prompt.count("<answer>") == 4  # the preset's line and 3 examples
    assert not any(cfg.task.rewards.values())
    # A SmolLM2 run's rows (reasoning-gym's reward columns, validation rows of their own) summarized.
    logged = [
        {"step": "0", "val/accuracy": "0.25"},
        *(
            {"step": str(i), "train/step_time": "4", "distill/teacher_seconds": "1", "distill/kl": str(kl)}
            for i, kl in ((1, 0.2), (2, 0.1))
        ),
        {"step": "2", "val/accuracy": "0.5"},
    ]
    summary = context.summarize_student(logged, steps=2)
    assert summary["accuracy_by_step"] == [(0, 0.25), (2, 0.5)] and summary["accuracy_after"] == 0.5
    assert summary["steps_trained"] == 2 and summary["seconds_per_step_median"] == 4.0
    assert summary["teacher_share_median"] == 0.25 and summary["distill_kl_first_last"] == [0.2, 0.1]
    assert context.summarize_student(logged, steps=3)["accuracy_after"] is None  # stopped early: run again
    rewards = [0.0, 0.2, 0.6, 0.8, 1.0]  # the mean of the last 2 first reaches 0.5 at the 4th step: (0.6 + 0.8) / 2
    rows = [
        {
            "step": str(i),
            "reward/arithmetic_exact/mean": str(r),
            "reward/arithmetic_close/mean": str(r),
            "train/step_time": "0.5",
        }
        for i, r in enumerate(rewards)
    ]
    summary = distill_tiny.summarize(rows, window=2)
    assert summary["steps_to_threshold"] == 4 and summary["train_seconds_to_threshold"] == 2.0
    runs = [
        {"method": m, "steps_to_threshold": s, "train_seconds_to_threshold": s, "reward_last_window": 0.5}
        for m, s in (("grpo", 300), ("grpo", 330), ("grpo", None), ("distill", 100), ("distill", 110), ("distill", 90))
    ]
    table = distill_tiny.table(runs)
    assert table["grpo"]["median_steps"] == 330 and table["distill"]["median_steps"] == 100
    assert table["distill"]["grpo_steps_over_these"] == 3.3


@pytest.mark.slow
def test_distill_cost_times_every_variant_on_one_batch(run_main, tmp_path):
    out = tmp_path / "cost.json"
    printed = run_main("distill_cost", "--setting", "tiny", "--repeats", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["median_seconds"]) == {"grpo", "distill", "distill_kl", "jsd"}
    assert all(finite(*m.values()) and m["cpu"] > 0 for m in result["median_seconds"].values())
    assert result["over_grpo"]["grpo"] == {"wall": 1.0, "cpu": 1.0} and "x grpo" in printed


def test_weight_sync_config_verifies_every_sync():
    cfg = importlib.import_module("weight_sync").sync_config("tiny", steps=2, server=True)
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.verify_sync and cfg.rollout.vllm.server.launch
    assert cfg.trainer.max_steps == 2


# ------------------------------------------------------------------------------- CPU runs, in process
@pytest.mark.slow
def test_corrections_cost_prices_every_correction(run_main):
    printed = run_main("corrections_cost", "--repeats", "1")
    rows = {line.split()[0]: line.split()[1:] for line in printed.splitlines()[2:]}
    assert set(rows) == {"none", "all", *CORRECTIONS}
    assert finite(*(float(row[0]) for row in rows.values()))


def test_compare_corrections_verl_reads_a_checkout(run_main, tmp_path):
    """Against a stand-in for verl's helper: truncated IS as verl defines it, a mask that rejects
    nothing. Our tis_token must match it; every token our rejections drop is a disagreement."""
    helper = tmp_path / "verl" / "verl" / "trainer" / "ppo" / "rollout_corr_helper.py"
    helper.parent.mkdir(parents=True)
    helper.write_text(
        "import torch\n"
        "from verl.utils.torch_functional import masked_sum\n\n\n"
        "def compute_rollout_correction_weights(log_ratio, mask, level, threshold):\n"
        "    if level == 'token':\n"
        "        return torch.exp(log_ratio).clamp(max=threshold) * mask, {}\n"
        "    total = masked_sum(log_ratio, mask, axis=-1)[:, None].clamp(-20, 20)\n"
        "    return torch.exp(total).clamp(max=threshold).expand_as(log_ratio) * mask, {}\n\n\n"
        "def compute_rollout_rejection_mask(log_ratio, mask, option, spec):\n"
        "    return torch.ones_like(mask), {}\n"
    )
    try:
        printed = run_main("compare_corrections_verl", "--verl", str(tmp_path / "verl"), "--cases", "3")
    finally:
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]  # the script's stand-ins for verl's own modules
    rows = [line.rsplit(maxsplit=4) for line in printed.splitlines()[1:]]
    assert len(rows) == 4 + 11  # tis_token, tis_seq, geo_mask, k3_seq_mask; 4 x 3 rejections but seq_max k1
    table = {row[0]: [float(x) for x in row[2:]] for row in rows}
    assert table["tis_token"][0] < 1e-5 and table["tis_seq"][0] < 1e-4
    for label, (_, disagree, masked) in table.items():
        if label.startswith("rejection"):
            assert 0 <= masked <= 1 and disagree == pytest.approx(masked, abs=2e-3)


@pytest.mark.slow
def test_episodes_throughput_writes_every_kind_and_concurrency(run_main, tmp_path):
    out = tmp_path / "episodes.json"
    args = ["--episodes", "2", "--turns", "1", "--turn-tokens", "4", "--env-ms", "1", "--rounds", "1"]
    run_main("episodes_throughput", *args, "--concurrency", "1", "2", "--out", str(out))
    results = json.loads(out.read_text())["results"]
    assert set(results) == {f"{kind}@{c}" for kind in ("none", "wait_async", "wait_sync", "cpu") for c in (1, 2)}
    assert all(r["episodes_per_s"] > 0 and finite(r["speedup"]) for r in results.values())


def test_gpu_sampler_draws_on_a_cpu(run_main, tmp_path):
    out = tmp_path / "sampler.json"
    run_main("gpu_sampler", "--device", "cpu", "--rows", "4", "--vocab", "1000", "--repeats", "1", "--out", str(out))
    results = json.loads(out.read_text())
    assert results["kernel_check"] is None  # no Triton kernel on a CPU: the eager inverse CDF
    assert results["tokens_differing_of"]["whole-row CDF"] == [0, 400]
    assert finite(*results["ms"].values())


@pytest.mark.slow
def test_gpu_qwen2_trains_its_small_shape_on_a_cpu(run_main, tmp_path):
    gpu_qwen2 = importlib.import_module("gpu_qwen2")
    model_dir = gpu_qwen2.build_model_folder("small", str(tmp_path / "qwen2-small"))
    args = ["--device", "cpu", "--prompts", "2", "--generations", "2", "--max-tokens", "4", "--steps", "2"]
    printed = run_main("gpu_qwen2", "--child", "lora_bf16", "--model-dir", model_dir, *args)
    result = result_line(printed)
    assert len(result["steps"]) == 2 and 0 < result["trained_parameters"] < result["total_parameters"]
    summary = gpu_qwen2.summarize(result, warmup=1, peak_tflops=1.0, matmul_tflops=None)
    assert finite(summary["median_step_s"], summary["train_tflops"]) and summary["train_tflops"] > 0


@pytest.mark.slow
def test_health_overhead_times_the_monitor(run_main, tmp_path):
    out = tmp_path / "health.json"
    run_main("health_overhead", "--steps", "6", "--repeats", "1", "--json", str(out))
    result = json.loads(out.read_text())
    assert finite(*result["direct_share"], *result["ab_ratio"], *result["monitor_ms_per_step"])
    assert 0 < result["direct_share"][0] < 1


@pytest.mark.slow
def test_key_lookup_smoke_plays_before_and_after_training(run_main, tmp_path):
    args = ["--smoke", "--steps", "1", "--seeds", "0", "--eval-prompts", "1", "--eval-samples", "2"]
    run_main("key_lookup_smollm2", *args, "--out", str(tmp_path / "key_lookup"))
    (run,) = json.loads((tmp_path / "key_lookup" / "result.json").read_text())["runs"]
    assert run["steps"] == 1
    for when in ("before", "after"):
        rates = run[when]
        assert rates["episodes"] == 2
        assert all(0 <= rates[k] <= 1 for k in ("call_rate", "well_formed_rate", "correct_rate"))


def test_logprob_memory_variants_agree(run_main):
    dims = ["--batch", "2", "--time", "8", "--vocab", "64", "--hidden", "16"]
    results = {
        v: json.loads(run_main("logprob_memory", "--variant", v, *dims)) for v in ("plain", "checkpointed", "ours")
    }
    plain = results["plain"]
    for variant in ("checkpointed", "ours"):
        assert results[variant]["logp_sum"] == pytest.approx(plain["logp_sum"], rel=1e-5)
        assert results[variant]["grad_sum"] == pytest.approx(plain["grad_sum"], rel=1e-5)
        assert finite(results[variant]["peak_mb"], results[variant]["seconds"])


@pytest.mark.slow
def test_memory_child_measures_a_run_of_ours(run_main, tiny_model_dir):
    printed = run_main("memory", "--child", "ours-full-fp32", "--model-dir", tiny_model_dir, "--steps", "1")
    result = result_line(printed)
    assert result["peak_rss_mb"] >= result["baseline_rss_mb"] > 0 and finite(result["training_peak_rss_mb"])
    assert result["trained_params"] > 0 and result["reference"] is not None  # beta 0.04: a reference model


@pytest.mark.slow
def test_memory_phases_marks_each_phase_of_a_step(run_main, tiny_model_dir, monkeypatch):
    phases = ["generate_rollout", "_reference_log_probs", "completion_log_probs", "_backward", "_guarded_step"]
    keep_attributes(monkeypatch, GRPOModule, [*phases, "training_step"])  # the script wraps them for good
    keep_attributes(monkeypatch, grpo_lightning.build, ["build_run"])
    printed = run_main("memory_phases", "--model-dir", tiny_model_dir, "--run", "ours-full-fp32", "--steps", "1")
    marked = {line[:18].strip() for line in printed.splitlines()}
    assert {"build_run", "rollout", "reference pass", "forward", "backward", "optimizer step", "whole step"} <= marked
    assert "peak RSS (getrusage)" in printed


@pytest.mark.slow
def test_mismatch_cost_times_the_mismatch_metrics(run_main, monkeypatch):
    keep_attributes(monkeypatch, module_file, ["measure_mismatch", "mismatch_metrics"])
    keep_attributes(monkeypatch, MismatchCheck, ["measure", "evaluate"])
    args = ["--steps", "3", "--warmup", "1", "--prompts", "2", "--generations", "2", "--tokens", "2"]
    result = json.loads(run_main("mismatch_cost", *args).splitlines()[-1])
    assert result["steps_timed"] == 2
    assert finite(result["step_s_median"], result["share_metrics_pct"]) and result["mismatch_metrics_s_median"] > 0


@pytest.mark.slow
def test_mismatch_engines_hf_float32_matches_the_trainer(run_main):
    args = ["--engines", "hf,hf_bf16", "--prompts", "2", "--generations", "2", "--tokens", "4"]
    rows = [json.loads(line) for line in run_main("mismatch_engines", *args).splitlines() if line.startswith("{")]
    assert len(rows) == 2 * 3  # per engine: top-p 1.0, and 0.9 with and without the replayed filter
    assert all(finite(r["k3"], r["abs_logp_diff_mean"], r["is_weight_mean"]) for r in rows)
    same = next(r for r in rows if r["engine"] == "hf" and r["top_p"] == 1.0)
    assert same["abs_logp_diff_mean"] < 1e-3 and same["tokens"] > 0  # float32 engine, float32 trainer


def test_reward_sources_cost_prices_the_judge_client(run_main):
    result = json.loads(run_main("reward_sources_cost", "--sources", "judge"))
    seconds = result["seconds_per_completion"]
    assert set(seconds) == {"judge_client_uncached_loopback", "judge_client_cached"}
    assert 0 < seconds["judge_client_cached"] <= seconds["judge_client_uncached_loopback"]


@pytest.mark.slow
def test_pipeline_throughput_runs_sync_and_pipeline_and_accounts_for_the_pipeline(run_main, tmp_path):
    out = tmp_path / "pipeline.json"
    args = ["--steps", "2", "--rounds", "1", "--prompts", "2", "--generations", "2", "--max-new-tokens", "4"]
    args += ["--modes", "sync", "pipeline", "--max-lags", "1"]  # async would add a third run to the smoke tier
    run_main("pipeline_throughput", *args, "--output-dir", str(tmp_path), "--out", str(out))
    median = json.loads(out.read_text())["median"]
    assert set(median) == {"sync", "pipeline1"}
    for r in median.values():
        assert r["completions_per_s"] > 0 and 0.0 <= r["trainer_wait_fraction"] <= 1.0
        assert r["trainer_wait_s"] + r["trainer_busy_s"] == pytest.approx(r["wall_s"])
    pipeline = median["pipeline1"]
    engine = pipeline["engine_busy_s"] + pipeline["engine_idle_s"] + pipeline["engine_sync_s"]
    assert engine == pytest.approx(pipeline["cycle_s"], rel=0.05) and pipeline["cycle_s"] <= pipeline["wall_s"]


class FakeRun:
    """A CLI run stand-in for pipeline_learning.run_all: its metrics.csv is all there at once; it runs until
    it is sent SIGTERM, or ends at once when its rewards never cross (its budget spent)."""

    def __init__(self, rewards: list[float], output_dir: Path, window: int, threshold: float):
        folder = output_dir / "csv" / "version_0"
        folder.mkdir(parents=True)
        names = ["step", "reward/arithmetic_exact/mean", "reward/arithmetic_close/mean", "train/step_time"]
        rows = [",".join(names)] + [f"{i},{r},{r},0.5" for i, r in enumerate(rewards)]
        (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
        means = [sum(rewards[i - window + 1 : i + 1]) / window for i in range(window - 1, len(rewards))]
        self.returncode = None if max(means) >= threshold else 0
        self.signals = []

    def poll(self):
        return self.returncode

    def send_signal(self, signum):
        self.signals.append(signum)
        self.returncode = 143


def test_pipeline_learning_commands_compose_and_runs_stop_at_their_crossing(monkeypatch, tmp_path):
    """The variants' overrides make a valid config (the pipeline's lag within its bound), and run_all stops
    a run once the mean of its last rewards crosses 0.5, lets one that never does end, and reads both."""
    learning = importlib.import_module("pipeline_learning")
    warm = str(tmp_path / "warm")
    tokenizer = build_char_tokenizer()
    build_tiny_policy(tokenizer).save_pretrained(warm)
    tokenizer.save_pretrained(warm)
    # One composition (each is seconds): lag4_tis sets every key the other variants set.
    cfg = compose([f"model.name_or_path={warm}", *learning.VARIANTS["lag4_tis"], "trainer.output_dir=o"])[0]
    validate_config(cfg)
    assert cfg.rollout.mode == "pipeline" and cfg.rollout.pipeline.max_lag == cfg.rollout.max_off_policy_steps == 4
    assert cfg.algorithm.corrections == ["tis_token"] and cfg.model.name_or_path == warm
    keys = {o.split("=")[0] for overrides in learning.VARIANTS.values() for o in overrides}
    assert keys == {o.split("=")[0] for o in learning.VARIANTS["lag4_tis"]}
    curves = {"sync": [0.4, 0.45, 0.5, 0.6, 0.7], "lag1": [0.4, 0.45, 0.5, 0.45, 0.5]}  # window 2: 4th step; never
    runs = {}

    def start(overrides, output_dir):
        runs[output_dir.name] = FakeRun(curves[output_dir.name.split("_")[0]], output_dir, 2, learning.THRESHOLD)
        return runs[output_dir.name], 0.0

    monkeypatch.setattr(learning, "start", start)
    monkeypatch.setattr(learning, "POLL_SECONDS", 0.0)
    results = learning.run_all(tmp_path, [("sync", 0), ("lag1", 0)], warm, 5, 2, 2)
    assert [r["steps_to_threshold"] for r in results] == [4, None]
    assert runs["sync_seed0"].signals == [signal.SIGTERM] and runs["lag1_seed0"].signals == []
    assert [r["stopped_at_crossing"] for r in results] == [True, False]
    assert results[0]["train_seconds_to_threshold"] == 2.0
    table = learning.table([*results, {**results[0], "seed": 1, "steps_to_threshold": 6}])
    assert table["sync"]["median_steps"] == 5 and table["lag1"]["median_steps"] is None


def test_vision_shapes_learning_reads_a_finished_run_per_question_type(run_main, tmp_path):
    """Its command composes (task=shapes' defaults for the tiny VLM); a finished seed's folder is read, not
    trained again: held-out accuracy per type at each evaluation, training accuracy per type per window."""
    learning = importlib.import_module("vision_shapes_learning")
    cfg = compose([*learning.overrides(3, 50, ["trainer.max_steps=7"]), "trainer.output_dir=o"])[0]
    validate_config(cfg)
    assert cfg.task.name == "shapes" and cfg.trainer.seed == 3 and cfg.eval.every_n_steps == 50
    folder = tmp_path / "work" / "seed_3"
    (folder / "hf" / "final").mkdir(parents=True)
    (folder / "hf" / "final" / "config.json").write_text("{}")
    (folder / "csv" / "version_0").mkdir(parents=True)
    names = ["step", "reward/shapes_exact/mean", "reward/shapes_color", "reward/shapes_side", "train/step_time"]
    names += ["val/accuracy", "val/color/accuracy", "val/side/accuracy"]
    rows = [",".join(names), "0,,,,,0.1,0.2,0.0"] + [f"{i},{i / 4},{i / 4},0.5,1.0,,," for i in range(1, 5)]
    rows.append("4,,,,,0.6,1.0,0.25")
    (folder / "csv" / "version_0" / "metrics.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "shapes.json"
    printed = run_main(
        "vision_shapes_learning", "--work", str(tmp_path / "work"), "--seeds", "3", "--window", "2", "--out", str(out)
    )
    assert "| 3 | 4 | 1.00 |  |  | 0.25 | 0.60 |" in printed, printed
    seed = json.loads(out.read_text())["seeds"]["3"]
    assert seed["held_out"] == [
        {"step": 0, "all": 0.1, "color": 0.2, "side": 0.0},
        {"step": 4, "all": 0.6, "color": 1.0, "side": 0.25},
    ]
    assert [w["steps"] for w in seed["training"]] == ["1-2", "3-4"]
    assert seed["training"][1]["color"] == pytest.approx(0.875) and seed["training"][0]["side"] == 0.5
    assert seed["steps"] == 4 and seed["train_seconds"] == 4.0 and seed["wall_seconds"] is None


def test_pipeline_simulator_drives_the_real_loop_over_its_grid(run_main, tmp_path):
    out = tmp_path / "simulator.json"
    args = ["--engines", "1", "2", "--ranks", "1", "--lags", "0", "1", "--steps", "2", "--prompts", "2"]
    args += ["--generations", "2", "--rows", "4", "--step-ms", "0.5", "--max-tokens", "8", "--train-ms-per-sample", "1"]
    run_main("pipeline_simulator", *args, "--out", str(out))
    grid = json.loads(out.read_text())["grid"]
    assert [(r["engines"], r["lag"]) for r in grid] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in grid:
        assert r["samples_per_s"] > 0 and 0.0 <= r["engine_busy_fraction"] <= 1.0
        assert 0.0 <= r["trainer_busy_fraction"] <= 1.0 and (r["lag"] or r["vs_lag0"] == 1.0)


def test_rollout_throughput_hf_decoders_without_vllm(run_main, tmp_path):
    out = tmp_path / "rollout.json"
    args = ["--no-vllm", "--no-train", "--prompts", "2", "--samples", "2", "--tokens", "4", "--repeats", "1"]
    run_main("rollout_throughput", *args, "--out", str(out))
    results = json.loads(out.read_text())
    for decoder in ("fused", "loop", "generate"):
        assert results[f"hf_{decoder}_tokens_per_s"] > 0 and finite(results[f"hf_{decoder}_batch_seconds"])
    assert not any(key.startswith("vllm") for key in results)


@pytest.mark.slow
def test_step_floor_writes_the_floor_where_asked(run_main, tmp_path):
    out = tmp_path / "floor.json"
    run_main("step_floor", "--setting", "tiny", "--repeats", "1", "--results", "absent.json", "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["floor_ms"]) == {"decode", "reference", "train", "optimizer"}
    assert all(v > 0 for v in result["floor_ms"].values())
    assert result["floor_total_ms"] == pytest.approx(sum(result["floor_ms"].values()))


@pytest.mark.slow
def test_step_profile_child_splits_our_step(run_main, tiny_model_dir, monkeypatch):
    step_profile = importlib.import_module("step_profile")
    wrapped = ["nonfinite_update_count", "measure_mismatch", "mismatch_metrics", "step_metrics", "log_callback_metrics"]
    keep_attributes(monkeypatch, module_file, wrapped)
    keep_attributes(monkeypatch, hooks_file, ["write_metrics"])
    keep_attributes(monkeypatch, step_profile, ["CLOCK"])
    monkeypatch.setitem(step_profile.SETTINGS, "tiny", dict(step_profile.SETTINGS["tiny"]))
    steps = result_line(run_main("step_profile", "--child", "ours", "--model-dir", tiny_model_dir, "--steps", "3"))
    assert len(steps) == 3
    for step in steps:
        assert set(step["parts"]) == set(step_profile.PARTS)
        assert sum(step["parts"].values()) == pytest.approx(step["seconds"])
        assert step["parts"]["policy fwd/bwd"] > 0 and step["parts"]["generation"] > 0
    assert "| policy fwd/bwd |" in step_profile.table({"ours": [steps]}, warmup=1)


@pytest.mark.slow
def test_time_to_accuracy_child_records_our_steps(run_main, tiny_model_dir, monkeypatch):
    tta = importlib.import_module("time_to_accuracy")
    monkeypatch.setattr(tta, "SETTINGS", copy.deepcopy(tta.SETTINGS))  # main() writes its options in
    args = ["--child", "ours", "--setting", "tiny", "--model-dir", tiny_model_dir, "--budget-steps", "3"]
    result = result_line(run_main("time_to_accuracy", *args, "--window", "2"))
    assert len(result["steps"]) <= 3 and all(0 <= s["reward"] <= 1 for s in result["steps"])
    summary = tta.summarize_run(result)
    assert summary["steps_run"] == len(result["steps"]) and finite(summary["seconds_run"])


@pytest.mark.slow
def test_trl_vs_ours_child_reports_padding_and_flops(run_main, tiny_model_dir, monkeypatch):
    trl_vs_ours = importlib.import_module("trl_vs_ours")
    monkeypatch.setitem(trl_vs_ours.SETTINGS, "tiny", dict(trl_vs_ours.SETTINGS["tiny"]))  # --steps writes it
    args = ["--child", "ours", "--setting", "tiny", "--model-dir", tiny_model_dir, "--tables", "identical"]
    result = result_line(run_main("trl_vs_ours", *args, "--steps", "3"))
    assert len(result["steps"]) == 3
    summary = trl_vs_ours.summarize([result], warmup=1)
    assert 0 <= summary["padding_share_packed"] < summary["padding_share_padded"] < 1
    assert summary["train_gflops"] > 0 and finite(summary["median_step_s"], summary["tokens_per_s"])


@pytest.mark.slow
def test_vision_trl_child_times_our_vlm_steps(run_main, monkeypatch):
    """Our side of the VLM side-by-side (TRL's needs its venv): 3 steps on the tiny LLaVA folder."""
    vision_trl = importlib.import_module("vision_trl")
    folder = vision_trl.save_model("llava")
    result = result_line(run_main("vision_trl", "--child", "ours", "--model-dir", folder, "--steps", "3"))
    assert len(result["steps"]) == 3 and result["peak_rss_mb"] > 0
    summary = vision_trl.summarize([result], warmup=1)
    assert finite(summary["median_step_s"]) and 0 < summary["generation_share"] < 1 and summary["tokens_per_s"] > 0
    assert all(step["cpu_seconds"] > 0 for step in result["steps"])  # the clock a loaded machine leaves comparable
