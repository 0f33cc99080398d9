"""Honest boundary flips, made on purpose: where a top-p nucleus's boundary token would
change a seeded draw if the worker's noise moved it out (SPEC §18.1, boundary events)."""

import torch

from crypto.sampling import SamplingCheck, gumbel_noise_rows, nucleus_bounds_at, nucleus_mask


def boundary_drops(
    logits: torch.Tensor, seed: int, check: SamplingCheck, temperature: float, top_p: float
) -> dict[int, int]:
    """{position: token} where the worker's nucleus lacking our winner among the tokens
    surely in at κ units, a token of uncertain membership at 2κ, makes the seeded sampler
    draw another token more than κ units behind it: what an honest worker draws when its
    noise moved that token out of its nucleus. ``logits`` [n, V] are the validator's."""
    ell = logits.double()
    n, vocab = ell.shape
    unit = check.unit(ell, temperature)
    scores = ell / temperature + gumbel_noise_rows([seed] * n, list(range(n)), vocab)
    spreads = (check.noise_max * unit, check.forged_factor * check.noise_max * unit)
    (_, core), (_, firm) = nucleus_bounds_at(ell, temperature, top_p, spreads)
    nucleus = nucleus_mask(ell, temperature, top_p)
    drops = {}
    for k in range(n):
        x = int(scores[k].masked_fill(~core[k], -torch.inf).argmax())
        if core[k, x] and not firm[k, x]:
            kept = nucleus[k].clone()
            kept[x] = False
            y = int(scores[k].masked_fill(~kept, -torch.inf).argmax())
            if (scores[k, x] - scores[k, y]) / unit[k] > check.noise_max:
                drops[k] = y
    return drops
