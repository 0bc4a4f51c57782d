"""model.qk_norm, model.sink_logit and model.attn_gate: each changes what it should and nothing else, in every
attention backend, decoding path and diagnostic."""

import pytest
import torch
from conftest import (
    assert_decoding_equals_full_forward,
    assert_same_logits_and_grads,
    checkpoint_state,
    layer_outputs_from_probs,
    random_model,
)

from evaluation.sink_mass import attention_probs
from model.attention import attend, make_plan, reference_attention
from model.fused import rms_norm
from model.gpt import GPT, GPTConfig
from model.kv_cache import DenseCache, SinkCache
from model.static_decode import StaticDecoder
from utils import checkpoint, optim

SMALL = dict(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32)


def tokens(length=24, batch=2, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def twin(model, **changes) -> GPT:
    """A model with model's weights and its config changed; parameters it lacks keep their init (gains 1, sink
    logits 0), parameters it no longer has are dropped."""
    cfg = {**model.cfg.__dict__, **changes}
    other = GPT(GPTConfig(**cfg)).eval()
    missing, unexpected = other.load_state_dict(model.state_dict(), strict=False)
    assert all(k.endswith(("_gain", ".sink")) for k in missing + unexpected), (missing, unexpected)
    return other


# ---- qk_norm ----------------------------------------------------------------------------------------------------

# logits of random_model(name) on tokens() as main computed them before model.qk_norm existed
BEFORE = {
    "rope": ([-2.1917879581, -1.2423120737, 0.6867024899, -1.0259400606], 10535.160593),
    "alibi": ([-2.0029699802, 0.2338306457, -0.2666921020, 1.5265132189], 10414.042566),
}


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_qk_norm_rms_is_the_model_as_it_was(name):
    model = random_model(name)
    assert model.cfg.qk_norm == "rms" and not model.cfg.sink_logit
    assert not [n for n, _ in model.named_parameters() if n.endswith(("_gain", ".sink"))]  # same checkpoint keys
    logits = model(tokens())
    first, total = BEFORE[name]
    assert torch.allclose(logits[0, -1, :4], torch.tensor(first), atol=1e-5)
    assert logits.double().abs().sum().item() == pytest.approx(total, rel=1e-6)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_learned_gains_start_as_rms_and_learn(name):
    rms = random_model(name)
    learned = twin(rms, qk_norm="learned")
    idx, targets = tokens(), tokens(seed=2)
    assert torch.equal(learned(idx), rms(idx))  # gains of one: step 0 is qk_norm=rms exactly
    learned.train()
    learned(idx, targets).backward()
    for block in learned.blocks:
        attn = block.attn
        assert attn.q_gain.shape == (4, 8) and attn.k_gain.shape == (2, 8)  # per head (GQA: per key head)
        assert attn.q_gain.grad.abs().min() > 0 and attn.k_gain.grad.abs().min() > 0
    with torch.no_grad():
        learned.blocks[0].attn.q_gain[1].mul_(3.0)  # one head made sharper: only that head's scores change
    assert not torch.allclose(learned(idx), rms(idx), atol=1e-3)


def test_qk_norm_changes_only_queries_and_keys():
    rms = random_model("rope")
    learned, none = twin(rms, qk_norm="learned"), twin(rms, qk_norm="none")
    with torch.no_grad():
        learned.blocks[0].attn.q_gain.normal_()
        learned.blocks[0].attn.k_gain.normal_()
    x = torch.randn(2, 5, 32)
    raw_q, raw_k, raw_v = none.blocks[0].attn.project(x)
    q, k, v = rms.blocks[0].attn.project(x)
    assert torch.equal(v, raw_v) and torch.equal(q, rms_norm(raw_q)) and torch.equal(k, rms_norm(raw_k))
    gq, gk, gv = learned.blocks[0].attn.project(x)
    a = learned.blocks[0].attn
    assert (
        torch.equal(gv, raw_v)
        and torch.allclose(gq, q * a.q_gain[:, None])
        and torch.allclose(gk, k * a.k_gain[:, None])
    )
    assert raw_q.norm(dim=-1).std() > 0.1  # unnormalised: the norm is the projection's own
    idx = tokens()
    assert not torch.allclose(none(idx), rms(idx), atol=1e-3)


def test_learned_gains_keep_bf16_attention_in_bf16():
    model = random_model("rope", qk_norm="learned")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, _ = model.blocks[0].attn.project(torch.randn(1, 4, 32))
        assert q.dtype == k.dtype == torch.bfloat16
        assert model(tokens()).isfinite().all()


@pytest.mark.parametrize("opt", ["adamw", "muon"])
def test_gains_and_sink_logits_are_optimized_without_weight_decay(opt):
    model = random_model("rope", qk_norm="learned", sink_logit=True)
    cfg = {"name": opt, "lr": 1e-2, "adam_lr": 1e-2, "momentum": 0.95, "betas": [0.9, 0.95], "weight_decay": 0.1}
    opts = optim.build(model, cfg)
    groups = [(type(o).__name__, g["weight_decay"], {id(p) for p in g["params"]}) for o in opts for g in o.param_groups]
    extra = [p for n, p in model.named_parameters() if n.endswith(("_gain", ".sink"))]
    assert len(extra) == 3 * 2
    for p in extra:
        assert [(kind, wd) for kind, wd, ids in groups if id(p) in ids] == [("AdamW", 0.0)]
    every = [i for _, _, ids in groups for i in ids]
    assert sorted(every) == sorted(id(p) for p in model.parameters())  # each parameter in exactly one group
    if opt == "muon":
        assert all(p.dim() == 2 for p in opts[0].param_groups[0]["params"])


def test_default_param_groups_are_unchanged():
    model = random_model("t5")
    matrices, head, rest = optim.param_groups(model)

    def ids(params):
        return [id(p) for p in params]

    assert ids(matrices) == ids(p for p in model.blocks.parameters() if p.dim() == 2)  # the order checkpoints hold
    assert ids(head) == ids([model.lm_head.weight]) and ids(rest) == ids([model.pe.table, model.wte.weight])


# ---- sink logit -------------------------------------------------------------------------------------------------

SCHEMES = ["rope", "alibi", "t5", "sink", "learned", "nope"]


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_sink_logit_backends_agree_with_the_fp32_reference(name, backend):
    ref = random_model(name, attn_backend="reference", sink_logit=True)
    other = random_model(name, attn_backend=backend, sink_logit=True)
    idx = tokens()
    with torch.no_grad():  # flex: its forward, run eagerly (the CPU has no flex backward)
        assert torch.allclose(ref(idx), other(idx), atol=2e-4)
    if backend == "sdpa":
        y = tokens(seed=5)
        g_ref = torch.autograd.grad(ref(idx, y), list(ref.parameters()))
        g_sdpa = torch.autograd.grad(other(idx, y), list(other.parameters()))
        names = [n for n, _ in ref.named_parameters()]
        for n, a, b in zip(names, g_ref, g_sdpa, strict=True):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3), n
        assert g_sdpa[names.index("blocks.0.attn.sink")].abs().min() > 0  # the sink logits learn


@pytest.mark.parametrize("name", ["rope", "alibi", "pope"])
def test_sink_logit_on_the_diagonal_blocks(name):
    """A causal forward long enough for query blocks along the diagonal: logits and gradients as the reference
    (PoPE: keys twice as wide as the values, which the nothing slot's zero value must not take)."""
    blocked = random_model(name, attn_backend="sdpa", sink_logit=True)
    reference = random_model(name, attn_backend="reference", sink_logit=True)
    idx = tokens(150)
    pos = torch.arange(150)
    assert len(make_plan(blocked.pe, pos, pos, True, 4, "sdpa", sink=True).mask.blocks) > 2
    assert_same_logits_and_grads(blocked, reference, idx)


@pytest.mark.parametrize("causal", [True, False])
def test_flex_lse_rescale_equals_the_reference(causal):
    """The flex branch's formula, out * sigmoid(lse - s), against the reference softmax with the nothing slot in
    its denominator, with GQA, a score bias and queries at later positions than the first key (a chunked prefill)."""
    model = random_model("alibi")
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 9, 8, generator=g),
        torch.randn(2, 2, 14, 8, generator=g),
        torch.randn(2, 2, 14, 8, generator=g),
    )
    sink = torch.tensor([-2.0, 0.0, 1.5, 4.0])
    q_pos, k_pos = torch.arange(5, 14), torch.arange(14)
    flex = make_plan(model.pe, q_pos, k_pos, causal, 4, "flex", sink=True)
    ref = make_plan(model.pe, q_pos, k_pos, causal, 4, "reference", sink=True)
    want = reference_attention(q, k, v, ref.mask.bias, sink)
    assert torch.allclose(attend(q, k, v, flex, sink), want, atol=1e-5)
    assert torch.allclose(
        attend(q, k, v, make_plan(model.pe, q_pos, k_pos, causal, 4, "sdpa", sink=True), sink), want, atol=1e-5
    )


def test_sink_logit_limits():
    """s_h -> -inf is the model without it; a large s_h sends the mass to nothing and shrinks attention's output."""
    plain = random_model("rope")
    sinky = twin(plain, sink_logit=True)
    idx = tokens()
    with torch.no_grad():
        for block in sinky.blocks:
            block.attn.sink.fill_(-1e4)
    assert torch.allclose(sinky(idx), plain(idx), atol=1e-5)  # SDPA with a mask, not is_causal: rounding apart
    seen = []  # the first layer's attention output (its input does not depend on the sink logits)
    sinky.blocks[0].attn.register_forward_hook(lambda m, a, out: seen.append(out.norm()))
    for s in (0.0, 5.0, 20.0):
        with torch.no_grad():
            for block in sinky.blocks:
                block.attn.sink.fill_(s)
            sinky(idx)
    at_0, at_5, at_20 = seen
    assert at_20 < 1e-3 * at_0 and at_5 < 0.5 * at_0


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "sink", "learned"])
def test_sink_logit_kv_cache_decoding_equals_full_forward(name):
    model, idx = random_model(name, sink_logit=True), tokens()
    full = model(idx)
    step = DenseCache(model, 2, 64)
    one_by_one = torch.cat([model.decode(idx[:, t : t + 1], step) for t in range(24)], dim=1)
    chunked = DenseCache(model, 2, 64)
    pieces = torch.cat([model.decode(idx[:, :10], chunked), model.decode(idx[:, 10:], chunked)], dim=1)
    assert torch.allclose(full, one_by_one, atol=1e-4) and torch.allclose(full, pieces, atol=1e-4)


@pytest.mark.parametrize("name", ["rope", "alibi", "sink"])
def test_sink_logit_sink_cache_and_static_decoding(name):
    """The sink cache equals dense decoding while it holds everything; the static step equals eager decoding,
    past the sink cache's capacity too."""
    model, idx = random_model(name, sink_logit=True), tokens(11, batch=1)
    dense_cache, sink_cache = DenseCache(model, 1, 64), SinkCache(model, 1, 3 + model.pe.n_prefix, 8)
    dense = torch.cat([model.decode(idx[:, t : t + 1], dense_cache) for t in range(11)], dim=1)
    sink = torch.cat([model.decode(idx[:, t : t + 1], sink_cache) for t in range(11)], dim=1)
    assert torch.equal(dense, sink)
    eager, static = SinkCache(model, 1, 3, 8), SinkCache(model, 1, 3, 8)
    prompt, steps = tokens(5, batch=1), tokens(25, batch=1, seed=3)
    assert torch.equal(model.decode(prompt, eager), model.decode(prompt, static))
    decoder = StaticDecoder(model, static, compile=False)
    for t in range(steps.size(1)):
        want = model.decode(steps[:, t : t + 1], eager)[:, -1]
        assert torch.allclose(decoder(steps[:, t : t + 1]), want, atol=1e-5), t


def test_sink_mass_counts_the_nothing_slot():
    """The diagnostic's probabilities are the ones the model uses (probs @ V through c_proj gives each layer's
    output); each row sums to one less the nothing slot's share, and the slot only scales a row: renormalised, a
    row is the softmax without the slot."""
    model, idx = random_model("rope", sink_logit=True), tokens(12)
    layers = layer_outputs_from_probs(model, idx)
    probs = [p for p, _, _ in layers]
    for p, y, out in layers:
        assert torch.allclose(y, out, atol=1e-5)
        assert (p.sum(-1) < 1).all() and p.sum(-1).min() < 0.9  # the first query: one key against the slot
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sink.fill_(-1e4)
    p, without = probs[0], attention_probs(model, idx)[0]  # the first layer: its input is the same
    assert torch.allclose(p / p.sum(-1, keepdim=True), without, atol=1e-6)


# ---- attention output gate --------------------------------------------------------------------------------------


def test_attn_gate_is_each_heads_output_times_sigmoid_of_the_normed_input():
    """Qiu et al. 2025's headwise gate at their G1 position: Y' = Y * sigmoid(X W), X the block's normed input, Y a
    head's attention output, before the output projection. Recomposed in float64 from the probabilities the sink
    probe reads; a gate of all zeros halves every head's output."""
    model, idx = random_model("rope", attn_gate=True), tokens(12)
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out))) for b in model.blocks]
    try:
        probs = attention_probs(model, idx)
    finally:
        for h in hooks:
            h.remove()
    for attn, p, (x, out) in zip([b.attn for b in model.blocks], probs, seen, strict=True):
        B, T, _ = x.shape
        x = x.double()
        v = (x @ attn.c_v.weight.double().T).view(B, T, attn.n_kv_head, -1).transpose(1, 2)
        y = p.double() @ v.repeat_interleave(attn.n_head // attn.n_kv_head, 1)  # (B, H, T, Dh)
        gate = torch.sigmoid(x @ attn.gate.weight.double().T)  # (B, T, H)
        want = (y * gate.transpose(1, 2)[..., None]).transpose(1, 2).reshape(B, T, -1) @ attn.c_proj.weight.double().T
        assert torch.allclose(out.double(), want, atol=1e-5 * want.abs().max().item())
    plain = GPT(GPTConfig(**{**model.cfg.__dict__, "attn_gate": False})).eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and unexpected == [f"blocks.{i}.attn.gate.weight" for i in range(2)]  # one (H, D) matrix each
    with torch.no_grad():
        for block in model.blocks:
            block.attn.gate.weight.zero_()
            block.attn.c_proj.weight.mul_(2)
    assert torch.allclose(model(idx), plain(idx), atol=1e-5)  # sigmoid(0) = 1/2, made up by a doubled projection


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "sink", "cope"])
def test_attn_gate_backends_agree_and_the_gate_learns(name):
    """Every backend gives the fp32 reference's logits and gradients with the gate; the gate's gradient is not zero."""
    reference = random_model(name, attn_backend="reference", attn_gate=True)
    assert_same_logits_and_grads(random_model(name, attn_backend="sdpa", attn_gate=True), reference, tokens(40))
    assert reference.blocks[0].attn.gate.weight.grad.abs().min() > 0
    if name != "cope":  # flex's forward, run eagerly (the CPU has no flex backward); CoPE weighs keys itself
        flex = random_model(name, attn_backend="flex", attn_gate=True)
        with torch.no_grad():
            assert torch.allclose(flex(tokens(40)), reference(tokens(40)), atol=2e-4)


@pytest.mark.parametrize("name", ["rope", "alibi", "sink", "learned", "fox"])
def test_attn_gate_decoding_equals_full_forward(name):
    """A dense cache token by token and in chunks, and the static step, give the full forward's logits: the gate reads
    each step's own input, nothing the cache holds."""
    assert_decoding_equals_full_forward(random_model(name, attn_gate=True), tokens(24))


def test_attn_gate_sink_cache_equals_dense_while_it_fits():
    model, idx = random_model("rope", attn_gate=True), tokens(11, batch=1)
    dense_cache, sink_cache = DenseCache(model, 1, 64), SinkCache(model, 1, 3, 8)
    with torch.no_grad():
        dense = torch.cat([model.decode(idx[:, t : t + 1], dense_cache) for t in range(11)], dim=1)
        sink = torch.cat([model.decode(idx[:, t : t + 1], sink_cache) for t in range(11)], dim=1)
    assert torch.equal(dense[:, :11], sink[:, :11])


def test_attn_gate_off_keeps_every_checkpoint_and_the_default_init():
    """Without the flag the model has the parameters, init and logits it had (an older checkpoint has no gate); with
    it, each block's gate is one more matrix, initialised as the query projection is (std 1/sqrt(d_model))."""
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SMALL))
    torch.manual_seed(0)
    gated = GPT(GPTConfig(**SMALL, attn_gate=True))
    assert not any("gate" in n for n, _ in plain.named_parameters())
    assert {n for n, _ in gated.named_parameters()} - {n for n, _ in plain.named_parameters()} == {
        "blocks.0.attn.gate.weight",
        "blocks.1.attn.gate.weight",
    }
    w = torch.cat([b.attn.gate.weight.flatten() for b in gated.blocks]).double()
    assert abs(w.std().item() * 32**0.5 - 1) < 0.15 and w.abs().max() <= 3**0.5 / 32**0.5
    matrices, _, _ = optim.param_groups(gated)
    assert {id(b.attn.gate.weight) for b in gated.blocks} <= {id(p) for p in matrices}  # a block matrix: Muon's


def test_attn_gate_saves_and_loads_to_the_same_logits(tmp_path):
    """A gated model's checkpoint builds a gated model (its config says so) with the same logits."""
    model = random_model("alibi", attn_gate=True)
    checkpoint.save(tmp_path / "ckpt.pt", checkpoint_state(model))
    loaded, _ = checkpoint.load_model(tmp_path)
    assert loaded.cfg.attn_gate and torch.equal(loaded(tokens()), model(tokens()))
