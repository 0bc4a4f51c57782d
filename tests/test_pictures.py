"""The pictures of viz.py: their numbers against each scheme's formula, and every scheme drawn without error.

python -m pytest -q tests/test_pictures.py
The references are written out here from the papers' formulas (DESIGN.md's reference facts), not read from the
schemes' code, so a picture that drew something else than the scheme computes fails.
"""

import math

import numpy as np
import pytest
import torch
from conftest import ROOT, SCHEMES, random_model, run, scheme_spec
from hydra import compose, initialize_config_dir

import positional
from gallery import draw as gallery
from gallery.numbers import (
    bias_by_distance,
    content_bias_by_distance,
    mean_query_key,
    position_vectors,
    random_decay,
    rotary_logits,
    similarity_by_offset,
)
from model.gpt import GPT, GPTConfig, norm
from utils.errors import UserError


def build(spec, n_head=4, head_dim=16):
    return positional.build(spec, n_head, head_dim, n_head * head_dim)


def test_sinusoidal_vectors_and_their_similarity_follow_the_formula():
    pe = build({"name": "sinusoidal", "scale": 0.1})
    v = position_vectors(pe, 64).numpy()
    p, i = np.arange(64)[:, None], np.arange(0, 64, 2)[None, :]
    w = 10000.0 ** (-i / 64)
    assert np.allclose(v[:, 0::2], 0.1 * np.sin(p * w), atol=1e-5)  # PE(p, 2i) = sin(p / base^(2i/d))
    assert np.allclose(v[:, 1::2], 0.1 * np.cos(p * w), atol=1e-5)
    # PE(p) . PE(p + k) = scale^2 sum_i cos(k w_i) at every p, and |PE(p)|^2 = scale^2 d/2
    k = np.arange(64)[:, None]
    assert np.allclose(similarity_by_offset(torch.from_numpy(v), "dot"), 0.01 * np.cos(k * w).sum(1), atol=1e-5)
    assert np.allclose(similarity_by_offset(torch.from_numpy(v)), np.cos(k * w).mean(1), atol=1e-5)


def test_learned_vectors_are_the_table_and_stop_at_its_end():
    pe = build({"name": "learned", "max_positions": 40})
    v = position_vectors(pe, 100)
    assert v.shape == (40, 64) and torch.equal(v, pe.table.weight.detach())
    for name in ("alibi", "rope", "nope", "t5"):  # nothing added to the embeddings: no vector picture
        assert position_vectors(build(scheme_spec(name)), 10) is None


@pytest.mark.parametrize("n_head", [4, 12])
def test_alibi_picture_has_the_models_slopes(n_head):
    pe = random_model("alibi", n_head=n_head, n_kv_head=n_head, d_model=8 * n_head).pe
    d = torch.arange(50)
    bias = bias_by_distance(pe, d)
    c = 2 ** math.floor(math.log2(n_head))  # Press et al.: 2^(-8k/c), then every other slope of the 2c sequence
    slopes = [2 ** (-8 * k / c) for k in range(1, c + 1)] + [2 ** (-8 * k / (2 * c)) for k in range(1, 2 * c, 2)]
    slopes = torch.tensor(slopes[:n_head])
    assert torch.allclose(bias, -slopes[:, None] * d, atol=1e-5)
    assert torch.allclose(bias[:, 1] - bias[:, 0], -pe.slopes)  # the picture's slope is the model's
    if n_head == 12:
        assert torch.allclose(slopes[-4:], torch.tensor([0.7071, 0.3536, 0.1768, 0.0884]), atol=1e-4)
    sink = build({"name": "sink", "inner": {"name": "alibi"}}, n_head=n_head)
    assert torch.equal(bias_by_distance(sink, d), bias)  # a sink over ALiBi keeps ALiBi's bias


def t5_reference_bucket(n: int) -> int:
    """T5's decoder bucket, 32 buckets, max distance 128: exact below 16, then log-spaced, capped at 31."""
    return n if n < 16 else min(31, 16 + math.floor(math.log(n / 16) / math.log(128 / 16) * 16))


def test_t5_picture_reads_each_distances_bucket():
    pe = build({"name": "t5"})
    with torch.no_grad():  # a different value in every (bucket, head): the picture shows which bucket it read
        pe.table.copy_(torch.arange(32.0)[:, None] + 100 * torch.arange(4.0)[None, :])
    bias = bias_by_distance(pe, torch.arange(400))
    want = torch.tensor([[t5_reference_bucket(n) + 100 * h for n in range(400)] for h in range(4)])
    assert torch.equal(bias, want.float())


def test_kerple_and_fire_pictures_follow_their_formulas():
    torch.manual_seed(0)
    d = torch.arange(300)
    pe = build({"name": "kerple"})
    with torch.no_grad():
        pe.r1_raw.normal_(), pe.r2_raw.normal_()
    r1, r2 = torch.nn.functional.softplus(pe.r1_raw)[:, None], torch.nn.functional.softplus(pe.r2_raw)[:, None]
    assert torch.allclose(bias_by_distance(pe, d), -r1 * torch.log(1 + r2 * d), atol=1e-5)

    pe = build({"name": "fire", "hidden": 3, "threshold": 64.0})
    with torch.no_grad():
        for p in pe.parameters():
            p.normal_(0, 0.5)
    c, L = pe.log_c.exp().item(), pe.log_threshold.exp().item()
    w1, b1, w2, b2 = (t.detach().numpy() for t in (pe.w1, pe.b1, pe.w2, pe.b2))

    def fire(query: int, dist: np.ndarray) -> np.ndarray:  # f_h(log(c d + 1) / log(c max(i, L) + 1)), per head
        x = np.log1p(c * dist) / np.log1p(c * max(query, L))
        return b2[:, None] + (w2[:, :, None] * np.maximum(w1[:, :, None] * x + b1[:, :, None], 0)).sum(1)

    assert np.allclose(bias_by_distance(pe, d), fire(299, d.numpy()), atol=1e-4)
    assert np.allclose(bias_by_distance(pe, d[:50], 49), fire(49, d[:50].numpy()), atol=1e-4)


def rope_reference(q, k, d, inv_freq, decay=None):
    """(R(P) q) . (R(P - d) k) / sqrt(Dh) from the complex form: pairs (x_i, x_{i + Dh/2}) as x_i + i x_{i + Dh/2},
    the score Re(z_q conj(z_k) e^{i d theta}) per pair; xPos multiplies pair i by decay_i^d."""
    h = q.shape[-1] // 2
    q1, q2, k1, k2 = q[..., :h, None], q[..., h:, None], k[..., :h, None], k[..., h:, None]
    phi = inv_freq[:, None] * d[None, :]
    pair = (q1 * k1 + q2 * k2) * np.cos(phi) - (q2 * k1 - q1 * k2) * np.sin(phi)
    if decay is not None:
        pair = pair * decay[:, None] ** d[None, :]
    return pair.sum(-2) / math.sqrt(2 * h)


def test_rotary_logits_follow_the_rotation_formula():
    torch.manual_seed(0)
    q, k, d = torch.randn(3, 4, 16), torch.randn(3, 4, 16), torch.arange(40)
    theta = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    got = rotary_logits(build({"name": "rope"}), q, k, d)
    assert np.allclose(got, rope_reference(q.double().numpy(), k.double().numpy(), d.numpy(), theta), atol=1e-4)
    # xPos: pair i decays by zeta_i^(d / scale_base), zeta_i = (2i/Dh + gamma) / (1 + gamma)
    zeta = (np.arange(0, 16, 2) / 16 + 0.4) / 1.4
    got = rotary_logits(build({"name": "xpos", "scale_base": 8.0}), q, k, d)
    want = rope_reference(q.double().numpy(), k.double().numpy(), d.numpy(), theta, zeta ** (1 / 8))
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
    # PoPE: sum_c softplus(q_c) softplus(k_c) cos(d theta_c + delta_hc) / sqrt(Dh), theta_c = base^(-c/Dh)
    pe = build({"name": "pope"})
    with torch.no_grad():
        pe.delta.normal_()
    theta_c, delta = 10000.0 ** (-np.arange(16) / 16), pe.delta.detach().double().numpy()
    sp = lambda x: np.log1p(np.exp(x.double().numpy()))
    phase = theta_c[None, :, None] * d.numpy()[None, None, :] + delta[:, :, None]  # (H, Dh, D)
    want = (sp(q)[..., None] * sp(k)[..., None] * np.cos(phase)).sum(-2) / math.sqrt(16)
    assert np.allclose(rotary_logits(pe, q, k, d), want, rtol=1e-4, atol=1e-4)


def test_random_decay_and_each_scaling_variant():
    L, s, d = 16, 4, torch.arange(64)  # the query at 63: a forward of 64 = s x L tokens
    pe = build({"name": "rope"}, head_dim=8)
    curves = random_decay(pe, d, s, L, samples=2000)
    theta = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    # E over q ~ N(0, I) of q . R(d) q / sqrt(Dh) = sum_i 2 cos(d theta_i) / sqrt(Dh): RoPE's long-term decay
    assert np.allclose(curves["none"], 2 * np.cos(np.outer(d, theta)).sum(1) / math.sqrt(8), atol=0.08)  # 5 sd
    assert torch.allclose(curves["linear"][::s], curves["none"][: len(d) // s], atol=1e-5)  # positions / s
    ntk = build({"name": "rope", "base": 10000.0 * s ** (8 / 6)}, head_dim=8)  # base' = base s^(d/(d-2))
    assert torch.allclose(curves["ntk"], random_decay(ntk, d, s, L, samples=2000)["none"], atol=1e-5)
    assert torch.allclose(curves["dynamic_ntk"], curves["ntk"], atol=1e-5)  # s from the length: 64 / 16
    assert torch.allclose(curves["yarn"][0], curves["none"][0] * (0.1 * math.log(s) + 1) ** 2)  # logits scaled


def test_trained_mean_query_key_and_content_bias():
    idx = torch.randint(0, 97, (2, 24))
    for name in ("rope", "sink"):  # sink: its learned token is not text, and is left out
        model = random_model(name)
        q, k = mean_query_key(model, idx)[0]
        q0, k0, _ = model.blocks[0].attn.project(norm(model.wte(idx)))
        assert torch.allclose(q, q0.mean((0, 2)), atol=1e-5)
        assert torch.allclose(k, k0.repeat_interleave(2, 1).mean((0, 2)), atol=1e-5)
    # FoX at init: every forget gate log f = -m_h, so the bias of every key d back is -m_h d, ALiBi's
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, positional={"name": "fox"}))
    bias = content_bias_by_distance(model.eval(), idx)
    slopes = torch.tensor([2 ** (-8 * k / 4) for k in range(1, 5)])
    assert bias.shape == (2, 4, 24)
    assert torch.allclose(bias, (-slopes[:, None] * torch.arange(24.0)).expand(2, 4, 24), atol=1e-4)
    assert content_bias_by_distance(random_model("alibi"), idx) is None


def expected_pictures(pe, trained: bool) -> set[str]:
    want = {"attention"} if trained else set()
    if pe.name in ("learned", "sinusoidal", "sinusoidal2d", "sinusoidal3d"):  # the last two at text positions (p, p)
        want.add("vectors")
    if pe.rotary:
        want |= {"decay", "decay_trained"} if trained else {"decay"}
    if pe.score_bias is not None:
        want.add("bias")
    if pe.content_bias is not None and trained:
        want.add("content_bias")
    return want


@pytest.mark.parametrize("trained", [False, True], ids=["init", "trained"])
def test_every_scheme_has_each_pictures_numbers_or_a_reason(trained):
    """Every scheme through every picture's numbers (drawing them all would take a second a figure)."""
    options, tokens = gallery.Options(factor=2, samples=2), torch.randint(0, 97, (64,))
    for name in SCHEMES:
        model = random_model(name, n_layer=1)
        s = gallery.Subject(name, model.pe, 16, "test", model if trained else None, tokens if trained else None)
        got = {picture: numbers_of(s, options) for picture, (numbers_of, _, _) in gallery.PICTURES.items()}
        assert {p for p, n in got.items() if not isinstance(n, str)} == expected_pictures(model.pe, trained), name
        assert all(n != "" for n in got.values() if isinstance(n, str)), name  # a skip says why
        assert all(torch.isfinite(t).all() for n in got.values() for t in tensors_in(n)), name


def tensors_in(numbers) -> list[torch.Tensor]:
    """The tensors in a picture's numbers (tuples, lists and dicts of them; attention's lists of floats)."""
    if isinstance(numbers, torch.Tensor):
        return [numbers]
    if isinstance(numbers, dict):
        numbers = list(numbers.values())
    if isinstance(numbers, list | tuple):
        if numbers and isinstance(numbers[0], float):
            return [torch.tensor(numbers)]
        return [t for item in numbers for t in tensors_in(item)]
    return []  # a skip's reason, or no second curve


def test_each_picture_is_drawn_and_listed(tmp_path):
    """The pictures a checkpoint does not draw in test_viz_draws_a_checkpoint: vectors, a bias whose query position
    matters (FIRE: dashed lines), a content bias; and the index of them all."""
    options, tokens = gallery.Options(factor=2, samples=2, heads=[[0, 0]]), torch.randint(0, 97, (64,))
    fire = random_model("fire", n_layer=1, positional={"name": "fire", "hidden": 2, "threshold": 8.0})
    fox = random_model("fox", n_layer=1)
    subjects = [
        gallery.Subject("sinusoidal", random_model("sinusoidal").pe, 16, "at init"),
        gallery.Subject("fire", fire.pe, 16, "at init"),
        gallery.Subject("fox", fox.pe, 16, "trained", fox, tokens),
    ]
    entries = []
    for s in subjects:
        rows = gallery.draw(s, options, tmp_path)
        assert all(bool(file) != bool(why) for _, file, why in rows)  # each picture drawn, or skipped with why
        entries.append((s.label, s.state, s.pe.name, rows))
    assert gallery.bias_numbers(subjects[1], options)[2] is not None  # FIRE's near query: its own curve
    alibi = gallery.Subject("alibi", random_model("alibi").pe, 16, "at init")
    assert gallery.bias_numbers(alibi, options)[2] is None  # ALiBi's is the far query's: no second curve
    names = {p.name for p in tmp_path.glob("*.png")}
    assert names == {"sinusoidal_vectors.png", "fire_bias.png", "fox_content_bias.png", "fox_attention.png"}
    assert all((tmp_path / n).stat().st_size > 5000 for n in names)
    index = gallery.write_index(tmp_path, "test", entries).read_text()
    assert "![fire bias](fire_bias.png)" in index
    assert "- vectors: skipped, fire adds no vector to the token embeddings" in index
    again = gallery.write_index(tmp_path, "again", entries[:1]).read_text()  # a later run of one scheme
    assert "![fire bias](fire_bias.png)" in again and again.count("## sinusoidal") == 1  # the others stay listed
    assert "Written by `again`" in again and "Written by `test`" in again


def viz_config(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("viz", overrides=list(overrides))


def test_viz_draws_a_checkpoint(tiny_checkpoint, tmp_path):
    import viz

    overrides = [f"checkpoint={tiny_checkpoint}", f"viz.out={tmp_path}", "viz.factor=2", "viz.samples=2"]
    index = viz.run(viz_config(*overrides, "viz.heads=[[1,3]]"))
    names = {p.name for p in tmp_path.glob("*.png")}
    label = tiny_checkpoint.name
    assert names == {f"{label}_{p}.png" for p in ("decay", "decay_trained", "attention")}
    assert "trained:" in index.read_text() and "bias: skipped" in index.read_text()
    with pytest.raises(UserError, match=r"viz.heads has \[5,0\]"):
        viz.run(viz_config(f"checkpoint={tiny_checkpoint}", "viz.heads=[[5,0]]"))


@pytest.mark.parametrize(
    "overrides, key",
    [(["viz.factor=1"], "viz.factor"), (["viz.heads=[[1]]"], "viz.heads"), (["viz.all=true", "checkpoint=x"], "all")],
)
def test_bad_options_are_one_line_errors(overrides, key):
    import viz

    with pytest.raises(UserError, match=key):
        viz.run(viz_config(*overrides))


def test_a_missing_checkpoint_or_sweep_is_one_line():
    import viz

    with pytest.raises(UserError, match="no checkpoint at /no/such/run"):
        viz.run(viz_config("checkpoint=/no/such/run"))
    with pytest.raises(UserError, match="sweep_dir=/no/such/sweep"):
        viz.run(viz_config("sweep_dir=/no/such/sweep"))


def test_an_unknown_scheme_exits_2_with_one_line():
    proc = run("viz.py", "positional=xyz", timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "positional" in lines[0] and "xyz" in lines[0], lines[0]


def test_a_per_layer_scheme_draws_its_p_layers(tmp_path):
    """positional=irope (rope with positional.layers=PPPN) draws RoPE's pictures under the label rope-PPPN."""
    proc = run("viz.py", "positional=irope", f"viz.out={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rope-PPPN_decay.png").exists()


def test_viz_all_builds_every_scheme_at_its_defaults():
    """viz.all=true draws every scheme at init: each one's options at their defaults, under its own name, build."""
    import viz

    cfg = viz_config("viz.all=true")
    for name in positional.names():
        spec = viz.scheme_spec(name, cfg)
        assert spec["name"] == name
        assert viz.init_subject(spec, cfg).pe.name == name
