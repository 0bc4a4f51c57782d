"""Dual Chunk Attention (positional/dca.py): its positions as the paper draws them, exact against a brute force, in
every backend and cache.

python -m pytest -q tests/test_dca.py
The brute force scores each (query, key) pair at the distance DCA gives it, the query's position for the chunks between
them minus the key's in its chunk, q_i rotated by that distance against an unrotated k_j, in float64: it shares no
code with the rotations it checks.
"""

import math

import pytest
import torch
from conftest import assert_decoding_equals_full_forward, assert_sink_cache_reindexes, random_model
from hydra import compose, initialize_config_dir

from evaluation import length, variants
from model.gpt import norm
from model.variant import Variant
from positional import dca
from positional.rope_scaling import Scaling
from utils import runtime
from utils.errors import UserError

S, W, TRAIN = 20, 6, 32  # chunk size, local window (chunks of 14 tokens), training length
T = 80  # > 64: the sdpa path goes by query blocks along the diagonal; five chunks


def scaled(name="rope", chunk=S, local=W, **kw):
    """A random model of `name` and DCA at factor 4 from TRAIN tokens."""
    return random_model(name, **kw), Variant(Scaling("dca", 4.0, TRAIN, chunk=chunk, window=local))


def tokens(n=T, batch=2, seed=0):
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


def distances(n: int, chunk: int, local: int) -> torch.Tensor:
    """(n, n) float64: the distance each (query, key) score uses, from the paper's three cases, entry by entry."""
    c = chunk - local
    d = torch.empty(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            gap = i // c - j // c
            q = i % c if gap <= 0 else min(i % c + c, chunk) if gap == 1 else min(2 * c - 1, chunk)
            d[i, j] = q - j % c if j <= i else -1
    return d


def brute_force_logits(model, idx, chunk, local):
    dist = distances(idx.size(1), chunk, local)
    x = model.wte(idx).double()
    for block in model.blocks:
        attn = block.attn
        q, key, v = (t.double() for t in attn.project(norm(x.float())))
        groups = attn.n_head // attn.n_kv_head
        key, v = key.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        dh = q.size(-1)
        angle = dist[..., None] * 10000.0 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
        q1, q2 = (half[:, :, :, None] for half in q.chunk(2, dim=-1))
        k1, k2 = (half[:, :, None] for half in key.chunk(2, dim=-1))
        scores = ((q1 * angle.cos() - q2 * angle.sin()) * k1 + (q1 * angle.sin() + q2 * angle.cos()) * k2).sum(-1)
        scores = (scores / math.sqrt(dh)).masked_fill(dist < 0, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(*x.shape[:2], -1)
        x = x + y @ attn.c_proj.weight.double().T
        x = x + block.mlp(norm(x.float())).double()
    return model._head(x.float())


def test_positions_are_the_papers():
    """The paper's Fig. 2 (chunk size s = 6, pretraining length 10, local window 4): successive-chunk queries at
    [6, 7, 8, 9, 9, 9], inter-chunk ones at 9, keys at their place in their chunk; the released code's S = 9, w = 3."""
    split = dca.Chunks(chunk=9, local=3)
    second = torch.arange(6, 12)
    assert split.queries(second)[0].tolist() == [6, 7, 8, 9, 9, 9]
    assert split.queries(second)[1].tolist() == [9] * 6
    assert split.keys(torch.arange(12))[0].tolist() == [0, 1, 2, 3, 4, 5] * 2
    assert split.select(torch.tensor([13]), torch.tensor([0, 5, 6, 11, 12, 13])).tolist() == [2, 2, 1, 1, 0, 0]
    assert dca.sizes(4096) == (3072, 512)  # the released defaults: S = 3L/4, w = L/8


def test_no_distance_passes_the_chunk_size():
    """Every score of 200 tokens uses a distance in 0..S, and within a chunk RoPE's own."""
    d = distances(200, S, W)
    seen = d[d >= 0]
    assert seen.max() == S and seen.min() == 0
    c = S - W
    same = torch.arange(200)[:, None] // c == torch.arange(200)[None, :] // c
    assert torch.equal(
        d[same & (d >= 0)], (torch.arange(200)[:, None] - torch.arange(200)[None, :]).double()[same & (d >= 0)]
    )


def test_within_one_chunk_it_is_rope():
    """Rows no longer than a chunk (c = 14) are RoPE exactly; longer ones are not."""
    plain, idx = random_model("rope"), tokens(S - W)
    with torch.no_grad():
        model, variant = scaled()
        assert torch.allclose(model(idx, variant=variant), plain(idx), atol=1e-5)
        assert not torch.allclose(model(tokens(), variant=variant), plain(tokens()), atol=1e-2)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_logits_equal_the_brute_force(backend):
    idx = tokens()
    model, variant = scaled(attn_backend=backend)
    with torch.no_grad():
        got, want = model(idx, variant=variant), brute_force_logits(model, idx, S, W)
    assert torch.allclose(got, want.float(), atol=2e-4), (got - want).abs().max()


@pytest.mark.parametrize("options", ["", "sink_logit", "window"])
def test_backends_agree(options):
    """sdpa (query blocks), the fp32 reference and flex (eager on the CPU: a call per part, merged by log-sum-exp),
    with the nothing slot or a window."""
    kw = {"sink_logit": True} if options == "sink_logit" else {}
    kw = {"window": 40, "window_pattern": "SL"} if options == "window" else kw
    idx = tokens(128)
    with torch.no_grad():
        out = {
            b: (lambda m, v: m(idx, variant=v))(*scaled(attn_backend=b, **kw)) for b in ("sdpa", "reference", "flex")
        }
    assert torch.allclose(out["sdpa"], out["reference"], atol=1e-4)
    assert torch.allclose(out["flex"], out["reference"], atol=1e-4)


@pytest.mark.parametrize("name", ["rope", "rope-window", "rope-nope", "sink", "pope", "xpos"])
def test_kv_cache_decoding_equals_the_full_forward(name):
    """Token by token, in chunks and by the static step, through the dense cache (each key's three rotations side by
    side; with model.window=24, in the window layers' rings too, where the static step keeps none; with
    positional.layers=NP, a NoPE window layer's unsplit keys in a ring as wide as the split's)."""
    name, _, option = name.partition("-")
    kw = {"window": 24, "window_pattern": "SL"} if option else {}
    if option == "nope":
        kw["positional"] = {"name": name, "layers": "NP"}
    model, variant = scaled(name, **kw)
    assert model.cfg.window == kw.get("window")
    assert_decoding_equals_full_forward(model, tokens(40), static=not option, variant=variant)  # static: no rings


def test_sink_cache_rotates_at_in_cache_positions():
    """Past its capacity the sink cache re-indexes what it keeps, and its chunks follow: in a one-layer model the last
    token's logits are a full forward over the kept tokens at positions 0..capacity-1."""
    (model, variant), idx = scaled(n_layer=1), tokens(50, batch=1)
    assert_sink_cache_reindexes(model, idx, variant)


def test_bad_sizes_and_schemes_are_refused():
    """w >= S and a scheme without rotations are refused, naming the setting (config rules: tests/test_errors.py)."""
    with pytest.raises(ValueError, match="w=20 and chunk size S=20"):
        Scaling("dca", 4.0, TRAIN, chunk=20, window=20)
    assert not dca.fits(None, 24, TRAIN) and dca.fits(None, None, TRAIN) and dca.fits(30, 24, TRAIN)
    with pytest.raises(UserError, match="eval.rope_scaling=dca"):
        variants.resolve_variants("dca", random_model("alibi").pe)


def test_eval_scores_dca_rows(tiny_checkpoint):
    """eval.rope_scaling=dca rows carry S and w (defaults 3/4 and 1/8 of the training length 32: 24 and 4) and score
    past the training length with every distance within it, the rows eval.dca=true adds beside `none` to the digit;
    the model is left as trained after."""
    import eval as entry

    rt = runtime.setup("cpu", "fp32", 0)
    with initialize_config_dir(config_dir=str(entry.Path(entry.__file__).parent / "configs"), version_base="1.3"):
        cfg = compose("eval", ["eval.tokens=256", "eval.lengths=[16,128]", "device=cpu", "logger.wandb=false"])
    calls = []
    for kind, beside in (("none", False), ("dca", False), ("none", True)):
        cfg.eval.rope_scaling, cfg.eval.dca = kind, beside
        results = length.evaluate_lengths(tiny_checkpoint, cfg, rt)["results"]
        calls.append({(r["variant"], r["length"], r["mode"]): r for r in results})
    plain, alone, both = calls
    chunked = alone["dca", 128, "nonoverlap"]
    assert (chunked["chunk"], chunked["window"]) == (24, 4) and math.isfinite(chunked["ppl"])
    assert alone["dca", 16, "nonoverlap"]["ppl"] == pytest.approx(plain["none", 16, "nonoverlap"]["ppl"], rel=1e-5)
    assert chunked["ppl"] != pytest.approx(plain["none", 128, "nonoverlap"]["ppl"], rel=1e-5)
    assert set(both) == set(plain) | set(alone)
    assert all(both[k]["ppl"] == alone[k]["ppl"] for k in alone)
    assert all(both[k]["ppl"] == plain[k]["ppl"] for k in plain)
