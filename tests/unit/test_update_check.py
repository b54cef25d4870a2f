"""The update guard's per-tensor magnitudes: the cheap path agrees with the inf-norm on random tensors."""

import torch

from grpo_lightning.update_check import INF, MIN_CHUNK_ELEMENTS, _largest_magnitudes


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
