"""``HFPipelineEngine``: the policy's own decoder as a streaming engine (``rollout.mode=pipeline``, engine hf).

The trainer changes the policy's weights in place at every optimizer step, so the engine generates
from a *generation copy* of them (a second copy of the parameters, plus the fused q/k/v and gate/up
matmuls the fused decoder already copies): the trainer pushes each update into it through the weight
sync, like into vLLM. One thread decodes every sequence in flight with the fused layers over one set
of cache rows (:class:`~grpo_lightning.rollout.pipeline.slots.SlotDecoder`): a sequence that ends
frees its row and the next waiting one is prefilled into it (continuous batching). Between two
decode steps (the safe point) the thread takes new weights: the sync waits until it is there, the
copy is written in place and the fused copies recomputed in place, and decoding goes on with the
same sequences. Every token records the version of the forward pass that gave its distribution,
and the log-prob it was drawn with; each sample draws from its own seeded stream (the sync
engine's :func:`~grpo_lightning.rollout.sampler.draw_tokens` on the same uniforms), so with
unchanged weights a sample is the sync engine's.

``hf_decoder=graph`` decodes the same way (its step is this one: per-row columns and positions are
device tensors); the CUDA-graph recording of the slot step is not done (no GPU was at hand to test
it). Memory beside the trainer's: the copy (the parameters once more), the fused copies (about four
fifths of the decoder's weights), and a cache of ``generation_batch_size`` rows x (longest prompt +
``max_new_tokens``) positions; said in one line at the start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from grpo_lightning.models.lora import is_peft_model, merged_state_dict
from grpo_lightning.records import Completion
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import EngineBase, EngineError, GenerationRequest, Sampling
from grpo_lightning.rollout.fused_decode import FusedWeights, _projections, layout_support
from grpo_lightning.rollout.graph_decode import check_tolerance
from grpo_lightning.rollout.pipeline.engine import EngineClock
from grpo_lightning.rollout.pipeline.slots import SlotDecoder
from grpo_lightning.rollout.sampler import counter_uniforms, draw_tokens

log = logging.getLogger(__name__)


@dataclass
class _Submission:
    requests: list[GenerationRequest]
    sampling: Sampling
    done: object  # callable(list[Completion])
    failed: object  # callable(BaseException)
    cancellable: bool = True
    out: list = field(default_factory=list)
    left: int = 0


@dataclass
class _Row:
    submission: _Submission
    index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    room: int = 0  # tokens the row's cache columns hold after its prompt (set at join)


def generation_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A plain model holding the policy's weights (a LoRA policy's merged in), never trained."""
    base = policy.get_base_model() if is_peft_model(policy) else policy
    parameter = next(base.parameters())
    with torch.device(parameter.device):
        model = type(base)(base.config)
    model.to(parameter.dtype).load_state_dict(merged_state_dict(policy), strict=False)
    return model.requires_grad_(False).eval()


class HFPipelineEngine(EngineBase):
    """See the module docstring."""

    owns_weights = True  # the generation copy: the trainer pushes every update into it
    streams = True
    supports_async = True  # generate_async() runs on the decode thread, beside the trainer

    def __init__(self, policy, pad_token_id: int, eos_token_id: int, rows: int = 256):
        self.model = generation_copy(policy)
        unsupported = layout_support(self.model, 1)
        if unsupported is not None:
            raise EngineError(
                f"rollout.mode=pipeline with the HF engine needs the fused decoder's layers: {unsupported}"
            )
        self.weights = FusedWeights(self.model)
        self.pad_token_id, self.eos_token_id, self.rows = pad_token_id, eos_token_id, rows
        self.device = next(self.model.parameters()).device
        self.version: int | None = None
        self.weight_version = None  # WeightSync reads engines' versions only through completions
        self._clock = EngineClock()
        self._cond = threading.Condition()
        self._waiting: deque[tuple[_Submission, int]] = deque()  # (submission, request index) not yet in a row
        self._rows: dict[int, _Row] = {}  # row -> sequence in it
        self._swap = None  # (tensors, version, event, box) waiting for the safe point
        self._stop = False
        self._thread: threading.Thread | None = None
        self._decoder: SlotDecoder | None = None
        self._logits: torch.Tensor | None = None
        self._logit_version: list[int] = [-1] * rows  # version of the forward pass that gave each row's logits
        self._uniforms: torch.Tensor | None = None  # [rows, max_new_tokens] each row's stream
        self._checked = False

    # ----------------------------------------------------------------------- the protocol
    def submit(self, requests, sampling, done, failed, cancellable: bool = True) -> None:
        submission = _Submission(list(requests), sampling, done, failed, cancellable)
        submission.out, submission.left = [None] * len(requests), len(requests)
        with self._cond:
            if self._stop:
                raise EngineError("the pipeline's HF engine is closed")
            self._waiting.extend((submission, i) for i in range(len(requests)))
            self._start()
            self._cond.notify_all()

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        """Blocking (held-out evaluation): the requests join the sequences in flight."""
        return self.generate_async(requests, sampling).result()

    def generate_async(self, requests: list[GenerationRequest], sampling: Sampling) -> Future:
        """The requests join the sequences in flight; the future holds their completions (async mode)."""
        future: Future = Future()
        if not requests:
            future.set_result([])
            return future
        self.submit(requests, sampling, future.set_result, future.set_exception, cancellable=False)
        return future

    def load_weights(self, named_tensors, version: int | None = None) -> float:
        """Copy the weights in at the next safe point (between two decode steps); returns the seconds."""
        tensors = list(named_tensors)
        with self._cond:
            if self._thread is None or not self._thread.is_alive() or self._stop:
                return self._apply(tensors, version)
            applied, box = threading.Event(), {}
            self._swap = (tensors, version, applied, box)
            self._cond.notify_all()
        applied.wait()
        if "err" in box:
            raise box["err"]
        return box["seconds"]

    def clock(self):
        return self._clock.read()

    def cancel(self) -> None:
        """Drop every training group waiting or in flight (their callbacks never come)."""
        with self._cond:
            self._waiting = deque(item for item in self._waiting if not item[0].cancellable)
            for row in [r for r, seq in self._rows.items() if seq.submission.cancellable]:
                del self._rows[row]

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The generation copy's log-probs (temperature 1) of ``completion_ids`` (the sync's canary)."""
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=self.device)
        logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        return logp.gather(-1, ids[0, 1:, None])[:, 0][len(prompt_ids) - 1 :].tolist()

    def memory(self, width: int) -> dict[str, float]:
        """MiB beside the trainer's: the copy, the fused copies, and the cache for ``width`` positions a row."""
        copy = sum(p.numel() * p.element_size() for p in self.model.parameters())
        fused = sum(
            p.weight.numel() * p.weight.element_size()
            for layer in self.model.model.layers
            for p in _projections(layer, fused_only=True)
        )
        w = self.weights
        cache = 2 * len(w.layers) * self.rows * w.kv_heads * width * w.head_dim * w.embedding.element_size()
        return {"copy_mib": copy / 2**20, "fused_mib": fused / 2**20, "cache_mib": cache / 2**20}

    # ----------------------------------------------------------------------- the decode thread
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pipeline-hf-engine", daemon=True)
            self._thread.start()

    def _apply(self, tensors, version) -> float:
        start = time.perf_counter()
        params = dict(self.model.state_dict(keep_vars=True))
        with torch.no_grad():
            for name, tensor in tensors:
                if name in params:
                    params[name].copy_(tensor)
            self.weights.refresh()
        self.version = version
        return time.perf_counter() - start

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while self._iteration():
                pass
        except BaseException as err:  # noqa: BLE001  (every waiting caller hears of it)
            self._abandon(EngineError(f"the pipeline's HF engine failed: {type(err).__name__}: {err}"))
            return
        self._abandon(EngineError("the pipeline's HF engine was closed with requests in flight"))

    def _abandon(self, error: EngineError) -> None:
        """The decode thread ends: every submission still waiting or in flight, and a weight swap not taken,
        hear ``error`` (no caller is left waiting on a thread that is gone)."""
        with self._cond:
            failed = {id(s): s for s, _ in self._waiting} | {
                id(r.submission): r.submission for r in self._rows.values()
            }
            self._waiting.clear()
            self._rows.clear()
            swap, self._swap = self._swap, None
            self._stop = True  # a later submit or load_weights does not wait on the gone thread
        if swap is not None:
            swap[3]["err"] = error
            swap[2].set()
        for submission in failed.values():
            submission.failed(error)

    def _iteration(self) -> bool:
        with self._cond:
            if self._swap is not None:
                self._clock.switch("sync")
                tensors, version, applied, box = self._swap
                self._swap = None
                box["seconds"] = self._apply(tensors, version)
                applied.set()
            while not self._rows and not self._waiting and self._swap is None and not self._stop:
                self._clock.switch("idle")
                self._cond.wait()
            if self._stop:
                return False
            if self._swap is not None:
                return True
            self._clock.switch("busy")
            joining = self._seat()
        if joining:
            self._join(joining)
        finished = self._draw()
        for submission in finished:  # outside the lock: the callback may submit more
            submission.done(submission.out)
        self._step()
        return True

    def _seat(self) -> list[tuple[int, _Submission, int]]:
        """Waiting requests into free rows, first come first seated (under the lock)."""
        free = [row for row in range(self.rows) if row not in self._rows]
        joining = []
        while free and self._waiting:
            submission, index = self._waiting.popleft()
            row = free.pop(0)
            self._rows[row] = _Row(submission, index)
            joining.append((row, submission, index))
        return joining

    def _join(self, joining) -> None:
        prompts = [s.requests[i].prompt_ids for _, s, i in joining]
        ids, mask = RolloutBatch.pad_prompts(prompts, self.pad_token_id)
        longest_new = max(s.sampling.max_new_tokens for _, s, _ in joining)
        self._ensure(ids.shape[1] + longest_new + 1, longest_new)
        rows = torch.tensor([row for row, _, _ in joining], device=self.device)
        logits = self._decoder.join(rows, ids.to(self.device), mask.to(self.device))
        if not self._checked:
            self._check(ids, mask, logits)
        self._logits[rows] = logits.float()
        for row, submission, index in joining:
            self._rows[row].room = self._decoder.width - ids.shape[1]
            seed = torch.tensor([submission.requests[index].seed], dtype=torch.int64)
            steps = torch.arange(submission.sampling.max_new_tokens, dtype=torch.int64)
            self._uniforms[row, : len(steps)] = counter_uniforms(seed, steps)[0].to(self.device)
            self._logit_version[row] = self.version if self.version is not None else -1

    def _ensure(self, width: int, max_new: int) -> None:
        """A decoder and row buffers wide enough for ``width`` positions and ``max_new`` draws a row (widened
        with the sequences in flight kept)."""
        if self._decoder is None:
            self._decoder = SlotDecoder(self.weights, self.rows, max(width, 64))
            self._logits = torch.zeros(self.rows, self.weights.head.weight.shape[0], device=self.device)
            self._uniforms = torch.zeros(self.rows, max(max_new, 1), dtype=torch.float64, device=self.device)
            mib = self.memory(self._decoder.width)
            log.info(
                "rollout.mode=pipeline: the HF engine generates from a copy of the weights (%.1f MiB) with fused "
                "copies (%.1f MiB) and a cache of %d rows x %d positions (%.1f MiB)",
                mib["copy_mib"], mib["fused_mib"], self.rows, self._decoder.width, mib["cache_mib"],
            )  # fmt: skip
        if width > self._decoder.width:
            self._decoder.widen(max(width, 2 * self._decoder.width))
        if max_new > self._uniforms.shape[1]:
            self._uniforms = torch.nn.functional.pad(self._uniforms, (0, max_new - self._uniforms.shape[1]))

    def _check(self, ids: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor) -> None:
        """The first prefill against the generation copy's own forward (as the sync engine checks)."""
        position = (mask.cumsum(dim=1) - 1).clamp(min=0).to(self.device)
        want = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), position_ids=position)
        want = want.logits[:, -1]
        difference, tolerance = float((logits.float() - want.float()).abs().max()), check_tolerance(want)
        if difference > tolerance:
            raise EngineError(
                f"rollout.mode=pipeline: the fused layers' logits of {type(self.model).__name__} differ from its "
                f"forward's by {difference:.2e} (more than {tolerance:.2g}); use rollout.mode=sync or async"
            )
        self._checked = True

    def _draw(self) -> list[_Submission]:
        """A token for every row in flight, from its logits and stream; returns the submissions now complete."""
        with self._cond:  # a snapshot: cancel() may empty rows from the trainer's thread
            seqs = dict(sorted(self._rows.items()))
        finished: list[_Submission] = []
        by_sampling: dict[Sampling, list[int]] = {}
        for row, seq in seqs.items():
            by_sampling.setdefault(seq.submission.sampling, []).append(row)
        for sampling, group in by_sampling.items():
            index = torch.tensor(group, device=self.device)
            draws = torch.tensor([len(seqs[r].tokens) for r in group], device=self.device)
            tokens, logprobs = draw_tokens(self._logits[index], sampling, self._uniforms[index, draws])
            for row, token, logprob in zip(group, tokens.tolist(), logprobs.tolist(), strict=True):
                seq = seqs[row]
                seq.tokens.append(token)
                seq.logprobs.append(logprob)
                seq.versions.append(self._logit_version[row])
                ended = token == self.eos_token_id or len(seq.tokens) >= sampling.max_new_tokens
                if ended or len(seq.tokens) >= seq.room:
                    done = self._end(row, seq, finished=token == self.eos_token_id)
                    if done is not None:
                        finished.append(done)
        return finished

    def _end(self, row: int, seq: _Row, finished: bool) -> _Submission | None:
        with self._cond:
            if self._rows.get(row) is not seq:
                return None
            del self._rows[row]
        versions = list(seq.versions)
        known = [v for v in versions if v >= 0]
        seq.submission.out[seq.index] = Completion(
            token_ids=seq.tokens,
            finished=finished,
            logprobs=seq.logprobs,
            weight_version=min(known) if known else None,
            token_weight_versions=versions if known else None,
        )
        seq.submission.left -= 1
        return seq.submission if seq.submission.left == 0 else None

    def _step(self) -> None:
        """One decode step of the rows up to the last occupied one (sequences are seated in the lowest free
        rows, so that prefix stays short when few are in flight)."""
        with self._cond:
            seqs = dict(self._rows)
        if not seqs:
            return
        rows = list(seqs)
        n = max(rows) + 1
        active = torch.zeros(n, dtype=torch.bool, device=self.device)
        tokens = torch.full((n,), self.pad_token_id, dtype=torch.long, device=self.device)
        index = torch.tensor(rows, device=self.device)
        active[index] = True
        tokens[index] = torch.tensor([seqs[r].tokens[-1] for r in rows], device=self.device)
        logits = self._decoder.step(tokens, active)
        self._logits[index] = logits[index].float()
        for row in rows:
            self._logit_version[row] = self.version if self.version is not None else -1
