"""The CPU fast paths (fused q/k/v projection, in-place rotation, chunked softcap + cross-entropy) compute what the
plain formulas compute: logits, loss and every gradient, for every scheme, against a forward written out here."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import SCHEMES, assert_same_logits_and_grads, random_model

from model import fused as head
from model.attention import dense_bias


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def rotate_plain(x, pe, pos, key=False):
    """RoPE (and p-RoPE: zero frequencies), xPos, PoPE as their papers write them, FoPE as its release computes it."""
    inner = getattr(pe, "inner", pe)
    if inner.name == "fope":  # x C + rotate_half(x) S, C and S padded with ones past d_out and laid out twice
        angles = pos.float()[:, None] * inner.theta[None, :]
        ones = torch.ones(len(pos), x.size(-1) // 2 - inner.d_out)
        c = torch.cat((angles.cos() @ inner.cos_coef, ones), -1).repeat(1, 2)
        s = torch.cat((angles.sin() @ inner.sin_coef, ones), -1).repeat(1, 2)
        x1, x2 = x.chunk(2, dim=-1)
        return x * c + torch.cat((-x2, x1), dim=-1) * s
    if not inner.rotary:
        return x
    angles = pos.float()[:, None] * inner.inv_freq[None, :]
    if inner.name == "pope":  # [|x| cos phase, |x| sin phase]; the query's phase has the offset delta
        phase = angles - (0 if key else -inner.delta[:, None])
        return torch.cat((F.softplus(x) * phase.cos(), F.softplus(x) * phase.sin()), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if inner.name == "xpos":  # zeta^(n/scale_base) on queries, its inverse on keys
        zeta = (torch.arange(0, x.size(-1), 2) / x.size(-1) + 0.4) / 1.4
        decay = zeta[None, :] ** (pos.float()[:, None] / 512 * (-1 if key else 1))
        cos, sin = cos * decay, sin * decay
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def scores_plain(pe, attn, h, q, k, pos):
    """q_i . k_j / sqrt(d) (GQA heads already repeated), with Shaw's vectors added to the keys, q_i . (k_j +
    a_clip(i-j)), and FoX's log forget gates summed over the tokens l with j < l <= i, both written out in full."""
    scheme = getattr(pe, "inner", pe)
    if scheme.name == "shaw":
        a = scheme.a[(pos[:, None] - pos[None, :]).clamp(0, scheme.max_distance)]  # (T, T, Dh): test sizes only
        return torch.einsum("bhid,bhijd->bhij", q, k[:, :, None] + a) / math.sqrt(attn.head_dim)
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # PoPE too: its 2 x Dh wide q.k sums Dh terms
    if scheme.name == "fox":
        gate = attn.pe_layer
        log_f = torch.log(torch.sigmoid(h @ gate.weight.t() + gate.bias)).transpose(1, 2)  # (B, H, T)
        p_i, p_j, p_l = pos[:, None, None], pos[None, :, None], pos[None, None, :]
        between = ((p_j < p_l) & (p_l <= p_i)).float()  # [i, j, l]
        scores = scores + torch.einsum("ijl,bhl->bhij", between, log_f)
    return scores


def weights_plain(pe, attn, h, q, k, pos, bias):
    """The weights of the schemes that give them (CoPE, stick-breaking, PaTH) as their papers write them: CoPE's
    interpolated vectors e[p] added to the keys, stick-breaking's product over the keys between, PaTH's product of
    Householder-like matrices applied to each key; softmax(scores + bias) for every other scheme."""
    scheme = getattr(pe, "inner", pe)
    z = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)
    p_i, p_j, p_t = pos[:, None, None], pos[None, :, None], pos[None, None, :]
    if scheme.name == "cope":  # p_ij = sum over j <= t <= i of sigmoid(z_it); logits q_i . (k_j + e[p_ij])
        p = torch.einsum("ijt,bhit->bhij", ((p_j <= p_t) & (p_t <= p_i)).float(), torch.sigmoid(z))
        p = p.clamp(max=scheme.max_count)
        e, lo = attn.pe_layer.e, p.floor().long()
        vec = e[lo] * (1 - (p - lo))[..., None] + e[(lo + 1).clamp(max=scheme.max_count)] * (p - lo)[..., None]
        return (z + torch.einsum("bhid,bhijd->bhij", q, vec) / math.sqrt(attn.head_dim) + bias).softmax(-1)
    if scheme.name == "stickbreaking":  # beta_ij prod over j < t < i of (1 - beta_it), keys j < i
        between = ((p_j < p_t) & (p_t < p_i)).float()
        log_w = F.logsigmoid(z) + torch.einsum("ijt,bhit->bhij", between, F.logsigmoid(-z))
        return log_w.exp() * (pos[None, :] < pos[:, None])
    if scheme.name == "path":  # q_i^T H_i ... H_(j+1) k_j, H_t = I - beta_t w_t w_t^T
        layer, (B, H, T, Dh) = attn.pe_layer, q.shape
        w = F.normalize(layer.w(h).view(B, T, H, Dh), dim=-1).transpose(1, 2)
        beta = 2 * torch.sigmoid(layer.beta(h)).transpose(1, 2)
        rows = []
        for i in range(T):
            keys = k.clone()
            for t in range(1, i + 1):  # H_t acts on the keys before t: H_(j+1) first, H_i last
                before, w_t = keys[:, :, :t], w[:, :, t, None]  # (B, H, t, Dh), (B, H, 1, Dh)
                hk = before - beta[:, :, t, None, None] * w_t * (before @ w_t.transpose(-2, -1))
                keys = torch.cat((hk, keys[:, :, t:]), dim=2)
            rows.append(q[:, :, i : i + 1] @ keys.transpose(-2, -1))
        return (torch.cat(rows, dim=2) / math.sqrt(Dh) + bias).softmax(-1)
    return (scores_plain(pe, attn, h, q, k, pos) + bias).softmax(-1)


def plain_forward(model, idx, targets, reduction="mean"):
    """The model as written before the fast paths: separate projections, concatenated halves, full logits."""
    pe, cfg = model.pe, model.cfg
    B, T = idx.shape
    pos, x = torch.arange(T), model.wte(idx)
    if pe.n_prefix:
        x = torch.cat((pe.prefix().expand(B, -1, -1), x), dim=1)
        pos = torch.cat((torch.arange(-pe.n_prefix, 0), pos))
    x = pe.embed(x, pos)
    bias = dense_bias(pe, pos, pos, True, cfg.n_head)
    for block in model.blocks:
        a, h = block.attn, rms(x)
        q = rms(a.c_q(h).view(B, -1, cfg.n_head, cfg.head_dim).transpose(1, 2))
        k = rms(a.c_k(h).view(B, -1, cfg.n_kv_head, cfg.head_dim).transpose(1, 2))
        v = a.c_v(h).view(B, -1, cfg.n_kv_head, cfg.head_dim).transpose(1, 2)
        q, k = rotate_plain(q, pe, pos), rotate_plain(k, pe, pos, key=True)
        groups = cfg.n_head // cfg.n_kv_head
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        att = weights_plain(pe, a, h, q, k, pos, bias)
        out = att @ v
        if hasattr(a.pe_layer, "rest"):  # stick-breaking: what a row leaves goes to the head's vector
            out = out + (1 - att.sum(-1, keepdim=True)) * a.pe_layer.rest[:, None]
        x = x + a.c_proj(out.transpose(1, 2).reshape(B, -1, cfg.d_model))
        x = x + block.mlp.c_proj(F.relu(block.mlp.c_fc(rms(x))).square())
    logits = model.lm_head(rms(x[:, pe.n_prefix :]))
    logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1, reduction=reduction)


EPS = torch.finfo(torch.float32).eps


def assert_within_rounding(got, want, ulps: int = 64):
    """got equals want up to float32 rounding: two orders of summation differ by an error that grows with the largest
    value summed, not with each element's own, and differs with the instruction set (AVX2, AVX-512, none): the bound
    is ulps float32 steps of the largest |want|. Measured: at most 14 steps for every scheme, with AVX2 and without SIMD
    (ATEN_CPU_CAPABILITY=default), and the 1.6e-5 that an AVX-512 machine gave PoPE is 14 too."""
    worst = (got - want).abs().max().item()
    assert worst <= ulps * EPS * want.abs().max().item(), (
        f"{worst:.2e} off, {worst / want.abs().max().item() / EPS:.0f} steps"
    )


def grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", SCHEMES)
def test_model_equals_the_plain_formulas(name, monkeypatch):
    monkeypatch.setattr(head, "CHUNK_ROWS", 7)  # several chunks, the last one short
    model = random_model(name).train()
    g = torch.Generator().manual_seed(3)
    idx, targets = torch.randint(0, 97, (2, 2, 20), generator=g)
    targets[0, :5] = -1  # ignored positions (padding) change the mean's denominator
    want_logits, want_loss = plain_forward(model, idx, targets)
    want_grads = grads(model, want_loss)
    got_loss = model(idx, targets)
    got_grads = grads(model, got_loss)
    assert_within_rounding(model(idx), want_logits)
    assert torch.allclose(got_loss, want_loss, atol=1e-6, rtol=1e-6)
    assert want_grads.keys() == got_grads.keys()
    for n in want_grads:
        assert torch.allclose(got_grads[n], want_grads[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_head_equals_full_logits(reduction, monkeypatch):
    monkeypatch.setattr(head, "CHUNK_ROWS", 5)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (3, 7), generator=g)
    y[1, 2:6] = -1
    upstream = torch.rand(3, 7, generator=g)  # per-row weights: the backward must not assume them equal

    def run(fn):
        out = fn()
        (out * upstream).sum().backward() if reduction == "none" else out.backward()
        result = (out.detach(), x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        return result

    def plain():
        logits = 4.0 * torch.tanh(F.linear(x, w) / 4.0)
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction=reduction)
        return nll.view(y.shape) if reduction == "none" else nll

    for got, want in zip(run(lambda: head.head_loss(x, w, y, 4.0, reduction)), run(plain), strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("tables", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "heads_inner", "qkv_slice"])
def test_rotation_in_every_memory_layout(layout, tables, monkeypatch):
    """The in-place rotation lays cos and sin out in x's own memory order: its values and gradient equal the
    concatenated-halves formula for a contiguous (B, H, T, D) tensor, one stored (B, T, H, D) as the QK norm
    leaves it, and a strided slice of a fused q/k/v output (qk_norm=none), with an upstream gradient that is
    itself a broadcast; with the cos/sin tables laid out (large x) and without (a decoding step)."""
    from positional import rope
    from positional.rope import rotate_by

    monkeypatch.setattr(rope, "TABLE_MIN", 0 if tables else 1 << 30)  # the laid-out tables, or half by half

    B, H, T, D = 2, 3, 5, 8
    g = torch.Generator().manual_seed(0)
    base = {
        "contiguous": torch.randn(B, H, T, D, generator=g),
        "heads_inner": torch.randn(B, T, H, D, generator=g).transpose(1, 2),
        "qkv_slice": torch.randn(B, T, 3 * H, D, generator=g)[:, :, H : 2 * H].transpose(1, 2),
    }[layout]
    x = base.detach().requires_grad_()
    angles = torch.randn(T, D // 2, generator=g)
    upstream = torch.randn(H, T, D, generator=g).expand(B, H, T, D)  # stride 0 over the batch
    got = rotate_by(x, angles.cos(), angles.sin())
    (gx,) = torch.autograd.grad(got, x, upstream)
    x1, x2 = x.chunk(2, dim=-1)
    want = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()), dim=-1)
    (wx,) = torch.autograd.grad(want, x, upstream)
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(gx, wx, atol=1e-6)


def test_chunked_head_needs_no_grad_under_no_grad():
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True)
    with torch.no_grad():
        loss = head.head_loss(x, w, torch.randint(0, 11, (4,)), 15.0)
    assert not loss.requires_grad


def test_decoding_runs_under_inference_mode():
    """Rotation state lives in the attention plan: no cache on the module reads tensor versions, which
    inference_mode forbids."""
    model, idx = random_model("rope"), torch.randint(0, 97, (1, 12))
    want = model(idx)
    with torch.inference_mode():
        assert torch.allclose(model(idx), want, atol=1e-6)


@pytest.mark.parametrize("name", ["alibi", "t5", "sink"])
def test_diagonal_blocks_equal_one_dense_call(name):
    """A biased causal forward long enough to be split into query blocks gives the fp32 reference's logits and
    gradients."""
    from model.attention import make_plan

    idx = torch.randint(0, 97, (2, 150), generator=torch.Generator().manual_seed(0))
    spec = {"name": "sink", "inner": {"name": "alibi"}} if name == "sink" else None
    kw = {"positional": spec} if spec else {}
    blocked, reference = (
        random_model(name, attn_backend="sdpa", **kw),
        random_model(name, attn_backend="reference", **kw),
    )
    pos = torch.arange(150 + blocked.pe.n_prefix)
    assert len(make_plan(blocked.pe, pos, pos, True, 4, "sdpa").mask.blocks) > 2
    assert_same_logits_and_grads(blocked, reference, idx)


@pytest.mark.parametrize("name", ["rope", "alibi", "cope"])
def test_compiled_model_equals_eager(name):
    """torch.compile traces the plain formulas (fused.py, head.py, rope.py) and a scheme that reads the plan's key
    order (made on first use, which must not take a lock compile cannot trace): one graph, no eager fallback, the
    same loss and gradients."""
    torch._dynamo.reset()
    model = random_model(name).train()
    idx, targets = torch.randint(0, 97, (2, 2, 16), generator=torch.Generator().manual_seed(5))
    want = grads(model, model(idx, targets))
    compiled = torch.compile(model, fullgraph=True)  # a graph break or recompile-limit fallback raises
    got = grads(model, compiled(idx, targets))
    for n in want:
        assert torch.allclose(got[n], want[n], atol=1e-5, rtol=1e-4), n
    torch._dynamo.reset()


def test_compile_setting(monkeypatch, capsys):
    from utils import runtime as compiling
    from utils.errors import UserError

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compiling.should_compile("auto", cuda) and not compiling.should_compile(False, cuda)
    assert not compiling.should_compile("auto", cpu)
    assert "eager on the CPU" in capsys.readouterr().out  # said, not silent
    monkeypatch.setattr(compiling, "cxx_compiler", lambda: None)
    with pytest.raises(UserError, match="C\\+\\+ compiler"):
        compiling.should_compile(True, cpu)
