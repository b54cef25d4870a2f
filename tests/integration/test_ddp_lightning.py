"""Lightning DDP on CPU with gloo, 2 real processes: the run works end to end with distinct
prompts and seeds per rank, and the F2 fault (ranks sampling the same prompts with the same
seeds) is diagnosed by the cross-rank duplicates check while its twin is not. A non-finite
loss on one rank makes every rank skip that step together instead of hanging."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def reports(ddp_fits):
    """``reports(scenario)``: both ranks' reports of that scenario of the session's DDP launch."""
    return lambda scenario: [json.loads((ddp_fits(scenario) / f"rank_{r}.json").read_text()) for r in range(2)]


def test_ddp_gloo_runs_end_to_end_with_a_well_defined_number_of_steps(reports):
    healthy = reports("healthy")
    for rank, report in enumerate(healthy):
        assert report["rank"] == rank and report["world_size"] == 2 and report["backend"] == "gloo"
        assert report["steps"] == report["global_step"] == 4
        assert len(report["prompts"]) == 4
    assert healthy[0]["weights_checksum"] == healthy[1]["weights_checksum"]  # DDP kept the ranks in sync
    assert healthy[0]["alerts"] == healthy[1]["alerts"] == []


def test_sampling_seeds_and_prompts_differ_per_rank(reports):
    healthy = reports("healthy")
    for step in range(4):
        seeds = [set(r["seeds"][step]) for r in healthy]
        assert not seeds[0] & seeds[1], f"step {step}: ranks share seeds"
        prompts = [set(r["prompts"][step]) for r in healthy]
        assert not prompts[0] & prompts[1], f"step {step}: ranks share prompts {prompts[0] & prompts[1]}"


def test_each_ranks_pipeline_producer_trains_the_groups_sync_gives_that_rank_each_once(reports):
    """rollout.mode=pipeline on 2 ranks: over the run, each rank trains exactly the groups (prompt and
    its samples' seeds) that sync mode trains on that rank, each once, whatever order they finished in."""
    sync, pipeline = reports("healthy"), reports("pipeline")
    trained = []
    for rank in range(2):
        assert pipeline[rank]["steps"] == pipeline[rank]["global_step"] == 3
        groups = [tuple(g) for step in pipeline[rank]["groups"] for g in step]
        expected = [tuple(g) for step in sync[rank]["groups"][:3] for g in step]  # sync's first 3 steps
        assert len(expected) == 3 * 16 and len(set(expected)) == len(expected)  # the record is real
        assert sorted(groups) == sorted(expected), f"rank {rank}: the pipeline trained other groups than sync"
        trained.append(sorted(g[0] for g in groups))
    assert trained[0] != trained[1], "the ranks' producers trained the same prompts"
    assert pipeline[0]["weights_checksum"] == pipeline[1]["weights_checksum"]  # DDP kept the ranks in sync
    assert max(max(r["lag_max"]) for r in pipeline) >= 1  # the producer ran ahead: groups trained a step late


def test_f2_rank_independent_seeds_are_diagnosed(reports):
    f2_fault = reports("f2_fault")
    assert f2_fault[0]["seeds"] == f2_fault[1]["seeds"]  # the fault is really there
    for report in f2_fault:
        alerts = [a for a in report["alerts"] if a["check"] == "duplicates"]
        assert alerts, f"rank {report['rank']}: no duplicates alert; alerts: {[a['check'] for a in report['alerts']]}"
        alert = alerts[0]
        assert alert["failure"] == "F2" and alert["step"] == 1  # patience 2: steps 0 and 1
        assert alert["values"]["dup_obs"] == alert["values"]["dup_possible"] == 256
        assert "identical twin" in alert["text"] and "derive every sampling seed from the rank" in alert["text"]


def test_f2_twin_with_rank_seeds_has_no_duplicates_alert(reports):
    f2_twin = reports("f2_twin")
    assert f2_twin[0]["prompts"] == f2_twin[1]["prompts"]  # the check had shared prompts to compare
    for report in f2_twin:
        assert [a for a in report["alerts"] if a["check"] == "duplicates"] == []
        assert report["metrics"]["health/duplicates/shared_prompt_frac"] == 1.0
        assert report["metrics"]["health/duplicates/cross_rank_frac"] < 0.2


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank_without_hanging(reports):
    """Regression: the rank with the non-finite loss skipped its backward, so the other rank
    waited in DDP's gradient all-reduce forever."""
    nan_one_rank = reports("nan_one_rank")
    for report in nan_one_rank:
        assert report["steps"] == 4  # every generation batch was trained on ...
        assert report["skipped_steps_total"] == 1 and report["global_step"] == 3  # ... and one step skipped
        assert "nonfinite" in [a["check"] for a in report["alerts"]]
    assert nan_one_rank[0]["weights_checksum"] == nan_one_rank[1]["weights_checksum"]


def test_fsdp_shards_the_policy_and_ends_with_the_weights_of_ddp(reports):
    """trainer.strategy=fsdp (FSDP2, Lightning's ModelParallelStrategy, on CPU with gloo): each rank
    holds half of every weight, and the same prompts and seeds give the weights DDP gives."""
    healthy = reports("healthy")
    fsdp = reports("fsdp")
    for rank, report in enumerate(fsdp):
        assert report["strategy"] == "ModelParallelStrategy" and report["backend"] == "gloo"
        assert report["steps"] == report["global_step"] == 4 and report["alerts"] == []
        assert 0.45 < report["local_fraction"] < 0.55
        assert report["seeds"] == healthy[rank]["seeds"] and report["prompts"] == healthy[rank]["prompts"]
    assert fsdp[0]["weights_checksum"] == fsdp[1]["weights_checksum"]
    assert abs(fsdp[0]["weights_checksum"] - healthy[0]["weights_checksum"]) <= 1e-6 * healthy[0]["weights_abs_sum"]
    assert fsdp[0]["weights_abs_sum"] == pytest.approx(healthy[0]["weights_abs_sum"], rel=1e-6)
    # hf/final: the shards gathered on every rank, written by rank 0 under the plain class name
    export = fsdp[0]["export"]
    assert export["architectures"] == ["LlamaForCausalLM"] and export["same_names"] and export["max_abs_diff"] == 0.0
    assert not export["adapter_folder"]


def test_fsdp_trains_lora_adapters_with_the_base_as_reference(reports):
    fsdp_lora = reports("fsdp_lora")
    for report in fsdp_lora:
        assert report["steps"] == report["global_step"] == 3 and report["alerts"] == []
        assert report["metrics"]["health/no_update/update_norm"] > 0
        assert report["adapters_abs_sum"] > 0
    assert fsdp_lora[0]["weights_checksum"] == fsdp_lora[1]["weights_checksum"]
    export = fsdp_lora[0]["export"]  # merged weights (plain transformers) plus the adapter folder
    assert export["architectures"] == ["LlamaForCausalLM"] and export["same_names"] and export["max_abs_diff"] == 0.0
    assert export["adapter_folder"]


def test_a_vlm_with_a_frozen_tower_trains_under_ddp(reports):
    """The frozen tower gets no gradient on any rank: DDP neither waits for one nor moves it."""
    vision = reports("vision_ddp")
    for report in vision:
        assert report["steps"] == 3 and report["global_step"] == 3 and report["strategy"] == "DDPStrategy"
        assert report["frozen_at_start"] != 0 and report["frozen_checksum"] == report["frozen_at_start"]
        assert [a["check"] for a in report["alerts"]] == []
    assert vision[0]["weights_checksum"] == vision[1]["weights_checksum"]
    assert vision[0]["prompts"] != vision[1]["prompts"]  # each rank its own prompts (and images)


def test_a_vlm_with_a_frozen_tower_trains_sharded_and_ends_with_the_weights_of_ddp(reports):
    """FSDP2 shards the VLM (the passes run as the root's forward, so the root unit is gathered): the same
    prompts and seeds as under DDP give the same weights; the frozen tower stays as it was."""
    sharded, replicated = reports("vision_fsdp"), reports("vision_ddp")
    for report in sharded:
        assert report["steps"] == 3 and report["strategy"] == "ModelParallelStrategy"
        assert report["local_fraction"] < 0.75, "not sharded"
        assert report["frozen_checksum"] == pytest.approx(report["frozen_at_start"], rel=1e-9)
    assert sharded[0]["prompts"] == replicated[0]["prompts"]
    assert sharded[0]["weights_checksum"] == pytest.approx(replicated[0]["weights_checksum"], rel=1e-6)
