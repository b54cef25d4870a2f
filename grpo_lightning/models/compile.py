"""``model.compile``: torch.compile each decoder layer for the training passes.

On a GPU the training phase of a model with a small hidden size is bound by memory traffic,
not by its matmuls: Hugging Face's decoder layers run their norms, rotary embeddings, SiLU,
residual adds and dtype casts as separate kernels, each reading and writing the whole
activation. Inductor fuses those into a few kernels per layer: a shorter training phase and a
lower peak for a compilation over the first steps (measured with ``benchmarks/gpu_qwen2.py``:
benchmarks/results/LOG.md, "On a GPU: a Qwen2-0.5B-shaped model on one H100").

Regional, not whole-model: every decoder layer runs the same code, so one compiled graph
(parameters passed as inputs) serves all of them, and the first step pays one layer's
compilation instead of the whole model's; the packing, the fused output head and the loss
stay eager. Shapes change every step (packed row lengths), so after the first recompilation
torch marks them dynamic and stops recompiling.

Generation stays eager (:func:`eager_generation`): decoding one token at a time against a
growing KV cache would recompile for nearly every length, and its time is in kernel
launches, not in the fused elementwise work compilation saves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from grpo_lightning.models.sharding import decoder_layers


def layers_to_compile(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model`` (:func:`grpo_lightning.models.sharding.decoder_layers`, the
    ones FSDP shards), or an error naming the fix if its architecture declares none."""
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"model.compile=true: cannot find the decoder layers of {type(model).__name__} "
            "(its architecture names no decoder layer class in _no_split_modules); set model.compile=false"
        )
    return layers


def compile_decoder_layers(model: nn.Module) -> int:
    """Compile each decoder layer of ``model`` in place (``nn.Module.compile``: parameter
    names, state dicts and exports are unchanged); returns how many."""
    layers = layers_to_compile(model)
    for layer in layers:
        layer.compile()
    model.compiled_by_grpo = True  # read by is_compiled
    return len(layers)


def is_compiled(model: object) -> bool:
    """Whether :func:`compile_decoder_layers` was applied to ``model``."""
    return getattr(model, "compiled_by_grpo", False)


@contextmanager
def eager_generation(model: nn.Module) -> Iterator[None]:
    """A context in which the compiled layers of ``model`` run their plain eager call (decoding).

    ``nn.Module.compile`` keeps the compiled call in ``_compiled_call_impl`` and ``__call__``
    takes it whenever it is set; it is unset for the block. (``torch.compiler.set_stance
    ("force_eager")`` would also run them eagerly, but through dynamo's wrapper on every layer
    call: decoding is host-bound on a GPU, and the wrapper made HF generate slower there.)
    """
    if not is_compiled(model):
        yield
        return
    layers = decoder_layers(model)
    compiled = [layer._compiled_call_impl for layer in layers]
    try:
        for layer in layers:
            layer._compiled_call_impl = None
        yield
    finally:
        for layer, call in zip(layers, compiled, strict=True):
            layer._compiled_call_impl = call


def compile_training_models(module: nn.Module) -> int:
    """Compile the decoder layers of a GRPO module's policy and of its reference, unless the
    reference is the policy itself with adapters off (LoRA); returns how many layers."""
    count = compile_decoder_layers(module.policy)
    reference = getattr(module, "reference", None)
    if isinstance(reference, nn.Module) and hasattr(reference, "get_decoder") and not is_compiled(reference):
        count += compile_decoder_layers(reference)
    return count
