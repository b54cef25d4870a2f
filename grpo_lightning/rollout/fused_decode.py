"""A fused prefill and one-token decode step for Llama-family models (``rollout.hf_decoder=fused``).

On a small model a transformers forward of one token costs several times its arithmetic: it
builds an attention mask, grows a cache object by concatenation, recomputes the rotary
angles, runs q, k and v (and gate and up) as separate matmuls and goes through a dozen
module calls per layer; on a tiny policy the matmuls are a small part of a token's time.
:class:`FusedDecoder` runs the same layers from the
model's own weights with one q/k/v and one gate/up matmul per layer, the rotary embedding of
q and k as one complex multiplication with angles computed once per rollout by the model's
own rotary module, and a preallocated KV cache read in place (the speed-up, measured:
docs/performance.md, "Rollouts: HF decoders and vLLM engines").

It covers small models (``FUSED_MAX_COPY_BYTES``: on larger ones a step is bound by its
matmuls and the forward is as fast) whose decoder is exactly Llama's (``FUSED_ARCHITECTURES``):
RMSNorm, rotary position embeddings with static angles, a SiLU-gated MLP, grouped-query
attention, optional projection biases, float32 weights, no autocast. Anything else (a LoRA
policy, a sliding window shorter than the rollout, 16-bit weights or autocast, a rotary type
whose angles depend on the length) keeps the model's own forward (:func:`fused_decode_support`
says why). The engine checks the prefill and the first step of its first rollout against the
model's forward and falls back, with a warning, if they differ.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

# The causal-LM classes whose decoder layers are Llama's (the same module layout and maths).
FUSED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
# Rotary types whose angles depend on the position only (not on the sequence length).
STATIC_ROPE_TYPES = ("default", "linear", "llama3")
# Max |fused - forward| logit difference the engine's check accepts (float32 rounding: ~1e-6).
FUSED_CHECK_ATOL = 1e-4
# The fused q/k/v and gate/up matmuls are copies of about four fifths of the decoder's weights,
# made once per rollout. Above this size a decode step is bound by its matmuls, where the fused
# decoder saves nothing (SmolLM2-135M's copy would be 266 MiB, for no gain: benchmarks/results/LOG.md),
# so larger models keep the forward.
FUSED_MAX_COPY_BYTES = 64 * 2**20


def fused_decode_support(model: nn.Module, total_length: int, name: str | None = None) -> str | None:
    """None when :class:`FusedDecoder` computes ``model``'s forward over ``total_length`` positions; else why not
    (``name``: the causal-LM class ``model`` stands for, e.g. a VLM's text decoder: its own class's by default)."""
    unsupported = layout_support(model, total_length, name)
    if unsupported is not None:
        return unsupported
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "its weights are not float32"
    copied = sum(
        p.weight.numel() * p.weight.element_size()
        for layer in model.model.layers
        for p in _projections(layer, fused_only=True)
    )
    if copied > FUSED_MAX_COPY_BYTES:
        return (
            f"its fused weights would copy {copied / 2**20:.0f} MiB per rollout (more than "
            f"{FUSED_MAX_COPY_BYTES / 2**20:.0f}): a model this size decodes at its matmuls' speed either way"
        )
    return None


def layout_support(model: nn.Module, total_length: int, name: str | None = None) -> str | None:
    """None when the fused layers compute ``model``'s decoder (any float dtype, any size); else why not."""
    name = name or type(model).__name__
    if name not in FUSED_ARCHITECTURES:
        return f"{name} is not one of {FUSED_ARCHITECTURES}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act={config.hidden_act!r} (the fused decoder implements silu)"
    rope_type = getattr(model.model.rotary_emb, "rope_type", None)
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rotary type {rope_type!r} (the fused decoder precomputes static angles: {STATIC_ROPE_TYPES})"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and window < total_length:
        return f"sliding_window={window} is shorter than the rollout ({total_length} positions)"
    for layer in model.model.layers:
        if not all(type(p) is nn.Linear for p in _projections(layer)):
            return "its projections are not plain nn.Linear layers (LoRA adapters, quantized weights)"
    if torch.is_autocast_enabled(model.device.type):
        return "autocast is on (trainer.precision=*-mixed)"
    return None


def _projections(layer: nn.Module, fused_only: bool = False) -> list[nn.Linear]:
    """A decoder layer's projections; with ``fused_only`` those the fused matmuls copy (q, k, v, gate, up)."""
    attention, mlp = layer.self_attn, layer.mlp
    fused = [attention.q_proj, attention.k_proj, attention.v_proj, mlp.gate_proj, mlp.up_proj]
    return fused if fused_only else [*fused, attention.o_proj, mlp.down_proj]


def _weight_and_bias(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    bias = layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features)
    return layer.weight, bias


def _fused_linear(*parts: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight and bias computing the (weight, bias) ``parts`` side by side; no bias if all are 0."""
    weight, bias = torch.cat([w for w, _ in parts]), torch.cat([b for _, b in parts])
    return weight, (bias if bool(bias.any()) else None)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Llama's RMSNorm (float32 weights: no dtype round trip), as torch's one fused op."""
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _plus_linear(residual: torch.Tensor, x: torch.Tensor, weight_and_bias: tuple) -> torch.Tensor:
    """``residual + linear(x)`` on [B, n, features] tensors, one addmm where there is no bias."""
    weight, bias = weight_and_bias
    if bias is not None:
        return residual + F.linear(x, weight, bias)
    out = torch.addmm(residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]), weight.t())
    return out.view(residual.shape)


def _rotary_pairs_adjacent(tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of a q or k projection (weight or bias) reordered within each head from Llama's
    [first halves, second halves] to [x_0, x_half, x_1, x_half+1, ...]: each pair the rotary
    embedding rotates together becomes adjacent, so that it is one complex multiplication.
    Queries and keys are reordered alike, which leaves every attention score unchanged."""
    heads = tensor.reshape(-1, 2, head_dim // 2, *tensor.shape[1:])
    return heads.transpose(1, 2).reshape(tensor.shape)


class RowSlots(NamedTuple):
    """A decode step's cache writes when every row writes its own column (``rows``: ``arange(B)``); ``flat``:
    each (row, kv head)'s index into the cache viewed as ``[B x kv_heads x width, head_dim]``; ``end``: the
    columns attended to (past every row's last write)."""

    rows: torch.Tensor
    columns: torch.Tensor
    flat: torch.Tensor
    end: int


class _LayerWeights:
    """One decoder layer's weights, q/k/v and gate/up each fused into one matmul."""

    def __init__(self, layer: nn.Module):
        attention = layer.self_attn
        self.head_dim, kv_width = attention.head_dim, attention.v_proj.weight.shape[0]
        self.kv_heads = kv_width // self.head_dim
        self.split = [attention.q_proj.weight.shape[0] + attention.k_proj.weight.shape[0], kv_width]
        (self.qkv_weight, self.qkv_bias), (self.gate_up_weight, self.gate_up_bias) = self._fused(layer)
        self.o_proj = (attention.o_proj.weight, attention.o_proj.bias)
        self.down_proj = (layer.mlp.down_proj.weight, layer.mlp.down_proj.bias)
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm

    def _fused(self, layer: nn.Module) -> tuple[tuple, tuple]:
        attention = layer.self_attn
        q, k, v = (_weight_and_bias(p) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        qk = tuple(_rotary_pairs_adjacent(torch.cat(pair), self.head_dim) for pair in zip(q, k, strict=True))
        # One matmul gives q and k side by side (rotated together), then v.
        gate_up = _fused_linear(*(_weight_and_bias(p) for p in (layer.mlp.gate_proj, layer.mlp.up_proj)))
        return _fused_linear(qk, v), gate_up

    def refresh(self, layer: nn.Module) -> None:
        """The fused copies again from ``layer``'s changed weights, written into the same tensors."""
        fresh = self._fused(layer)
        for name, value in zip(
            ("qkv_weight", "qkv_bias", "gate_up_weight", "gate_up_bias"), (*fresh[0], *fresh[1]), strict=True
        ):
            held = getattr(self, name)
            if held is not None and value is not None:
                held.copy_(value)
            else:  # a bias that was or became all zeros
                setattr(self, name, value)


class FusedWeights:
    """A model's weights as the fused decoder reads them. The fused matmuls are copies (about
    four fifths of the decoder's weights), so they are built once per rollout, after the
    weights last changed, and shared by every chunk of it."""

    def __init__(self, model: nn.Module):
        config, base = model.config, model.model
        self.layers = [_LayerWeights(layer) for layer in base.layers]
        self.embedding, self.norm, self.head = base.embed_tokens.weight, base.norm, model.lm_head
        self.rotary = base.rotary_emb
        self.heads, self.kv_heads = config.num_attention_heads, self.layers[0].kv_heads
        self.head_dim = self.layers[0].head_dim
        self._model = model

    @torch.no_grad()
    def refresh(self) -> None:
        """After the model's weights changed in place (the pipeline's weight swap between tokens): the
        fused copies are recomputed into the same tensors, so a recorded CUDA graph reads the new ones."""
        for layer_weights, layer in zip(self.layers, self._model.model.layers, strict=True):
            layer_weights.refresh(layer)


class SharedRows(NamedTuple):
    """Rows of a batch that repeat one another (a group's G samples of one prompt): ``firsts`` [U] the first
    row of each distinct one, ``inverse`` [B] each row's index among them."""

    firsts: torch.Tensor
    inverse: torch.Tensor


def shared_rows(keys: list, device: torch.device | str = "cpu") -> SharedRows | None:
    """The distinct entries of ``keys`` (one hashable per row: equal keys, equal rows) as indices on
    ``device``, or None when every row is distinct (nothing to share)."""
    index: dict = {}
    inverse = [index.setdefault(key, len(index)) for key in keys]
    if len(index) == len(keys):
        return None
    firsts = [0] * len(index)
    for row in reversed(range(len(keys))):
        firsts[inverse[row]] = row
    return SharedRows(torch.tensor(firsts, device=device), torch.tensor(inverse, device=device))


class FusedDecoder:
    """Prefills left-padded prompts, then decodes one token per call for every row.

    ``prompt_mask`` [B, P] marks the real prompt tokens (left padding); a row's positions count
    its real tokens from 0, as the loop's forward does. ``prefill(prompt_ids)`` returns the
    logits [B, V] after each prompt; each ``step(tokens)`` (at most ``max_steps``) takes the
    tokens [B] just drawn and returns the next logits. ``weights``: the model's
    :class:`FusedWeights` (built here if not given).
    """

    def __init__(
        self, model: nn.Module, prompt_mask: torch.Tensor, max_steps: int, weights: FusedWeights | None = None
    ):
        self.weights = weights = weights if weights is not None else FusedWeights(model)
        batch, prefilled = prompt_mask.shape
        length = prefilled + max(max_steps, 0)
        reference = weights.embedding
        cache_shape = (batch, weights.kv_heads, length, weights.head_dim)
        self.keys = [reference.new_zeros(cache_shape) for _ in weights.layers]
        self.values = [reference.new_zeros(cache_shape) for _ in weights.layers]
        self.scaling = weights.head_dim**-0.5
        real = prompt_mask.bool()
        prompt_positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)  # [B, P]
        # Rotations (cos + i sin, the rotary embedding's angles from the model's own module, in float32
        # whatever the weights' dtype) of the prompt [B, P, 1, D / 2] and of each row at each step
        # [steps, B, 1, D / 2].
        steps = prompt_positions[:, -1:].T + torch.arange(1, max(max_steps, 0) + 1, device=real.device)[:, None]
        angles_like = torch.empty(0, device=reference.device)  # the rotary module reads its dtype and device
        self.prompt_rotation = self._rotation(weights.rotary(angles_like, prompt_positions))
        self.rotation = self._rotation(weights.rotary(angles_like, steps))
        # Prefill bias: causal over the row's real tokens; a padding position
        # sees itself only (its output is never read, and a fully masked row would be NaN).
        causal = torch.ones(prefilled, prefilled, dtype=torch.bool, device=real.device).tril()
        allowed = (causal & real[:, None, :]) | torch.eye(prefilled, dtype=torch.bool, device=real.device)
        bias = reference.new_zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
        kv_heads, groups = weights.kv_heads, weights.heads // weights.kv_heads
        # Both biases per (row, key/value head), as _layer's batched matmuls see them: the prefill's
        # [B x kv_heads, groups x P, P] (its query rows); the decode's [B x kv_heads, 1, length] over
        # the cache, -inf on padding and on slots not yet written.
        self.prompt_bias = bias.repeat(1, groups, 1).repeat_interleave(kv_heads, dim=0)
        decode_bias = reference.new_full((batch, length), float("-inf"))
        decode_bias[:, :prefilled].masked_fill_(real, 0.0)
        self.bias = decode_bias.repeat_interleave(kv_heads, dim=0)[:, None]
        self.prefilled, self.written, self.max_steps = prefilled, prefilled, max_steps

    @staticmethod
    def _rotation(cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cos, sin = cos_sin  # [..., D]: each angle twice (Llama's halves)
        half = cos.shape[-1] // 2
        return torch.complex(cos[..., :half], sin[..., :half])[:, :, None]

    def _layer(self, index: int, hidden: torch.Tensor, rotation: torch.Tensor, slots, bias) -> torch.Tensor:
        """hidden [B, n, hidden] through decoder layer ``index``: its keys and values go to cache
        ``slots`` (n of them: a slice, or a device tensor of slot indices), its queries attend to
        the cache up to their end (the whole cache for a tensor)."""
        w, keys, values = self.weights.layers[index], self.keys[index], self.values[index]
        heads, kv_heads, head_dim = self.weights.heads, w.kv_heads, w.head_dim
        batch, n = hidden.shape[:2]
        groups = heads // kv_heads
        qk, v = F.linear(_rms_norm(hidden, w.input_norm), w.qkv_weight, w.qkv_bias).split(w.split, -1)
        # [B, n, heads + kv_heads, D]: the rotary embedding, each adjacent pair times cos + i sin
        # (in float32: there is no 16-bit complex type for bfloat16).
        pairs = torch.view_as_complex(qk.float().view(batch, n, -1, head_dim // 2, 2))
        qk = torch.view_as_real(pairs * rotation).view(batch, n, -1, head_dim).to(v.dtype)
        k, v = qk[:, :, heads:].transpose(1, 2), v.view(batch, n, kv_heads, head_dim).transpose(1, 2)
        if isinstance(slots, slice):
            keys[:, :, slots], values[:, :, slots], end = k, v, slots.stop
        elif isinstance(slots, RowSlots):  # one column per row (the pipeline's slot decoder): the whole cache
            keys.view(-1, head_dim).index_copy_(0, slots.flat, k[:, :, 0].reshape(-1, head_dim))
            values.view(-1, head_dim).index_copy_(0, slots.flat, v[:, :, 0].reshape(-1, head_dim))
            end = slots.end
        else:  # a device tensor of slots (a static step): attend over the whole cache, the bias masks it
            keys.index_copy_(2, slots, k), values.index_copy_(2, slots, v)
            end = keys.shape[2]
        # [B x kv_heads, groups x n, D]: the query heads that share a key/value head as rows of one
        # matrix, so that the cache is read in place (a broadcast over groups would copy it).
        q = qk[:, :, :heads].view(batch, n, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(batch * kv_heads, groups * n, head_dim)
        keys = keys[:, :, :end].reshape(batch * kv_heads, end, head_dim)  # views of the cache
        values = values[:, :, :end].reshape(batch * kv_heads, end, head_dim)
        scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=self.scaling)  # [B x kv_heads, groups x n, slots]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        attended = torch.bmm(weights, values).view(batch, kv_heads, groups, n, head_dim)
        hidden = _plus_linear(hidden, attended.permute(0, 3, 1, 2, 4).reshape(batch, n, -1), w.o_proj)
        gate, up = F.linear(_rms_norm(hidden, w.post_norm), w.gate_up_weight, w.gate_up_bias).chunk(2, -1)
        return _plus_linear(hidden, F.silu(gate) * up, w.down_proj)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.weights.head
        return F.linear(_rms_norm(hidden, self.weights.norm), head.weight, head.bias)

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        return self.prefill_embeddings(F.embedding(prompt_ids, self.weights.embedding))

    @torch.no_grad()
    def prefill_embeddings(self, hidden: torch.Tensor, shared: SharedRows | None = None) -> torch.Tensor:
        """:meth:`prefill` from the prompts' input embeddings [B, P, hidden] (a VLM's, images in place);
        with ``shared``, the embeddings of its distinct rows only [U, P, hidden]: each is run once, and its
        keys, values and logits copied to the rows that repeat it (a group's G samples of one prompt)."""
        slots = slice(0, self.prefilled)
        if shared is None:
            for index in range(len(self.weights.layers)):
                hidden = self._layer(index, hidden, self.prompt_rotation, slots, self.prompt_bias)
            return self._logits(hidden[:, -1])
        firsts, every = shared.firsts, shared.inverse
        rotation = self.prompt_rotation[firsts]
        bias = self.prompt_bias.unflatten(0, (self.keys[0].shape[0], -1))[firsts].flatten(0, 1)
        full = self.keys, self.values
        self.keys = [k[firsts, :, : self.prefilled] for k in full[0]]  # the distinct rows' caches (copies)
        self.values = [v[firsts, :, : self.prefilled] for v in full[1]]
        try:
            for index in range(len(self.weights.layers)):
                hidden = self._layer(index, hidden, rotation, slots, bias)
            for cache, distinct in zip((*full[0], *full[1]), (*self.keys, *self.values), strict=True):
                cache[:, :, slots] = distinct.index_select(0, every)
        finally:
            self.keys, self.values = full
        return self._logits(hidden[:, -1]).index_select(0, every)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.written - self.prefilled >= self.max_steps:
            raise RuntimeError(f"FusedDecoder: called more than the {self.max_steps} steps its cache holds")
        slot, step = self.written, self.written - self.prefilled
        self.bias[..., slot] = 0.0
        bias = self.bias[..., : slot + 1]  # [B x kv_heads, 1, slots]
        rotation = self.rotation[step][:, None]  # [B, 1, 1, D / 2]
        hidden = F.embedding(tokens, self.weights.embedding)[:, None]  # [B, 1, hidden]
        for index in range(len(self.weights.layers)):
            hidden = self._layer(index, hidden, rotation, slice(slot, slot + 1), bias)
        self.written += 1
        return self._logits(hidden[:, 0])
