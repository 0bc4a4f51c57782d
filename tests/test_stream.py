"""KV caches, the StreamingLLM sink cache, sampling and sample.py."""

import json
import math

import pytest
import torch
from conftest import ABSOLUTE, RELATIVE, TINY, config, layer_outputs_from_probs, random_model, run

import evaluation.sink_mass as sink_mass
import model.attention as attention
from evaluation.attention_map import pick_heads, plot_attention_maps
from evaluation.sink_mass import SINK_THRESHOLD, first_token_attention, sink_shares
from model.kv_cache import CacheError, DenseCache, SinkCache, build_cache, cache_sizes, sample_next
from model.static_decode import StaticDecoder
from train import train

S, W = 3, 8  # sinks, window


def tokens(n, seed=1):
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def feed(model, cache, idx):
    return torch.cat([model.decode(idx[:, t : t + 1], cache) for t in range(idx.size(1))], dim=1)


@pytest.mark.parametrize("name", RELATIVE)
def test_sink_cache_equals_dense_while_it_fits(name):
    model, idx = random_model(name), tokens(S + W)
    dense = feed(model, DenseCache(model, 1, 64), idx)
    sink = feed(model, SinkCache(model, 1, S + model.pe.n_prefix, W), idx)
    if name == "pope":  # keys expanded at read: softplus over the window rounds its last bit unlike over one key
        assert torch.allclose(dense, sink, atol=1e-5)
    else:
        assert torch.equal(dense, sink)
    chunked = model.decode(idx, SinkCache(model, 1, S, W + model.pe.n_prefix))  # prefill in one step
    assert torch.allclose(dense, chunked, atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "alibi", "nope", "fire", "fox", "shaw", "cope", "stickbreaking", "path"])
def test_one_layer_reindexing_is_exact(name):
    """Past capacity, a one-layer model's next-token logits equal a fresh forward over the first S tokens and
    the last W tokens at positions 0..S+W-1: its cached keys depend on their own token alone. FIRE's normaliser
    reads the query's in-cache position, not its place in the stream, and FoX's keys fade by the gates of the kept
    tokens only (positional/fire.py, fox.py): the other choice of either would fail here."""
    model = random_model(name, n_layer=1)
    idx = tokens(40)
    cache = SinkCache(model, 1, S, W)
    logits = feed(model, cache, idx)[:, -1]
    kept = torch.cat((idx[:, :S], idx[:, -W:]), dim=1)
    assert torch.allclose(logits, model(kept)[:, -1], atol=1e-5)
    assert cache.token_indices().tolist() == list(range(S)) + sorted(range(40 - W, 40), key=lambda t: (t - S) % W)


def written_slot(model, cache, token):
    """Decode one token; return the one slot whose contents changed (found by looking, not by ring arithmetic)."""
    before = cache.v[-1].clone()
    model.decode(token, cache)
    changed = (cache.v[-1] != before).flatten(0, 1).any(0).any(-1).nonzero().flatten().tolist()
    assert len(changed) == 1
    return changed[0]


@pytest.mark.parametrize("name", ["rope", "alibi", "nope"])
def test_deep_model_attends_over_exactly_the_cached_keys_at_in_cache_positions(name, monkeypatch):
    """Deeper models: each layer's attention equals a reference over exactly the cached keys and values, at
    in-cache positions worked out here from the order the slots were written in (sinks first, then the window
    oldest to newest), not from the cache's own ring arithmetic."""
    model = random_model(name, n_layer=3)
    idx = tokens(29)
    cache = SinkCache(model, 1, S, W)
    written = {written_slot(model, cache, idx[:, t : t + 1]): t for t in range(28)}
    seen, real_attend = [], attention.attend

    def spy(q, k, v, plan, *options, **named):
        seen.append((q, k, v, plan))
        return real_attend(q, k, v, plan, *options, **named)

    monkeypatch.setattr("model.gpt.attend", spy)
    written[written_slot(model, cache, idx[:, 28:])] = 28
    window = sorted((slot for slot in written if slot >= S), key=written.get)
    assert sorted(written) == list(range(S + W)) and [written[s] for s in range(S)] == list(range(S))
    in_cache = torch.empty(S + W, dtype=torch.long)
    in_cache[:S] = torch.arange(S)
    in_cache[window] = S + torch.arange(W)
    for layer, (q, k, v, plan) in enumerate(seen):
        assert plan.q_pos.tolist() == [S + W - 1] and plan.k_pos.tolist() == in_cache.tolist()
        raw_k, raw_v = cache.k[layer], cache.v[layer]  # what the cache holds: keys before rotation
        assert torch.equal(v, raw_v)
        bias = attention.dense_bias(model.pe, torch.tensor([S + W - 1]), in_cache, False, 4)
        want = attention.reference_attention(q, model.pe.rotate(raw_k, in_cache), raw_v, bias)
        assert torch.allclose(real_attend(q, k, v, plan), want, atol=1e-5)


def twin_caches(model, kind):
    make = (
        (lambda: DenseCache(model, 1, 24 + model.pe.n_prefix))
        if kind == "dense"
        else (lambda: SinkCache(model, 1, S, W))
    )
    return make(), make()


@pytest.mark.parametrize(
    ("name", "kind"), [(n, "dense") for n in RELATIVE + ABSOLUTE] + [(n, "sink") for n in RELATIVE]
)
def test_static_decoding_equals_eager_decoding(name, kind):
    """Attending over every slot, with empty slots masked, gives the eager cache's logits; a sink cache is
    followed well past its capacity, where every step re-indexes the window."""
    model = random_model(name)
    eager, static = twin_caches(model, kind)
    prompt, steps = tokens(5), tokens(19 if kind == "dense" else 30, seed=3)
    assert torch.equal(model.decode(prompt, eager), model.decode(prompt, static))
    decoder = StaticDecoder(model, static, compile=False)
    for t in range(steps.size(1)):
        want = model.decode(steps[:, t : t + 1], eager)[:, -1]
        assert torch.allclose(decoder(steps[:, t : t + 1]), want, atol=1e-5), t
    if kind == "dense":
        with pytest.raises(CacheError, match="use cache=sink"):
            decoder(steps[:, :1])


def test_compiled_static_decoding_compiles_once():
    """The compiled step (inductor on this CPU; CUDA graphs on a GPU) matches eager decoding and never recompiles
    as the cache fills, wraps around and re-indexes."""
    torch._dynamo.reset()
    model = random_model("rope")
    eager, static = twin_caches(model, "sink")
    model.decode(tokens(5), eager), model.decode(tokens(5), static)
    decoder = StaticDecoder(model, static, compile=True)
    steps = tokens(2 * (S + W), seed=4)
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        for t in range(steps.size(1)):
            want = model.decode(steps[:, t : t + 1], eager)[:, -1]
            assert torch.allclose(decoder(steps[:, t : t + 1]), want, atol=1e-4), t


def test_sink_cache_memory_is_constant_once_full():
    model = random_model("rope")
    cache = SinkCache(model, 1, S, W)
    feed(model, cache, tokens(S + W))
    size, ptr, sinks = cache.nbytes(), cache.k.data_ptr(), cache.k[:, :, :, :S].clone()
    feed(model, cache, tokens(3 * (S + W), seed=2))
    assert cache.nbytes() == size and cache.k.data_ptr() == ptr and cache.length == S + W
    assert torch.equal(cache.k[:, :, :, :S], sinks)  # the sinks are never overwritten
    assert cache.seen == 4 * (S + W)


def test_dense_cache_stops_at_its_capacity():
    model = random_model("rope")
    cache = DenseCache(model, 1, 10)
    feed(model, cache, tokens(10))
    with pytest.raises(CacheError, match="use cache=sink"):
        model.decode(tokens(1), cache)


@pytest.mark.parametrize("name", ABSOLUTE)
def test_absolute_schemes_refuse_the_sink_cache(name):
    with pytest.raises(CacheError, match="needs a relative scheme"):
        SinkCache(random_model(name), 1, S, W)


def test_cache_defaults_match_the_training_context():
    rope, sink, learned = random_model("rope"), random_model("sink"), random_model("learned")  # a 256-row table
    for model, kind, length, want in (
        (rope, "sink", 256, {"sinks": 4, "window": 252, "capacity": 256}),
        (sink, "sink", 256, {"sinks": 1, "window": 256, "capacity": 257}),
        (learned, "dense", 64, {"capacity": 256}),
        (rope, "dense", 64, {"capacity": 1024}),
    ):
        sizes = cache_sizes(model, kind, length)
        cache = build_cache(model, kind, 1, sizes)
        assert sizes == want and cache.capacity == want["capacity"]
        assert all(getattr(cache, k) == v for k, v in want.items())


def test_greedy_and_top_k_sampling():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0, 2.8]])
    assert sample_next(logits, temperature=0).item() == 1
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, top_k=2, generator=g).item() for _ in range(300)}
    assert draws == {1, 2}
    every = {sample_next(logits, 5.0, generator=g).item() for _ in range(500)}
    assert every == {0, 1, 2, 3, 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shakespeare_dir):
    out = tmp_path_factory.mktemp("runs")
    for name in ("rope", "learned", "sink"):
        train(config(*TINY, f"positional={name}", "train.max_steps=15", "train.warmup_steps=3"), out / name)
    return out


SAMPLE = ["device=cpu", "max_new_tokens=40", "temperature=0.8"]


def test_same_seed_same_text(runs):
    a = run("sample.py", f"checkpoint={runs / 'rope'}", "prompt=ROMEO.", "seed=3", *SAMPLE, check=True)
    b = run("sample.py", f"checkpoint={runs / 'rope'}", "prompt=ROMEO.", "seed=3", *SAMPLE, check=True)
    c = run("sample.py", f"checkpoint={runs / 'rope'}", "prompt=ROMEO.", "seed=4", *SAMPLE, check=True)
    text = a.stdout.rsplit("\n", 2)[0]
    assert text.startswith("ROMEO.") and text == b.stdout.rsplit("\n", 2)[0] != c.stdout.rsplit("\n", 2)[0]
    assert "tokens/s" in a.stdout.splitlines()[-1] and "peak memory" in a.stdout.splitlines()[-1]


def test_static_sampling_gives_the_same_text(runs):
    """sample.py static=true (the compiled step) writes what eager decoding writes, past a sink cache's capacity."""
    args = (f"checkpoint={runs / 'rope'}", "prompt=ROMEO.", "device=cpu", "max_new_tokens=80", "temperature=0",
            "cache=sink")  # fmt: skip
    eager = run("sample.py", *args, "static=false", check=True).stdout.rsplit("\n", 2)[0]
    static = run("sample.py", *args, "static=true", check=True).stdout.rsplit("\n", 2)[0]
    assert eager == static and len(eager) > 80


def test_sink_cache_streams_past_the_training_length(runs, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("KING.\n" * 30)  # a prompt longer than the cache: prefilled through it
    for name in ("rope", "sink"):
        proc = run("sample.py", f"checkpoint={runs / name}", f"prompt=@{prompt}", "cache=sink", "cache.window=20",
                   "device=cpu", "max_new_tokens=120", check=True)  # fmt: skip
        assert "120 tokens in" in proc.stdout.splitlines()[-1] and "cache=sink holding" in proc.stdout


def test_dense_cache_past_a_learned_table_says_use_sink(runs):
    proc = run("sample.py", f"checkpoint={runs / 'learned'}", "device=cpu", "max_new_tokens=100", check=True)
    assert "use cache=sink" in proc.stderr and "covers 32 positions" in proc.stderr
    proc = run("sample.py", f"checkpoint={runs / 'learned'}", "device=cpu", "cache=sink")
    assert proc.returncode == 2 and "needs a relative scheme" in proc.stderr
    proc = run("sample.py", f"checkpoint={runs / 'rope'}", "device=cpu", "max_new_tokens=-1")
    assert proc.returncode == 2 and "use cache=sink" in proc.stderr
    proc = run("sample.py", f"checkpoint={runs / 'rope'}", "device=cpu", "static=auto")
    assert proc.returncode == 2 and "must be true or false" in proc.stderr


def stream_eval(runs, name, *overrides):
    proc = run("eval.py", f"checkpoint={runs / name}", "eval.mode=stream", "eval.stream_tokens=400", "eval.block=50",
               "logger.wandb=false", "device=cpu", *overrides, check=True)  # fmt: skip
    return proc, json.loads((runs / name / "eval" / "stream.json").read_text())


def test_streaming_perplexity_report(runs):
    proc, result = stream_eval(runs, "rope")
    assert list(result["methods"]) == ["dense", "window 0+32", "sinks 1+31", "sinks 4+28", "recompute 32"]
    for m in result["methods"].values():
        assert m["tokens"] == 400 and len(m["nll"]) == 8 and all(math.isfinite(x) for x in m["nll"])
        assert len(m["ci"]) == 8 and all(lo < math.exp(x) < hi for x, (lo, hi) in zip(m["nll"], m["ci"], strict=True))
        assert m["mean"]["ci"][0] < m["mean"]["ppl"] < m["mean"]["ci"][1]
    # the stream holds every held-out play (one spelling of each), an equal share of each
    assert [p["work"] for p in result["works"]] == ["coriolanus_gut", "hamlet_gut", "othello_gut", "richard_iii_gut"]
    assert sorted(p["tokens"] for p in result["works"]) == [100, 100, 100, 101]  # 401: the last target too
    assert len(result["pairs"]) == 10 and "within noise of each other" in proc.stdout
    assert (runs / "rope" / "eval" / "stream.png").exists() and "tokens seen" in proc.stdout
    assert "tok/s" not in proc.stderr  # no progress bar where stderr is not a terminal
    sink = result["first_token_attention"]
    assert len(sink["mean"]) == 2 and all(0 <= m <= h <= 1 for m, h in zip(sink["mean"], sink["max_head"], strict=True))
    # the sink-head shares, per layer and overall, agree with the per-head means stored beside them
    assert [len(h) for h in sink["heads"]] == [4, 4] and sink["threshold"] == SINK_THRESHOLD and sink["window"] == 32
    assert sink["sink_share"] == [sum(m > 0.3 for m in h) / 4 for h in sink["heads"]]
    assert sink["sink_share_all"] == sum(sink["sink_share"]) / 2 and sink["first_token"] == "the stream's first token"
    assert "sink heads (mean attention on the stream's first token > 0.3" in proc.stdout
    picture = runs / "rope" / "eval" / "sink_attention.png"
    assert picture.stat().st_size > 10_000 and "sink_attention.png" in proc.stdout


def test_streaming_a_learned_sink_keeps_it_in_every_sinks_row(runs):
    """positional=sink: W counts the learned sink; 1 + (W - 1) keeps exactly it, and the sink measure reads it."""
    proc, result = stream_eval(runs, "sink", "cache.sinks=2")
    assert list(result["methods"]) == ["dense", "window 0+33", "sinks 1+32", "sinks 2+31", "sinks 4+29", "recompute 33"]
    assert all(m["tokens"] == 400 and m["note"] is None for m in result["methods"].values())
    assert result["first_token_attention"]["first_token"] == "the learned sink token"
    assert len(result["first_token_attention"]["sink_share"]) == 2 and "the learned sink token > 0.3" in proc.stdout


def test_absolute_scheme_streams_dense_and_says_why_not_the_rest(runs):
    _, result = stream_eval(runs, "learned", "eval.stream_tokens=100")
    assert list(result["methods"]) == ["dense", "window 0+32", "sinks 1+31", "sinks 4+28", "recompute 32"]
    refused = [(m["note"] or "").startswith("n/a: cache=sink needs a relative") for m in result["methods"].values()]
    assert refused == [False, True, True, True, False]


@pytest.mark.parametrize("name", ["rope", "alibi", "sink", "learned", "shaw", "fox", "cope", "path"])
def test_attention_probs_reproduce_each_layers_output(name):
    """The probabilities the sink diagnostic reads are the ones the model uses: probs @ V through c_proj gives
    each attention layer's output, rows sum to one and no query sees a later key."""
    model, idx = random_model(name), tokens(12)
    for p, y, out in layer_outputs_from_probs(model, idx):
        assert torch.allclose(y, out, atol=1e-5)
        assert torch.allclose(p.sum(-1), torch.ones(()), atol=1e-6) and p.triu(1).abs().max() == 0


def test_uniform_attention_has_no_sink():
    """Zero queries make every score equal: the first token then gets exactly the uniform share."""
    model = random_model("nope")
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.c_q.weight)
    sink = first_token_attention(model, tokens(200)[0], window=16, n_windows=4)
    assert sink["mean"] == [sink["uniform"]] * 2 and sink["uniform"] == round(sum(1 / n for n in range(9, 17)) / 8, 4)
    assert sink["sink_share"] == [0.0, 0.0] and sink["sink_share_all"] == 0.0 and "nothing_heads" not in sink


def test_windows_can_open_with_the_streams_first_token(monkeypatch):
    """first=: every window's first token is replaced (the BOS a 1 + (W - 1) cache keeps), the rest is left."""
    seen = []
    monkeypatch.setattr(sink_mass, "rows_first_token_attention", lambda model, rows: seen.append(rows) or {})
    stream = tokens(200)[0]
    first_token_attention(random_model("nope"), stream, window=16, n_windows=4, first=96)
    rows = seen[0]
    assert (rows[:, 0] == 96).all() and torch.equal(rows[0, 1:], stream[1:16])
    assert torch.equal(rows[-1, 1:], stream[-15:])


def test_the_nothing_slot_takes_what_its_logit_says():
    """Zero queries make every score 0, so with sink logit s a query that sees n keys gives exp(s) / (exp(s) + n)
    to nothing: the reported share is its mean over the second half's queries, and a head above 0.3 is counted."""
    model = random_model("nope", sink_logit=True)
    logits = torch.tensor([0.0, 1.0, 1.5, 4.0])
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.c_q.weight)
        block.attn.sink.data.copy_(logits)
    sink = first_token_attention(model, tokens(200)[0], window=16, n_windows=4)
    n = torch.arange(9, 17, dtype=torch.float)  # the keys each second-half query sees
    want = [round(float((s.exp() / (s.exp() + n)).mean()), 4) for s in logits]
    assert sink["nothing_heads"] == [want, want] and sink["nothing_max_head"] == [want[3]] * 2
    assert want[2] < SINK_THRESHOLD < want[3] and sink["nothing_share"] == [0.25, 0.25]
    # what is not spent on nothing is spread evenly: the first token gets 1 / (exp(s) + n) of each query
    first = [round(float((1 / (s.exp() + n)).mean()), 4) for s in logits]
    assert sink["heads"] == [first, first]


def test_the_nothing_slots_cost_is_the_loss_without_it():
    """nothing_cost: the loss of the same model with every sink logit at -inf less its own loss; the model keeps its
    logits afterwards, and a model whose slot takes nothing already (logits -inf) loses nothing."""
    model, idx = random_model("rope", sink_logit=True), tokens(33)
    kept = [block.attn.sink.detach().clone() for block in model.blocks]
    cost = sink_mass.nothing_cost(model, idx[:, :-1], idx[:, 1:])
    assert all(torch.equal(block.attn.sink, k) for block, k in zip(model.blocks, kept, strict=True))
    without = random_model("rope", sink_logit=True)
    with torch.no_grad():
        for block in without.blocks:
            block.attn.sink.fill_(float("-inf"))
        want = (without(idx[:, :-1], idx[:, 1:]) - model(idx[:, :-1], idx[:, 1:])).item()
    assert cost == pytest.approx(want, abs=1e-6) and abs(cost) > 1e-3
    assert sink_mass.nothing_cost(without, idx[:, :-1], idx[:, 1:]) == 0.0


def test_sink_share_counts_heads_above_the_threshold():
    """Gu et al.'s count: strictly above 0.3, per layer and over every head."""
    shares = sink_shares([[0.9, 0.31, 0.3, 0.01], [0.05, 0.05, 0.05, 0.05], [0.5, 0.0]])
    assert shares == {"sink_share": [0.5, 0.0, 0.5], "sink_share_all": 0.3}


def test_a_head_that_parks_on_the_first_token_is_counted(monkeypatch):
    """Attention set by hand: one head of layer 0 puts half of every query's attention on key 0, every other head
    attends uniformly; only that head is a sink head, and its mean is read from the second half's queries."""
    T = 16

    def probs(model, idx):
        uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
        sinky = torch.cat((torch.full((T, 1), 0.5), uniform[:, 1:] * 0.5 / uniform[:, 1:].sum(-1, keepdim=True)), -1)
        sinky[0] = uniform[0]  # the first query sees key 0 only (and divided 0 by 0 above)
        layer0 = torch.stack([uniform, sinky, uniform, uniform])[None].expand(len(idx), -1, -1, -1)
        return [layer0, torch.stack([uniform] * 4)[None].expand(len(idx), -1, -1, -1)]

    monkeypatch.setattr(sink_mass, "attention_probs", probs)
    sink = first_token_attention(random_model("nope"), tokens(200)[0], window=T, n_windows=4)
    assert sink["heads"][0][1] == 0.5 and sink["heads"][0][0] == sink["uniform"] < SINK_THRESHOLD
    assert sink["sink_share"] == [0.25, 0.0] and sink["sink_share_all"] == 0.125 and sink["max_head"][0] == 0.5


def test_attention_picture_shows_the_first_and_last_layer_and_the_strongest_heads(tmp_path):
    per_head = [[0.1, 0.2, 0.0, 0.0], [0.9, 0.8, 0.7, 0.6], [0.05, 0.0, 0.01, 0.0]]
    assert pick_heads(per_head) == [(0, 1), (1, 0), (1, 1), (2, 0)]
    model = random_model("sink", n_layer=3)
    heads = plot_attention_maps(model, tokens(100)[0], 16, per_head, tmp_path / "sink_attention.png")
    assert heads == [(0, 1), (1, 0), (1, 1), (2, 0)] and (tmp_path / "sink_attention.png").stat().st_size > 10_000


@pytest.mark.parametrize("name", ["sink", "rope"])
def test_static_decoding_from_an_empty_cache(name):
    """Decoding from the first token on (as decode_bench --static does) keeps the learned sink token first."""
    model = random_model(name)
    eager, static = twin_caches(model, "sink")
    decoder = StaticDecoder(model, static, compile=False)
    steps = tokens(2 * (S + W), seed=6)
    for t in range(steps.size(1)):
        want = model.decode(steps[:, t : t + 1], eager)[:, -1]
        assert torch.allclose(decoder(steps[:, t : t + 1]), want, atol=1e-5), t


def test_a_last_partial_block_is_labelled_at_the_stream_s_end():
    """eval.stream_tokens need not be a multiple of eval.block: the last block ends at the stream's end."""
    from evaluation.stream import stream_table

    method = {"nll": [1.0, 1.0], "mean": {"ppl": 2.7, "ci": [2.6, 2.8]}}
    result = {"scheme": "rope", "block": 256, "stream_tokens": 300, "train_length": 64, "methods": {"dense": method}}
    rows = [line.split()[0] for line in stream_table(result).splitlines()[2:4]]
    assert rows == ["256", "300"]
