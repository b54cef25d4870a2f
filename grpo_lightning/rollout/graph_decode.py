"""A fixed-shape decode step, replayed as one CUDA graph on a GPU (``rollout.hf_decoder=graph``).

On a GPU a transformers forward of one token is bound by the host: it launches about 1500
kernels for a 24-layer model, and the GPU waits on the Python that launches them
(benchmarks/results/LOG.md, "On a GPU"). The fused decoder (:mod:`grpo_lightning.rollout.fused_decode`)
launches fewer, but its step still changes shape every token (it reads the cache up to the
last written slot). :class:`StaticDecoder` makes every step the same computation: the new
keys and values go to the cache slot a device counter names, the queries attend to the whole
preallocated cache with the not-yet-written slots masked out, and the counters advance on the
device. Such a step can be recorded once as a CUDA graph and replayed each token with a single
launch (:class:`GraphDecoder`); on a CPU it runs the same computation eagerly (for the tests:
it is slower there than the fused decoder, which reads only the written part of the cache).

With ``model.compile=true`` the step is also compiled (``torch.compile``, inductor) before it is
recorded: inductor fuses the norms, casts and activations between the matmuls into fewer
kernels, for one compilation per rollout shape (the first rollouts pay it).

After the checked first rollout, :class:`SampledGraphLoop` records more than the step: the draw
from the seeded streams, the padding of rows that ended and the writing of each token and its
log-prob into the rollout's buffers join the same graph, so a token is one launch and no Python
work (the host is free for what runs beside decoding; on a GPU the GPU's own time decides the
speed either way: benchmarks/results/LOG.md, "The step after the entropy and sampler fixes").

It accepts what the fused layers compute (:func:`layout_support`: Llama-family layouts), in
any float dtype and at any size. The engine checks the prefill and the first step of its first
rollout against the model's forward (:func:`check_tolerance`), as for the fused decoder.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from grpo_lightning.rollout.fused_decode import FUSED_CHECK_ATOL, FusedDecoder, FusedWeights, layout_support
from grpo_lightning.rollout.sampler import SeededSampler, draw_tokens

# 16-bit weights: the fused layers round in another order than the model's forward (fused
# matmuls, float32 rotary); the check accepts differences up to this share of the largest logit.
# A wrong layer (a misplaced rotary pair, a wrong mask) moves the logits by their own size.
SIXTEEN_BIT_CHECK_RTOL = 0.05


def graph_decode_support(model: nn.Module, total_length: int) -> str | None:
    """None when :class:`GraphDecoder` computes ``model``'s forward over ``total_length`` positions; else why not."""
    unsupported = layout_support(model, total_length)
    if unsupported is None and len({p.dtype for p in model.parameters()}) > 1:
        unsupported = "its weights have mixed dtypes"
    return unsupported


def check_tolerance(want: torch.Tensor) -> float:
    """Largest |decoder - forward| logit difference the engine's check accepts for logits ``want``."""
    if want.dtype == torch.float32:
        return FUSED_CHECK_ATOL
    return SIXTEEN_BIT_CHECK_RTOL * max(1.0, float(want.float().abs().max()))


class StaticDecoder(FusedDecoder):
    """The fused decoder with a step whose shapes and addresses never change: the write slot and
    the step's rotation are read from device counters, which the step itself advances."""

    def __init__(
        self, model: nn.Module, prompt_mask: torch.Tensor, max_steps: int, weights: FusedWeights | None = None
    ):
        super().__init__(model, prompt_mask, max_steps, weights)
        device = self.bias.device
        self.slot = torch.tensor([self.prefilled], device=device)  # the cache slot the next step writes
        self.step_index = torch.tensor([0], device=device)  # the next step's row of the rotations
        self.taken = 0  # steps run (counted on the host, for the bound only)

    def _count_step(self) -> None:
        """Counts a step on the host (its cache slot is the device counter's): the bound, and ``written``."""
        if self.taken >= self.max_steps:
            raise RuntimeError(f"{type(self).__name__}: called more than the {self.max_steps} steps its cache holds")
        self.taken += 1
        self.written += 1

    def _static_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token for every row, with no host-side state read: recordable as a CUDA graph."""
        self.bias.index_fill_(-1, self.slot, 0.0)  # the new slot becomes visible
        rotation = self.rotation.index_select(0, self.step_index)[0][:, None]  # [B, 1, 1, D / 2]
        hidden = F.embedding(tokens, self.weights.embedding)[:, None]  # [B, 1, hidden]
        for index in range(len(self.weights.layers)):
            hidden = self._layer(index, hidden, rotation, self.slot, self.bias)
        self.slot.add_(1)
        self.step_index.add_(1)
        return self._logits(hidden[:, 0])

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self._count_step()
        return self._static_step(tokens)


class GraphDecoder(StaticDecoder):
    """:class:`StaticDecoder` whose step is recorded as a CUDA graph at its first call and replayed
    after (on a CPU it runs eagerly). The returned logits are the graph's output buffer: read
    them before the next step."""

    def __init__(
        self,
        model: nn.Module,
        prompt_mask: torch.Tensor,
        max_steps: int,
        weights: FusedWeights | None = None,
        compiled: bool = False,
    ):
        super().__init__(model, prompt_mask, max_steps, weights)
        self.compiled = compiled  # compile the step (on CUDA) before recording it
        self.graph: torch.cuda.CUDAGraph | None = None
        self._tokens: torch.Tensor | None = None  # the graph's input buffer
        self._logits_out: torch.Tensor | None = None  # the graph's output buffer

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.device.type != "cuda":
            return super().step(tokens)
        self._count_step()
        if self.graph is None:
            self._record(tokens)
        self._tokens.copy_(tokens)
        self.graph.replay()
        return self._logits_out

    def _record(self, tokens: torch.Tensor) -> None:
        self._tokens = tokens.clone()
        step = _compiled_step() if self.compiled else StaticDecoder._static_step
        # The warm-up writes the cache slot the first replay writes again.
        self.graph, self._logits_out = record_graph(lambda: step(self, self._tokens), [self.slot, self.step_index])


def record_graph(unit, moved: list[torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, object]:
    """Records ``unit()`` as a CUDA graph; returns the graph and what the recorded call returned
    (its output buffers). ``unit`` first runs once on a side stream (it compiles there if it is
    compiled; cuBLAS picks its kernels and workspaces there, which a capture may not), then the
    ``moved`` tensors (the counters and buffers that run advanced) are put back as they were."""
    saved = [tensor.clone() for tensor in moved]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), warnings.catch_warnings():
        # The rotary embedding's complex multiply stays an eager kernel inside a compiled step.
        warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex")
        unit()
    torch.cuda.current_stream().wait_stream(stream)
    for tensor, before in zip(moved, saved, strict=True):
        tensor.copy_(before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = unit()
    return graph, out


class SampledGraphLoop:
    """Draws a token for every row, records it, and runs the decoder's step on it: one unit,
    replayed as a CUDA graph per token on a GPU (eagerly on a CPU).

    It computes what the engine's loop computes (the same :func:`draw_tokens` on the same
    streams' uniforms, ended rows padded), reading its position from a device counter:
    ``tokens`` and ``logprobs`` [B, max_new_tokens] fill column by column, ``ended`` [B] says
    which rows drew their EOS. ``logits`` are the prefill's.
    """

    def __init__(
        self,
        decoder: GraphDecoder,
        sampler: SeededSampler,
        logits: torch.Tensor,
        pad_token_id: int,
        eos_token_id: int,
    ):
        batch, device = logits.shape[0], logits.device
        columns = max(sampler.sampling.max_new_tokens, 1)
        self.decoder, self.sampling = decoder, sampler.sampling
        self.uniforms = sampler.uniform_table(device)  # [B, columns]
        self.logits = logits.clone()  # the next draw's logits: the graph's input and output buffer
        self.tokens = torch.full((batch, columns), pad_token_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(batch, columns, dtype=torch.float32, device=device)
        self.ended = torch.zeros(batch, dtype=torch.bool, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # the next draw's column
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.graph: torch.cuda.CUDAGraph | None = None

    def draw(self) -> torch.Tensor:
        """Draws the next column's tokens [B] from ``logits`` and records them."""
        uniforms = self.uniforms.index_select(1, self.column)[:, 0]
        token, logprob = draw_tokens(self.logits, self.sampling, uniforms)
        token = torch.where(self.ended, self.pad_token_id, token)  # as generate pads ended rows
        self.tokens.index_copy_(1, self.column, token[:, None])
        self.logprobs.index_copy_(1, self.column, logprob[:, None].float())
        self.ended |= token == self.eos_token_id
        self.column.add_(1)
        return token

    def _unit(self, step) -> None:
        self.logits.copy_(step(self.decoder, self.draw()))

    @torch.no_grad()
    def draw_and_step(self) -> None:
        """Draws the next tokens and computes the logits of the draw after them."""
        self.decoder._count_step()
        if self.logits.device.type != "cuda":
            self._unit(StaticDecoder._static_step)
            return
        if self.graph is None:
            self._record()
        self.graph.replay()

    def _record(self) -> None:
        step = _compiled_step() if self.decoder.compiled else StaticDecoder._static_step
        # The warm-up writes the cache slot and the column the first replay writes again.
        moved = [self.decoder.slot, self.decoder.step_index, self.column, self.ended, self.logits]
        self.graph, _ = record_graph(lambda: self._unit(step), moved)


@functools.cache
def _compiled_step():
    """One compiled step for every decoder, made at first use (importing dynamo takes a while):
    a new rollout of the same shapes reuses the compiled code instead of compiling again."""
    return torch.compile(StaticDecoder._static_step)
