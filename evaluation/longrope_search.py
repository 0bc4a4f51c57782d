"""LongRoPE's evolutionary search (Ding et al. 2024, sec. 3.2 and Algorithm 1) for one checkpoint and target length.

python -m evaluation.longrope_search checkpoint=out/rope target_length=1024          -> out/rope/longrope_x4.json
python -m evaluation.longrope_search checkpoint=out/rope target_length=1024 search.generations=20 search.population=64
python eval.py checkpoint=out/rope eval.rope_scaling=longrope eval.lengths=[256,1024]   scores what it found
Here, not in positional/, because its fitness runs the model: the mean NLL, under LongRoPE's cos/sin scale, of
search.windows held-out windows of the target length (evaluation/longrope.py says which text). A candidate is a factor
lambda_i per rotary pair (theta_i' = theta_i / lambda_i) on a grid of search.step up to search.max_factor (null: the
paper's 1.25 s), non-decreasing from the highest frequency to the lowest, and start_tokens, the first positions left
unscaled (the paper's n-hat). The search starts from PI, NTK and YaRN written as factors, and their mutants.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

import utils.eval_schema  # noqa: F401  (registers this entry point's settings)
from evaluation import longrope
from evaluation.heldout import held_out_works
from evaluation.length import score
from evaluation.pieces import Region, default_lengths, read_spans, scoring_pieces
from model.variant import Variant
from positional.rope_scaling import Scaling, longrope_scale, scheme_factors
from utils import checkpoint, checks, runtime
from utils.errors import UserError, cli, hydra_cli
from utils.progress import progress, say

SEEDS = ("linear", "ntk", "yarn")  # the paper's PI, NTK and YaRN
NOVEL_TRIES = 50  # draws a mutation gets to find a candidate not seen before, before a repeat is let through


@dataclass(frozen=True)
class Candidate:
    """levels[i]: lambda_i = 1 + step * levels[i] (integers, so the monotone test is exact); start: start_tokens."""

    levels: tuple[int, ...]
    start: int


@dataclass(frozen=True)
class Space:
    step: float
    top: int  # the highest level: lambda <= 1 + step * top
    starts: tuple[int, ...]  # the start_tokens values, ascending

    def factors(self, c: Candidate) -> list[float]:
        return [round(1.0 + self.step * v, 9) for v in c.levels]  # 1.66, not 1.6600000000000001, in the file

    def snap(self, lam, start: int = 0) -> Candidate:
        """Factors onto the grid (rounding is monotone, so a non-decreasing seed stays non-decreasing)."""
        levels = np.clip(np.rint((np.asarray(lam, dtype=np.float64) - 1.0) / self.step), 0, self.top)
        return Candidate(tuple(int(v) for v in levels), start)


def monotone(c: Candidate) -> bool:
    return all(a <= b for a, b in zip(c.levels, c.levels[1:], strict=False))


def mutate(c: Candidate, space: Space, rng: np.random.Generator, rate: float, seen=()) -> Candidate:
    """Each factor, with probability rate, redrawn between its neighbours' values, left to right, so the order holds;
    start_tokens, with probability rate, moves one step in its list. Tries for a child unlike its parent and seen."""
    child = c
    for _ in range(NOVEL_TRIES):
        levels = [0, *c.levels, space.top]  # the first and last factor's bounds at the ends
        for i in range(1, len(levels) - 1):
            if rng.random() < rate:
                levels[i] = int(rng.integers(levels[i - 1], levels[i + 1] + 1))
        k = space.starts.index(c.start) if c.start in space.starts else 0
        if rng.random() < rate:
            k = min(len(space.starts) - 1, max(0, k + (1 if rng.random() < 0.5 else -1)))
        child = Candidate(tuple(levels[1:-1]), space.starts[k])
        if child != c and child not in seen:
            break
    return child


def crossover(a: Candidate, b: Candidate, rng: np.random.Generator, tries: int, seen=()) -> Candidate | None:
    """Each factor from a or b with even odds, start_tokens from one of them, drawn up to tries times until the child is
    monotone and new; None if none was (the caller mutates instead)."""
    if a == b:
        return None
    for _ in range(tries):
        pick = rng.random(len(a.levels)) < 0.5
        levels = tuple(int(y if p else x) for x, y, p in zip(a.levels, b.levels, pick, strict=True))
        child = Candidate(levels, b.start if rng.random() < 0.5 else a.start)
        if monotone(child) and child not in (a, b) and child not in seen:
            return child
    return None


def select(population: list[Candidate], fitness, k: int) -> list[Candidate]:
    """The k fittest (lowest NLL) distinct candidates."""
    return sorted(dict.fromkeys(population), key=fitness)[:k]


def evolve(seeds: list[Candidate], fitness, space: Space, s, rng: np.random.Generator) -> dict:
    """Algorithm 1: the seeds and their mutants, then s.generations of selection, mutation and crossover (fitness once
    per distinct candidate). Returns the best, its fitness, and the best at the start and per generation."""
    cache: dict[Candidate, float] = {}

    def fit(c: Candidate) -> float:
        if c not in cache:
            cache[c] = float(fitness(c))
        return cache[c]

    population = list(dict.fromkeys(seeds))
    for i in range(NOVEL_TRIES * s.population):  # bounded: a tiny space may hold fewer distinct candidates
        if len(population) >= s.population:
            break
        child = mutate(seeds[i % len(seeds)], space, rng, s.mutation_rate, population)
        if child not in population:
            population.append(child)
    history = [min(fit(c) for c in population)]
    for _ in range(s.generations):
        parents = select(population, fit, s.parents)
        children = []
        for _ in range(s.mutations):
            parent = parents[int(rng.integers(len(parents)))]
            children.append(mutate(parent, space, rng, s.mutation_rate, cache))
        for _ in range(s.crossovers):
            i, j = sorted(rng.choice(len(parents), 2, replace=False)) if len(parents) > 1 else (0, 0)
            child = crossover(parents[i], parents[j], rng, s.crossover_tries, cache)
            children.append(child or mutate(parents[i], space, rng, s.mutation_rate, cache))
        population = parents + children
        history.append(fit(select(population, fit, 1)[0]))  # select scores the children
    best = select(population, fit, 1)[0]
    return {"best": best, "fitness": fit(best), "initial": history[0], "history": history, "scores": cache}


def measured(nll: float) -> dict:
    return {"nll": nll, "ppl": math.exp(nll)}


def search(cfg: DictConfig, rt) -> dict:
    model, ckpt = checkpoint.load_model(cfg.checkpoint, rt.device)
    pe, train_length, target, s = model.pe, ckpt["seq_len"], cfg.target_length, cfg.search
    built_in = ckpt["model_config"]["positional"].get("scaling", "none")
    if not pe.rotary:
        raise UserError(f"LongRoPE rescales rotary frequencies, and positional={pe.name} has none; pick a rope run")
    if built_in != "none":
        raise UserError(
            f"this model was fine-tuned with positional.scaling={built_in}, built into its frequencies; "
            f"LongRoPE would replace it, not compose with it: search on the run it was fine-tuned from"
        )
    factor = target / train_length
    top = (1.25 * factor if s.max_factor is None else s.max_factor) - 1.0
    space = Space(s.step, max(1, math.floor(top / s.step + 1e-9)), tuple(sorted({int(n) for n in s.start_tokens})))

    works = held_out_works(ckpt, cfg.eval.prepare)
    lengths = default_lengths(train_length) if cfg.eval.lengths is None else list(cfg.eval.lengths)
    spans = read_spans(scoring_pieces(works, max(lengths), cfg.eval.tokens), max(lengths))  # what the table reads
    windows = longrope.search_windows(works, target, s.windows, spans)
    docs = dict(works)
    regions = [Region(docs[w["work"]][w["start"] : w["start"] + w["tokens"] + 1], 0) for w in windows]

    def nll(variant=None) -> float:
        return score(model, regions, target, "nonoverlap", target, cfg.eval.batch_tokens, rt, variant).nll

    total = s.population + s.generations * (s.mutations + s.crossovers)
    bar = progress(None, f"longrope x{factor:g}", total=total, unit="cand")

    def fitness(c: Candidate) -> float:
        value = nll(Variant(Scaling("longrope", factor, train_length, rescale=space.factors(c), start_tokens=c.start)))
        bar.update(1)
        bar.set_postfix(ppl=f"{math.exp(value):.2f}")
        return value

    t0 = time.time()
    seeds = [space.snap(scheme_factors(pe, kind, factor, train_length), space.starts[0]) for kind in SEEDS]
    result = evolve(seeds, fitness, space, s, np.random.default_rng(s.seed))
    bar.close()
    return {
        "kind": "longrope",
        "factors": space.factors(result["best"]),
        "start_tokens": result["best"].start,
        "attn_scale": longrope_scale(factor, train_length),
        "target_length": target,
        "original_length": train_length,
        "factor": factor,
        "fitness": measured(result["fitness"]),
        "initial_best": measured(result["initial"]),
        # the seeds as snapped LongRoPE factors, with LongRoPE's scale
        "seeds": {kind: measured(result["scores"][c]) for kind, c in zip(SEEDS, seeds, strict=True)},
        "plain_rope": measured(nll()),
        "history_nll": result["history"],
        "evaluations": len(result["scores"]),
        "search": OmegaConf.to_container(s),
        "avoided": {"eval.lengths": lengths, "eval.tokens": cfg.eval.tokens},
        "windows": windows,
        "checkpoint": str(checkpoint.checkpoint_path(cfg.checkpoint)),
        "step": ckpt["step"],
        "device": str(rt.device),
        "seconds": round(time.time() - t0, 1),
    }


def run(cfg: DictConfig) -> Path:
    checks.preflight(cfg)  # every setting, the checkpoint, and target_length against its training length
    rt = runtime.setup(cfg.device, cfg.dtype, 0)
    record = search(cfg, rt)
    path = longrope.save(checkpoint.checkpoint_path(cfg.checkpoint).parent, record)
    show = lambda r: f"ppl {r['ppl']:.2f}"
    say(
        f"longrope x{record['factor']:g} at {record['target_length']} on {len(record['windows'])} windows "
        f"({record['evaluations']} candidates, {record['seconds']} s): best {show(record['fitness'])}, initial "
        f"population's best {show(record['initial_best'])}, plain RoPE {show(record['plain_rope'])}; "
        + ", ".join(f"{k} {show(v)}" for k, v in record["seeds"].items())
    )
    say(f"start_tokens {record['start_tokens']}, factors {[round(x, 2) for x in record['factors']]}")
    say(f"written {path}")
    return path


@hydra.main(version_base="1.3", config_path="../configs", config_name="longrope")
def main(cfg: DictConfig):
    cli(lambda: run(cfg))


if __name__ == "__main__":
    hydra_cli(main)
