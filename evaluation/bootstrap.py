"""95% intervals for perplexities and their differences: a seeded bootstrap over blocks of contiguous tokens.

python eval.py checkpoint=out/rope                       an interval for every cell of length.json (and stream.json)
python eval.py sweep_dir=multirun/<time>                 + which differences between runs are within noise
Blocks, not tokens, are resampled: neighbouring tokens' NLLs are correlated (one scene, one speaker), so a token
bootstrap would be far too narrow. A block is a scored piece (evaluation/pieces.py) or eval.block tokens of a stream.
The interval (2.5th to 97.5th percentile of 2,000 draws of the token-weighted mean NLL) says how much the number would
move had other passages of the same works been scored, not how another kind of text would score. Rows scored on the
same pieces share their block draws, so their difference is a paired bootstrap; each draw also resamples a seed
group's runs, so the seed-to-seed spread enters too. Seeded: the same inputs give the same intervals.
"""

import hashlib
import json
import math

import numpy as np

DRAWS, LEVEL, SEED = 2000, 0.95, 0
Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def _rng(seed: int, key) -> np.random.Generator:
    digest = hashlib.sha1(json.dumps(key, default=str).encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:4], "little")])


def block_draws(n_blocks: int, key=None, draws: int = DRAWS) -> np.ndarray:
    """(draws, n_blocks) block indices drawn with replacement; the same key gives the same draws."""
    return _rng(SEED, key).integers(0, n_blocks, (draws, n_blocks))


def resample(block_nll: np.ndarray, block_tokens: np.ndarray, idx: np.ndarray, run_key=None) -> np.ndarray:
    """Mean NLL per token of each draw. block_nll: (runs, blocks) summed NLL per block; idx: block_draws."""
    block_nll = np.atleast_2d(block_nll)
    tokens = np.asarray(block_tokens, dtype=np.float64)[idx].sum(axis=1)
    return pick_runs(block_nll[:, idx].sum(axis=2) / tokens, run_key)


def pick_runs(per_run: np.ndarray, run_key=None) -> np.ndarray:
    """per_run: (runs, draws). Each draw averages as many runs picked with replacement."""
    if len(per_run) == 1:
        return per_run[0]
    runs = _rng(SEED + 1, run_key).integers(0, len(per_run), (per_run.shape[1], len(per_run)))
    return per_run[runs, np.arange(per_run.shape[1])[:, None]].mean(axis=1)


def interval(samples: np.ndarray) -> tuple[float, float]:
    lo, hi = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def ppl_interval(samples: np.ndarray) -> list[float]:
    """A perplexity interval from draws of mean NLL, rounded for the JSON files."""
    return [round(float(np.exp(x)), 4) for x in interval(samples)]


def difference(a: np.ndarray, b: np.ndarray) -> dict:
    """The interval of draws of mean NLL a - b (paired when drawn with the same block indices); 0 in it: noise."""
    lo, hi = interval(a - b)
    diff = round(float(np.mean(a - b)), 5)
    return {"diff_nll": diff, "lo": round(lo, 5), "hi": round(hi, 5), "within_noise": lo <= 0 <= hi}


def shown(pair: dict, sign: int = 1) -> str:
    """`a - b [lo, hi]` of difference()'s pair, in mean NLL; sign -1: b - a."""
    lo, hi = sorted((sign * pair["lo"], sign * pair["hi"]))
    return f"{sign * pair['diff_nll']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def contiguous_blocks(nll: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(summed NLL, token count) of each run of `size` consecutive tokens (the last may be shorter)."""
    starts = np.arange(0, len(nll), size)
    return np.add.reduceat(nll, starts), np.diff(np.append(starts, len(nll)))


def wilson(correct: int, n: int) -> list[float]:
    """The Wilson score interval for a binomial proportion (Wilson 1927): [lo, hi] around correct / n."""
    if n == 0:
        return [0.0, 1.0]
    p, z2 = correct / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return [max(0.0, centre - half), min(1.0, centre + half)]
