"""utils/optim.py Muon: torch.optim.Muon's update, orthogonalized in fp32 on the CPU."""

import torch

from utils.optim import Muon, orthogonalize

COEF = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults


def fp32_newton_schulz(g, steps=5):
    """The iteration written out: X <- aX + bAX + cA^2X, A = XX^T, on the short side of g / |g|."""
    a, b, c = COEF
    x = (g if g.size(0) <= g.size(1) else g.T).double()
    x = x / x.norm()
    for _ in range(steps):
        A = x @ x.T
        x = a * x + b * A @ x + c * A @ A @ x
    return (x if g.size(0) <= g.size(1) else x.T).float()


def test_orthogonalize_is_the_iteration_in_fp32_and_flattens_the_spectrum():
    torch.manual_seed(0)
    for shape in [(64, 128), (128, 32), (48, 48)]:
        g = torch.randn(shape) @ torch.diag(torch.logspace(-2, 1, shape[1]))  # singular values over 3 decades
        got = orthogonalize(g, COEF, 5, 1e-7)
        assert torch.allclose(got, fp32_newton_schulz(g), atol=1e-5)  # bf16 arithmetic is off by ~1e-3
        s = torch.linalg.svdvals(got)
        assert s.max() < 1.3 and s[: min(shape) // 2].min() > 0.5, s  # the large half of the spectrum near 1


def test_a_step_is_torchs_up_to_its_bf16_rounding_and_the_state_is_the_same():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(64, 96, bias=False)
    theirs.load_state_dict(ours.state_dict())
    kw = dict(lr=0.05, weight_decay=0.1, momentum=0.95)
    opt_ours, opt_theirs = Muon(ours.parameters(), **kw), torch.optim.Muon(theirs.parameters(), **kw)
    start = ours.weight.detach().clone()
    for _ in range(3):
        x = torch.randn(256, 64)  # a full-rank gradient: bf16 noise in a null space would grow ~480x (slope a^5)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    moved = (theirs.weight - start).abs().max()
    assert (ours.weight - theirs.weight).abs().max() < 0.05 * moved  # the same update, bf16 rounding apart
    assert opt_ours.state_dict()["state"].keys() == opt_theirs.state_dict()["state"].keys()
    buf = opt_theirs.state_dict()["state"][0]["momentum_buffer"]
    assert (opt_ours.state_dict()["state"][0]["momentum_buffer"] - buf).norm() < 0.02 * buf.norm()
    opt_theirs.load_state_dict(opt_ours.state_dict())  # a checkpoint moves from one to the other


def test_a_warmup_longer_than_the_run_is_the_whole_run():
    """train.max_steps=30 with the default train.warmup_steps=40: the rate rises every step to its peak at the last."""
    from utils.optim import lr_factor

    factors = [lr_factor(step, 30, 40, 0.1, "cosine") for step in range(30)]
    assert all(a < b for a, b in zip(factors[:-1], factors[1:], strict=True)) and factors[-1] == 1.0
    assert [lr_factor(s, 100, 40, 0.1, "cosine") for s in (0, 39)] == [1 / 40, 1.0]  # within the run: as before
