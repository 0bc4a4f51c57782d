"""CoPE, stick-breaking and PaTH against their papers' formulas written out one query and key at a time, and what a
scheme that gives its own weights must keep: a cache's slot order, the mask, its refusals."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import random_model

import positional
from model.attention import dense_bias
from model.gpt import GPT, GPTConfig
from positional.base import key_order

H, D, T = 2, 4, 7


def plan_at(q_pos, k_pos):
    """What the schemes read of an attention plan: positions, and the keys' order (None for a full forward)."""
    return SimpleNamespace(q_pos=q_pos, k_pos=k_pos, key_order=key_order(q_pos, k_pos))


def inputs(seed=0, n_kv=H):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g)
    k = torch.randn(1, n_kv, T, D, generator=g)
    return q, k


def causal(T, window=None):
    pos = torch.arange(T)
    return pos, dense_bias(positional.build({"name": "nope"}, H, D, 8), pos, pos, True, H, window)


def cope_loop(q, k, e, max_count):
    """Golovneva et al. 2024, eq. 3-5: g = sigmoid(q.k), p_ij = sum_(t=j..i) g_it, e[p] interpolated, softmax."""
    out = torch.zeros(q.size(1), T, T)
    for h in range(q.size(1)):
        for i in range(T):
            z = [float(q[0, h, i] @ k[0, h, j]) / math.sqrt(D) for j in range(i + 1)]
            logits = []
            for j in range(i + 1):
                p = min(sum(1 / (1 + math.exp(-z[t])) for t in range(j, i + 1)), max_count)
                lo, hi = math.floor(p), min(math.floor(p) + 1, max_count)
                ep = (p - lo) * e[hi] + (1 - p + lo) * e[lo]
                logits.append(z[j] + float(q[0, h, i] @ ep) / math.sqrt(D))
            out[h, i, : i + 1] = torch.tensor(logits).softmax(0)
    return out


def stick_loop(q, k):
    """Tan et al. 2024: A_ij = beta_ij prod_(j<t<i) (1 - beta_it), beta = sigmoid(q.k), keys j < i."""
    out = torch.zeros(q.size(1), T, T)
    for h in range(q.size(1)):
        for i in range(T):
            beta = [1 / (1 + math.exp(-float(q[0, h, i] @ k[0, h, j]) / math.sqrt(D))) for j in range(i)]
            for j in range(i):
                out[h, i, j] = beta[j] * math.prod(1 - beta[t] for t in range(j + 1, i))
    return out


def path_loop(q, k, w, beta):
    """Yang et al. 2025: score_ij = q_i^T H_i ... H_(j+1) k_j / sqrt(d), H_t = I - beta_t w_t w_t^T, softmax."""
    out = torch.zeros(q.size(1), T, T)
    for h in range(q.size(1)):
        for i in range(T):
            s = []
            for j in range(i + 1):
                key = k[0, h, j].double()
                for t in range(j + 1, i + 1):  # H_(j+1) first, H_i last
                    ht = torch.eye(D, dtype=torch.float64) - beta[h, t] * torch.outer(w[h, t], w[h, t]).double()
                    key = ht @ key
                s.append(float(q[0, h, i].double() @ key) / math.sqrt(D))
            out[h, i, : i + 1] = torch.tensor(s).softmax(0)
    return out


def test_cope_matches_the_paper_written_out():
    q, k = inputs()
    pe = positional.build({"name": "cope", "max_count": 3}, H, D, 8)  # small: counts reach the clamp
    layer = pe.layer_module()
    torch.nn.init.normal_(layer.e)
    pos, bias = causal(T)
    got = pe.content_weights(q, k, bias, None, layer, plan_at(pos, pos))
    torch.testing.assert_close(got[0], cope_loop(q, k, layer.e.detach(), 3), atol=1e-5, rtol=1e-5)


def test_stickbreaking_matches_the_paper_written_out_and_leaves_the_rest():
    q, k = inputs(1)
    pe = positional.build({"name": "stickbreaking"}, H, D, 8)
    pos, bias = causal(T)
    got = pe.content_weights(q, k, bias, None, pe.layer_module(), plan_at(pos, pos))
    torch.testing.assert_close(got[0], stick_loop(q, k), atol=1e-6, rtol=1e-5)
    assert (got[0, :, 0] == 0).all()  # the first token sees no key before it
    assert (got.sum(-1) < 1).all()  # a stick always leaves some of itself


def test_path_matches_the_product_of_householder_matrices():
    q, k = inputs(2)
    pe = positional.build({"name": "path"}, H, D, 8)
    g = torch.Generator().manual_seed(3)
    w = torch.nn.functional.normalize(torch.randn(H, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(H, T, generator=g)
    state = torch.cat((w.permute(1, 0, 2).reshape(T, H * D), beta.t()), dim=-1).t()[None]  # (1, H(D+1), T)
    pos, bias = causal(T)
    got = pe.content_weights(q, k, bias, state, None, plan_at(pos, pos))
    torch.testing.assert_close(got[0], path_loop(q, k, w, beta), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["cope", "stickbreaking", "path"])
def test_keys_in_any_slot_order_weigh_as_in_order(name):
    """A cache hands keys over in slot order (a sink cache's ring): the weights follow each key wherever it sits."""
    model = random_model(name, n_layer=1)
    pe, layer = model.pe, model.blocks[0].attn.pe_layer
    g = torch.Generator().manual_seed(4)
    q, k, x = torch.randn(1, 4, T, 8, generator=g), torch.randn(1, 2, T, 8, generator=g), torch.randn(1, T, 32)
    state = layer(x)
    pos, bias = causal(T)
    want = pe.content_weights(q[:, :, -2:], k, bias[:, -2:], state, layer, plan_at(pos[-2:], pos))
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(5))
    shuffled = plan_at(pos[-2:], pos[perm])
    state_p = None if state is None else state[..., perm]
    got = pe.content_weights(q[:, :, -2:], k[:, :, perm], bias[:, -2:][..., perm], state_p, layer, shuffled)
    torch.testing.assert_close(got, want[..., perm])


@pytest.mark.parametrize("name", ["cope", "stickbreaking", "path"])
def test_a_window_hides_keys_from_the_weights(name):
    model = random_model(name, n_layer=2, window=3)
    idx = torch.randint(0, 97, (1, 12))
    logits = model(idx)
    changed = idx.clone()
    changed[0, 0] = (idx[0, 0] + 1) % 97  # token 0 sits outside the window of query 4 and later in every layer...
    # ...but two layers of a 3-key window reach 4 tokens back: from query 5 on, token 0 is out of reach
    assert torch.equal(model(changed)[0, 5:], logits[0, 5:])


@pytest.mark.parametrize("name", ["cope", "stickbreaking", "path"])
def test_weights_that_read_the_scores_refuse_a_sink_logit_and_flex(name):
    cfg = dict(vocab_size=11, n_layer=1, n_head=2, n_kv_head=2, d_model=8, positional={"name": name})
    with pytest.raises(ValueError, match="model.sink_logit=true"):
        GPT(GPTConfig(**cfg, sink_logit=True))
    with pytest.raises(ValueError, match="model.attn_backend=flex"):
        GPT(GPTConfig(**cfg, attn_backend="flex"))
