"""F3 for the update itself: would this optimizer step write a non-finite weight?

Finite gradients do not make a finite step: ``lr=1e39`` turns every AdamW update into inf.
Checking after the step is too late (the old weights are gone), and a snapshot to restore from
costs a copy of the weights and both Adam moments. So the step is first tried on a few tensors
at a time, their new values checked, and those tensors and their optimizer state put back: the
extra memory is about a sixteenth of the trained weights and their state, not the model. The optimizer runs its own
code (no second copy of AdamW's formula); its update is elementwise, so the trial step computes
exactly what the real one will.
"""

from __future__ import annotations

import torch

INF = float("inf")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2: this rank's shard


def _groups(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Positions of ``tensors`` by device and dtype: a multi-tensor kernel takes one such group, and
    a list that mixes them (bf16 weights and Adam's float32 step counts) runs one kernel per tensor."""
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return list(groups.values())


def _copy_into(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])``, a multi-tensor copy per device and dtype (FSDP2: shard by shard)."""
    targets, sources = [_local(t) for t in targets], [_local(s) for s in sources]
    with torch.no_grad():
        for group in _groups(targets):
            torch._foreach_copy_([targets[i] for i in group], [sources[i] for i in group])


def _copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors``: one ``clone`` each was a kernel launch each on a GPU (2400 for a
    24-layer model's weights and Adam moments, the GPU idle between)."""
    copies = [torch.empty_like(t) for t in tensors]
    _copy_into(copies, tensors)
    return copies


def _saved_states(optimizer: torch.optim.Optimizer, params: list) -> list[dict | None]:
    """Each parameter's optimizer state (None before its first step), tensors copied."""
    states = [dict(optimizer.state[p]) if p in optimizer.state else None for p in params]
    slots = [(state, key) for state in states if state for key, v in state.items() if torch.is_tensor(v)]
    for (state, key), copy in zip(slots, _copies([state[key] for state, key in slots]), strict=True):
        state[key] = copy
    return states


def _restore(params: list, old: list, optimizer: torch.optim.Optimizer, states: list) -> None:
    """The weights and optimizer state as before the trial: multi-tensor copies."""
    targets, sources = list(params), list(old)
    for param, state in zip(params, states, strict=True):
        if state is None:  # the parameter's first step: no state before it
            optimizer.state.pop(param, None)
            continue
        for key, value in state.items():
            current = optimizer.state[param].get(key)
            if torch.is_tensor(value) and torch.is_tensor(current):
                targets.append(current)
                sources.append(value)
            else:
                optimizer.state[param][key] = value
    _copy_into(targets, sources)


# A chunk holds at least this many elements: a small model is tried in one optimizer call (each
# call costs its fixed overhead), at most 4M weights and their two moments copied (48 MB in fp32).
MIN_CHUNK_ELEMENTS = 4_000_000


def _chunks(params: list) -> list[list]:
    """Consecutive parameters, about a sixteenth of them by size in each (at least the largest one,
    and at least MIN_CHUNK_ELEMENTS): few optimizer calls, and the copies kept meanwhile stay a
    small share of a large model."""
    total = sum(p.numel() for p in params)
    budget = max(max(p.numel() for p in params), total // 16, MIN_CHUNK_ELEMENTS)
    chunks, size = [[]], 0
    for p in params:
        if chunks[-1] and size + p.numel() > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += p.numel()
    return chunks


def _largest_magnitudes(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """max |x| of each tensor (NaN where it holds one). Through one copy of their absolute values on
    a GPU (multi-tensor kernels; the inf-norm has none there and ran one kernel per tensor) and on a
    CPU up to MIN_CHUNK_ELEMENTS elements in all (a few times faster than the inf-norm); larger CPU
    chunks without the copy."""
    if tensors[0].is_cuda or sum(t.numel() for t in tensors) <= MIN_CHUNK_ELEMENTS:
        out: list[torch.Tensor] = list(tensors)
        for group in _groups(tensors):
            maxima = torch._foreach_max(torch._foreach_abs([tensors[i] for i in group]))
            for i, m in zip(group, maxima, strict=True):
                out[i] = m
        return out
    return list(torch._foreach_norm(tensors, ord=INF))


def _trial(optimizer: torch.optim.Optimizer, group: dict, params: list) -> list[torch.Tensor]:
    """The largest magnitude of each new weight and state tensor of ``params`` after a step on them
    alone (NaN and inf propagate through it, a large finite value stays finite); then put back."""
    old = _copies([p.detach() for p in params])
    states = _saved_states(optimizer, params)
    optimizer.param_groups = [{**group, "params": params}]
    try:
        optimizer.step()
        new = [t for p in params for t in (p.detach(), *optimizer.state[p].values()) if torch.is_tensor(t)]
        return _largest_magnitudes([_local(t) for t in new if t.is_floating_point() and t.numel()])
    except RuntimeError as err:  # a step size beyond float32 ("value cannot be converted ... overflow")
        if "overflow" not in str(err):
            raise
        return [torch.tensor(INF, device=params[0].device)]
    finally:
        _restore(params, old, optimizer, states)


def nonfinite_update_count(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """How many tensors (weights or optimizer state) of this rank's parameters with a gradient the
    next ``optimizer.step()`` would make non-finite: a device tensor (no host sync). The weights and
    the optimizer state are left as they were."""
    groups = optimizer.param_groups
    maxima: list[torch.Tensor] = []
    try:
        for group in groups:
            params = [p for p in group["params"] if p.grad is not None]
            for chunk in _chunks(params) if params else []:
                maxima.extend(_trial(optimizer, group, chunk))
    finally:
        optimizer.param_groups = groups
    if not maxima:
        return torch.zeros(())
    return (~torch.isfinite(torch.stack([m.float() for m in maxima]))).sum()
