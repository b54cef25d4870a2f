"""``trainer.strategy``: Lightning's own strategies, and FSDP2 sharding of the policy and reference.

* ``auto`` / ``ddp``: Lightning's strings, a full replica per device.
* ``fsdp``: Lightning's ``ModelParallelStrategy`` (FSDP2, ``torch.distributed.fsdp.fully_shard``)
  with a data-parallel mesh over every device of every node. The module's ``configure_model``
  hook calls :func:`shard_module`: each decoder layer (the architecture's ``_no_split_modules``,
  e.g. ``LlamaDecoderLayer``) is one FSDP unit and the rest of the model (embeddings, final
  norm, output head, tied or not) the root unit, for the policy and the deep-copied reference
  alike, so weights, gradients and AdamW state are sharded over the ranks and the reference
  is sharded too (a LoRA policy's reference is the policy itself: nothing more to shard).

Why not Lightning's ``FSDPStrategy`` (FSDP1): it wraps the whole LightningModule and runs
``training_step`` inside the root unit's forward, and FSDP1 cannot run a backward inside that
forward ("Expects BACKWARD_PRE or BACKWARD_POST state but got HandleTrainingState.FORWARD"),
which is what manual optimization does on every micro-batch (Lightning issues #19626, #19685).
It also refuses CPU devices. FSDP2 hooks each unit separately, so backward anywhere works, on
CPU with gloo as on GPUs with NCCL.
"""

from __future__ import annotations

import copy

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

DATA_PARALLEL = "data_parallel"


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """``model``'s decoder layers: the modules of the classes its architecture names in
    ``_no_split_modules`` (FSDP shards them one by one, ``model.compile`` compiles them);
    empty if it names none."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    classes = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
    return [m for m in model.modules() if isinstance(m, classes)]


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 manages ``model`` (its forward all-gathers the weights on every rank)."""
    return isinstance(_root(model), FSDPModule)


def _root(model: nn.Module) -> nn.Module:
    """The model whose forward every call goes through: a peft model's base (``generate`` and
    ``forward`` of a ``PeftModel`` both end in it; the peft wrappers own no weights)."""
    return model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model


def shard_model(model: nn.Module, mesh) -> None:
    """FSDP2 units: every decoder layer, then the model itself as the root (the rest)."""
    model = _root(model)
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"trainer.strategy=fsdp: {type(model).__name__} declares no decoder layer class "
            f"(_no_split_modules); FSDP needs one to shard the model layer by layer"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def shard_module(module, mesh) -> None:
    """Shard a GRPOModule's policy and (a model of its own) reference over ``mesh``."""
    if is_sharded(module.policy):
        return
    if isinstance(module.reference, nn.Module) and _shares_parameters(module.reference, module.policy):
        # Each FSDP root shards its own parameters: a reference sharing the policy's frozen ones (a VLM's
        # vision tower) gets a copy of its own first.
        module.reference = copy.deepcopy(module.reference)
    shard_model(module.policy, mesh)
    if isinstance(module.reference, nn.Module):
        shard_model(module.reference, mesh)


def _shares_parameters(a: nn.Module, b: nn.Module) -> bool:
    mine = {id(p) for p in a.parameters()}
    return any(id(p) in mine for p in b.parameters())


def build_strategy(strategy: str, devices: int, num_nodes: int):
    """The ``strategy`` argument of ``lightning.Trainer`` for ``trainer.strategy``."""
    if strategy != "fsdp":
        return strategy
    from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: PLC0415  (lightning: after trainer.huge_pages)

    return ModelParallelStrategy(data_parallel_size=devices * num_nodes, tensor_parallel_size=1)


def through_root(model: nn.Module, fn, *args):
    """``fn(*args)`` run as the forward of ``model``'s root module: under FSDP2 the root unit's parameters
    (embeddings, output head, a VLM's projector) are gathered only inside the root's forward, and its
    gradients reduced only for tensors that forward returned. A VLM's passes call its parts directly
    (the tower, the embeddings, the text decoder); routed through here they get the root's hooks too.
    ``fn`` must return tensors (or tuples of them); without FSDP it is simply called."""
    root = _root(model)
    if not is_sharded(root):
        return fn(*args)
    own = root.__dict__.get("forward")
    root.forward = fn
    try:
        return root(*args)
    finally:
        if own is None:
            del root.forward
        else:
            root.forward = own
