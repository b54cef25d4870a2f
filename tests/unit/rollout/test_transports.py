"""Weight-sync transports: ``memory`` hands the tensors over, ``folder`` writes a safetensors file
the engine reloads from; each is a registered class with ``push(weights, engine)``, and a user's
transport registers the same way."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout import TRANSPORTS
from grpo_lightning.rollout.transport import WeightTransport


class RecordingEngine:
    """What a transport may use of an engine: reload_weights and sync_folder."""

    def __init__(self, folder):
        self.folder, self.reloads = str(folder), []

    def reload_weights(self, **source):
        self.reloads.append(source)

    def sync_folder(self) -> str:
        return self.folder


def weights(version: int = 3) -> PolicyWeights:
    generator = torch.Generator().manual_seed(version)
    embed = torch.randn(5, 4, generator=generator)
    return PolicyWeights([("embed.weight", embed), ("lm_head.weight", embed), ("norm.weight", torch.ones(4))], version)


def test_the_built_in_transports_are_registered_and_satisfy_the_protocol():
    assert {"memory", "folder"} <= set(TRANSPORTS)
    for name in ("memory", "folder"):
        assert isinstance(TRANSPORTS[name](), WeightTransport)
    assert "did you mean 'folder'" in TRANSPORTS.problem("fodler")


def test_memory_hands_over_the_tensors_themselves(tmp_path):
    engine, pushed = RecordingEngine(tmp_path), weights()
    TRANSPORTS["memory"]().push(pushed, engine)
    (source,) = engine.reloads
    assert list(source) == ["weights_iterator"]
    assert [name for name, _ in source["weights_iterator"]] == ["embed.weight", "lm_head.weight", "norm.weight"]
    assert all(got is want for (_, got), (_, want) in zip(source["weights_iterator"], pushed.tensors, strict=True))


def test_folder_writes_every_tensor_where_the_engine_reads_and_points_it_there(tmp_path):
    engine, pushed = RecordingEngine(tmp_path / "sync"), weights()
    TRANSPORTS["folder"]().push(pushed, engine)
    assert engine.reloads == [{"weights_path": str(tmp_path / "sync")}]
    saved = load_file(str(tmp_path / "sync" / "model.safetensors"))
    assert set(saved) == {"embed.weight", "lm_head.weight", "norm.weight"}  # tied tensors saved as copies
    for name, tensor in pushed.tensors:
        assert torch.equal(saved[name], tensor)


def test_a_transport_from_outside_the_package_registers_as_one_class(tmp_path):
    class Counting:
        pushes = 0

        def push(self, weights, engine):
            Counting.pushes += 1
            engine.reload_weights(weights_iterator=list(weights.tensors))

    TRANSPORTS.add("counting_test_transport", Counting)
    engine = RecordingEngine(tmp_path)
    TRANSPORTS["counting_test_transport"]().push(weights(), engine)
    assert Counting.pushes == 1 and len(engine.reloads) == 1
