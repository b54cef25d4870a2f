"""The update guard's per-tensor magnitudes: the cheap path agrees with the inf-norm on random tensors."""

import torch

from grpo_lightning.step import update_check
from grpo_lightning.step.update_check import INF, MIN_CHUNK_ELEMENTS, _largest_magnitudes


def _random_tensors(g: torch.Generator) -> list[torch.Tensor]:
    tensors = []
    for _ in range(int(torch.randint(1, 6, (1,), generator=g))):
        dtype = [torch.float32, torch.bfloat16, torch.float64, torch.float16][
            int(torch.randint(0, 4, (1,), generator=g))
        ]
        scale = 10 ** float(torch.randint(-3, 30, (1,), generator=g))
        x = (torch.randn(int(torch.randint(1, 50, (1,), generator=g)), generator=g) * scale).to(dtype)
        r = torch.rand(x.shape, generator=g)
        x[r < 0.05] = float("nan")
        x[(r > 0.05) & (r < 0.08)] = INF
        x[(r > 0.08) & (r < 0.1)] = -INF
        tensors.append(x)
    return tensors


def test_largest_magnitudes_match_the_inf_norm_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        tensors = _random_tensors(g)
        for got, want in zip(_largest_magnitudes(tensors), torch._foreach_norm(tensors, ord=INF), strict=True):
            assert got.dtype == want.dtype
            assert bool(got.isfinite()) == bool(want.isfinite())
            assert not bool(want.isfinite()) or bool(got == want)


def test_large_chunks_take_the_inf_norm():
    big = [torch.zeros(MIN_CHUNK_ELEMENTS + 1)]
    big[0][3] = -5.0
    assert float(_largest_magnitudes(big)[0]) == 5.0


def test_the_trial_copies_by_multi_tensor_calls_one_per_dtype_and_restores_every_bit(monkeypatch):
    """Weights and Adam moments copied and restored with one multi-tensor call per device and dtype
    (a per-tensor clone was a kernel launch each on a GPU: thousands per step, the GPU idle between);
    mixed bf16 and float32 weights come back bit-identical, moments and step counts too."""
    g = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(int(torch.randint(1, 9, (1,), generator=g)), 4, generator=g).to(dtype))
        for dtype in [torch.float32, torch.bfloat16] * 6
    ]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
        opt.step()
    before = [p.detach().clone() for p in params]
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    calls = []
    real_copy = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: calls.append(len(dst)) or real_copy(dst, src))
    assert int(update_check.nonfinite_update_count(opt)) == 0
    # weights saved, Adam state saved, both restored: each a float32 and a bf16 group (step counts are
    # float32); every weight, both moments and the step count, once each way
    assert len(calls) == 3 * 2 and sum(calls) == 2 * 4 * len(params)
    assert all(torch.equal(b, p) for b, p in zip(before, params, strict=True))
    for p, s in opt.state.items():
        assert all(torch.equal(v, state[id(p)][k]) for k, v in s.items())
