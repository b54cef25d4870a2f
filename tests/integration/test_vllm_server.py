"""The vLLM server engine: per-sample seeds across ranks, weight sync with versions and a
verified probe, async determinism, and a dead server that becomes a clear error, never a hang."""

from __future__ import annotations

import json
import os
import signal
import socketserver
import threading
import time
from pathlib import Path

import httpx
import lightning as L
import pytest
import torch
from conftest import SERVER_KEY_ENV, free_port, make_config
from safetensors.torch import load_file

from grpo_lightning.build import build_run
from grpo_lightning.config import AlgorithmConfig, ConfigError, RolloutConfig, validate_config
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, Sampling, WeightSync, WeightSyncError, group_seeds
from grpo_lightning.rollout.transports.folder import save_weights_folder
from grpo_lightning.rollout.vllm_server import ServerClient, VLLMServerError
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores


def perturbed_policy(tokenizer, seed: int = 7):
    policy = build_tiny_policy(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return policy


def requests(tokenizer, rank: int, step: int = 3) -> list[GenerationRequest]:
    prompts = [tokenizer(p)["input_ids"] for p in ("1+2=", "7+7=")]
    seeds = group_seeds(0, rank, step, len(prompts), 8)
    return [GenerationRequest(prompts[i // 8], s) for i, s in enumerate(seeds)]


def test_samples_follow_their_seeds_across_ranks(vllm_server):
    """F1/F2: one request per sample with its own seed: repeatable, distinct within a group and
    between the ranks' shares of the same prompts."""
    tok = build_char_tokenizer()
    vllm_server.load_weights(build_tiny_policy(tok).state_dict().items(), version=0)
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=10, temperature=1.0))
    rank0 = vllm_server.generate(requests(tok, 0), sampling)
    again = vllm_server.generate(requests(tok, 0), sampling)
    rank1 = vllm_server.generate(requests(tok, 1), sampling)
    assert [c.token_ids for c in rank0] == [c.token_ids for c in again]
    assert [c.logprobs for c in rank0] == [c.logprobs for c in again]
    ids0, ids1 = {tuple(c.token_ids) for c in rank0}, {tuple(c.token_ids) for c in rank1}
    assert len(ids0) >= 14 and len(ids0 & ids1) <= 2  # 16 samples each, near-uniform tiny policy
    assert all(c.weight_version == 0 and len(c.logprobs) == len(c.token_ids) for c in rank0)


def test_weight_sync_sets_the_version_and_passes_the_probe(vllm_server):
    tok = build_char_tokenizer()
    trained = perturbed_policy(tok)
    module = GRPOModule(trained, AlgorithmConfig(beta=0.0))
    vllm_server.load_weights(build_tiny_policy(tok).state_dict().items(), version=1)
    sync = WeightSync(verify=True, tolerance=1e-4)
    with pytest.raises(WeightSyncError, match="differ from the policy"):
        sync.check(vllm_server, probe_scores(module, tokenizer=tok))
    metrics = sync.sync(policy_weights(module.policy, 5), vllm_server, probe_scores(module, tokenizer=tok))
    assert metrics["rollout/sync_probe_diff"] <= 1e-4
    assert vllm_server.weight_version == 5
    assert vllm_server.client.call("GET", "/weight_info", "test")["weight_version"] == "5"
    completions = vllm_server.generate(requests(tok, 0), Sampling.from_config(RolloutConfig(max_new_tokens=6)))
    assert {c.weight_version for c in completions} == {5}


def live_processes_in_group(pgid: int) -> list[int]:
    """Pids of the process group that are still running (zombies waiting for a reaper aside)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def processes_left_after(pgid: int, seconds: float = 10.0) -> list[int]:
    """The group's live pids once they are gone or ``seconds`` have passed: a SIGKILLed process
    with gigabytes to free can take a moment to leave /proc on a loaded machine."""
    deadline = time.perf_counter() + seconds
    while (alive := live_processes_in_group(pgid)) and time.perf_counter() < deadline:
        time.sleep(0.2)
    return alive


def server_config(url: str, steps: int, mode: str = "sync"):
    return make_config(
        steps,
        **{
            "rollout.engine": "vllm",
            "rollout.vllm.server.url": url,
            "rollout.vllm.server.api_key_env": SERVER_KEY_ENV,
            "rollout.mode": mode,
            "rollout.prompts_per_step": 4,
            "rollout.num_generations": 8,
            "rollout.max_new_tokens": 8,
            "algorithm.micro_batch_size": 32,
            "algorithm.is_level": "token" if mode == "async" else "none",
            "rollout.vllm.verify_sync": True,
            "rollout.vllm.verify_tolerance": 1e-4,
            "health.enabled": False,
        },
    )


def completions_of(cfg) -> list[list[tuple[int, ...]]]:
    run = build_run(cfg)
    seen = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            rollout = module.last_step.rollout
            seen.append(
                [
                    tuple(r[m.bool()].tolist())
                    for r, m in zip(rollout.completion_ids, rollout.completion_mask, strict=True)
                ]
            )
            assert (
                rollout.weight_version
                == trainer.global_step - 1 - (cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0)
                or batch_idx < 1
            )

    run.trainer(cfg, callbacks=[*run.callbacks, Record()], enable_progress_bar=False, limit_val_batches=0).fit(
        run.module, datamodule=run.datamodule
    )
    return seen


def test_async_runs_with_the_same_seed_and_staleness_are_identical(vllm_server, monkeypatch):
    monkeypatch.setenv(SERVER_KEY_ENV, vllm_server.server.token)
    first = completions_of(server_config(vllm_server.client.url, 4, "async"))
    second = completions_of(server_config(vllm_server.client.url, 4, "async"))
    assert len(first) == 4 and first == second
    assert first[0] != first[1]


def test_pipeline_mode_keeps_requests_through_each_weight_sync(vllm_server, monkeypatch):
    """rollout.mode=pipeline on the session's server: groups generated ahead are trained later (lag > 0);
    every trained token is the one the server returned, with the log-prob it was sampled with and the
    version vLLM labelled its step with (a sequence kept through a sync carries both versions); the
    lag logged is exactly the trainer's step minus the oldest version a trained token carries."""
    from grpo_lightning.rollout.pipeline import vllm_engine  # noqa: PLC0415

    monkeypatch.setenv(SERVER_KEY_ENV, vllm_server.server.token)
    returned: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    parse = vllm_engine.parse_choice

    def recorded(choice):
        completion = parse(choice)
        returned.setdefault(tuple(completion.token_ids), []).append(
            (completion.token_weight_versions, completion.logprobs)
        )
        return completion

    monkeypatch.setattr(vllm_engine, "parse_choice", recorded)
    cfg = server_config(vllm_server.client.url, 3, "pipeline")
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations, cfg.algorithm.micro_batch_size = 2, 4, 8
    cfg.rollout.max_new_tokens, cfg.rollout.pipeline.max_lag = 48, 2
    run = build_run(cfg)
    steps = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            steps.append((trainer.global_step - 1, module.last_step.rollout))

    run.trainer(cfg, callbacks=[*run.callbacks, Record()], enable_progress_bar=False, limit_val_batches=0).fit(
        run.module, datamodule=run.datamodule
    )
    run.module.rollout.shutdown()
    spans, lag_max = [], 0.0
    for now, rollout in steps:
        lags = []
        for ids, mask, logp, versions in zip(
            rollout.completion_ids,
            rollout.completion_mask.bool(),
            rollout.engine_logprobs,
            rollout.token_weight_versions,
            strict=True,
        ):
            ids, versions, logp = tuple(ids[mask].tolist()), versions[mask].tolist(), logp[mask].tolist()
            assert (versions, pytest.approx(logp)) in returned[ids]  # what the server sampled, as it said
            assert versions == sorted(versions) and 0 <= versions[0] and versions[-1] <= now
            spans.append(len(set(versions)))
            lags.append(now - versions[0])
        assert rollout.timing["pipeline/lag_max"] == max(lags)
        lag_max = max(lag_max, max(lags))
    assert len(steps) == 3 and lag_max > 0  # groups generated ahead were trained later
    assert rollout.timing["pipeline/versions_per_sequence"] >= 1
    print(f"lag_max {lag_max}, sequences spanning > 1 version: {sum(s > 1 for s in spans)} of {len(spans)}")


def test_the_throughput_benchmark_runs_pipeline_mode_on_a_server(vllm_server, monkeypatch, capsys, tmp_path):
    """benchmarks/pipeline_throughput.py --engine vllm (its smoke: the session's server, one step), with
    the engine's seconds adding up to the cycle's."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    monkeypatch.setenv("GRPO_BENCH_SERVER_KEY", vllm_server.server.token)
    out = tmp_path / "pipeline.json"
    args = ["--engine", "vllm", "--server-url", vllm_server.client.url, "--steps", "2", "--rounds", "1"]
    args += ["--prompts", "2", "--generations", "2", "--max-new-tokens", "4", "--modes", "pipeline", "--max-lags", "1"]
    monkeypatch.setattr("sys.argv", ["pipeline_throughput.py", *args, "--output-dir", str(tmp_path), "--out", str(out)])
    import pipeline_throughput  # noqa: PLC0415  (benchmarks/)

    pipeline_throughput.main()
    result = json.loads(out.read_text())
    pipeline = result["median"]["pipeline1"]
    assert result["engine"] == "vllm" and pipeline["completions_per_s"] > 0
    engine = pipeline["engine_busy_s"] + pipeline["engine_idle_s"] + pipeline["engine_sync_s"]
    assert engine == pytest.approx(pipeline["cycle_s"], rel=0.05) and pipeline["engine_sync_s"] > 0


def test_several_devices_need_a_server():
    cfg = make_config(2, **{"rollout.engine": "vllm", "trainer.devices": 2})
    with pytest.raises(
        ConfigError,
        match=r"rollout.engine=vllm with trainer.devices=2 needs one vLLM server shared by the ranks: set rollout.vllm.server.launch=true",
    ):
        validate_config(cfg)
    cfg.rollout.vllm.server.launch = True
    cfg.rollout.mode, cfg.algorithm.is_level = "async", "token"
    validate_config(cfg)  # async on several ranks is fine with a server
    cfg.rollout.vllm.server.url = "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match="exclude each other"):
        validate_config(cfg)


def test_a_killed_server_is_a_clear_error_within_the_timeout_and_leaves_nothing_behind(tmp_path):
    """Launched through the config; killed (SIGKILL) after step 2: the next call fails with the
    server's address and the step, well within timeout_s, and the run leaves no process or folder."""
    timeout = 20.0
    cfg = make_config(
        50,
        **{
            "rollout.engine": "vllm",
            "rollout.vllm.server.launch": True,
            "rollout.vllm.server.port": free_port(),
            "rollout.vllm.server.timeout_s": timeout,
            "rollout.vllm.max_model_len": 128,
            "rollout.vllm.kv_cache_gib": 0.5,
            "rollout.prompts_per_step": 4,
            "rollout.num_generations": 4,
            "algorithm.micro_batch_size": 16,
            "health.enabled": False,
        },
    )
    run = build_run(cfg)
    killed = {}

    class KillServer(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                server = module.rollout.engine.server
                killed["pid"], killed["dir"] = server.process.pid, Path(server._model_dir.name)
                killed["temp"] = sorted(p.name for p in (killed["dir"] / "tmp").iterdir())  # vLLM's sockets
                os.killpg(server.process.pid, signal.SIGKILL)
                killed["at"] = time.perf_counter()

    trainer = run.trainer(cfg, callbacks=[*run.callbacks, KillServer()], enable_progress_bar=False, limit_val_batches=0)
    with pytest.raises(VLLMServerError) as err:
        trainer.fit(run.module, datamodule=run.datamodule)
    seconds = time.perf_counter() - killed["at"]
    message = str(err.value)
    assert f"http://127.0.0.1:{cfg.rollout.vllm.server.port}" in message and "rollout step 2 on rank 0" in message
    assert seconds < timeout, seconds
    assert processes_left_after(killed["pid"]) == []  # the server and its engine core are gone
    assert killed["temp"] and not killed["dir"].exists()  # with the IPC sockets a kill leaves behind
    assert run.module.rollout.engine is None  # shut down on the exception
    print(f"server killed -> error after {seconds:.2f} s: {message}")


def test_a_connection_the_server_dropped_unanswered_is_retried_once():
    """Regression: uvicorn closes idle keep-alive connections after 5 s; a request sent on such a
    pooled connection failed with 'Server disconnected without sending a response' when a
    training step took about that long. A stub server drops the first request unanswered: the
    client sends it once more and gets the answer; a server that keeps dropping is an error."""

    class Stub(socketserver.BaseRequestHandler):
        dropped = 0
        drop_all = False

        def handle(self):
            data = self.request.recv(65536)
            if Stub.drop_all or Stub.dropped == 0:
                Stub.dropped += 1
                return  # the connection closes without a response
            body = json.dumps({"weight_version": "7", "echo": len(data)}).encode()
            self.request.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Stub) as stub:
        threading.Thread(target=stub.serve_forever, daemon=True).start()
        client = ServerClient(f"http://127.0.0.1:{stub.server_address[1]}", timeout_s=5, concurrency=1)
        assert client.call("GET", "/weight_info", "GET /weight_info")["weight_version"] == "7"
        assert Stub.dropped == 1
        Stub.drop_all = True
        with pytest.raises(VLLMServerError, match="failed GET /weight_info: RemoteProtocolError"):
            client.call("GET", "/weight_info", "GET /weight_info")
        client.close()
        stub.shutdown()


def test_tied_weights_are_written_for_a_reload(tmp_path):
    """Regression: SmolLM2 ties lm_head to embed_tokens and safetensors refused the shared
    tensors, so the first sync into a server failed."""
    embed = torch.randn(5, 3)
    folder = save_weights_folder([("model.embed_tokens.weight", embed), ("lm_head.weight", embed)], str(tmp_path))
    loaded = load_file(f"{folder}/model.safetensors")
    assert torch.equal(loaded["lm_head.weight"], embed) and torch.equal(loaded["model.embed_tokens.weight"], embed)


def test_every_route_of_the_launched_server_needs_the_run_token(vllm_server):
    """Security: vLLM's --api-key guards /v1 only; our middleware guards every route. Each route
    the app lists (its OpenAPI schema) and the ones it does not (metrics, docs, our identity
    route, an unknown path) answer 401 without the token or with a wrong one, whatever the
    method; with the token they work. The token is never on the command line or in the log."""
    token, url = vllm_server.server.token, vllm_server.client.url
    ours = {"Authorization": f"Bearer {token}"}
    spec = httpx.get(f"{url}/openapi.json", headers=ours, timeout=30).json()
    routes = [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]
    for must in ("/health", "/version", "/v1/models", "/v1/completions", "/collective_rpc", "/update_weight_version"):
        assert must in spec["paths"], must
    extra = ["/metrics", "/docs", "/openapi.json", "/grpo/identity", "/no-such-route"]
    routes += [(method, path) for path in extra for method in ("GET", "POST")]
    routes += [("OPTIONS", "/v1/completions"), ("OPTIONS", "/collective_rpc")]
    assert len(routes) > 30
    for method, path in routes:
        concrete = path.replace("{", "").replace("}", "")
        for headers in (None, {"Authorization": "Bearer not-the-token"}, {"Authorization": token}):
            answer = httpx.request(method, f"{url}{concrete}", headers=headers, json={}, timeout=30)
            assert answer.status_code == 401, (method, path, headers is None, answer.status_code)
    for path in ("/health", "/version", "/v1/models", "/weight_info", "/metrics"):
        assert httpx.get(f"{url}{path}", headers=ours, timeout=30).status_code == 200, path
    # /v1/completions, then /collective_rpc, /reset_prefix_cache and /update_weight_version, with the token
    tok = build_char_tokenizer()
    assert vllm_server.generate(requests(tok, 0)[:2], Sampling.from_config(RolloutConfig(max_new_tokens=2)))[
        0
    ].token_ids
    vllm_server.load_weights(build_tiny_policy(tok).state_dict().items(), version=3)
    assert vllm_server.client.call("GET", "/weight_info", "test")["weight_version"] == "3"
    assert token not in Path(f"/proc/{vllm_server.server.process.pid}/cmdline").read_text()  # argv
    assert token not in vllm_server.server.log_path.read_text()
