"""PaTH attention (Yang et al. 2025): keys transformed by the Householder-like matrices of the tokens between key and
query, a position encoding that reads the data.

python train.py positional=path
Each token t has, per head, a unit vector w_t = normalize(W_w x_t) and beta_t = 2 sigmoid(W_b x_t) in (0, 2) (the
paper's short convolution over x is left out), and H_t = I - beta_t w_t w_t^T. The score of key j for query i is
q_i^T H_i H_(i-1) ... H_(j+1) k_j / sqrt(d), then a softmax (RoPE is the case of fixed rotations). No d x d product is
formed: with u_t = w_t^T (H_(t+1) ... H_i q_i), the score is q_i . k_j - sum over j < t <= i of beta_t u_t (w_t . k_j),
and the u of every query solve one unit upper-triangular system (I + R) u = W q masked to t <= i,
R_ts = beta_s w_t . w_s for s after t: O(Tk^2 (Tq + d)) per head. w and beta are the per-token state a KV cache keeps;
no key is rewritten. Dense on every device; the paper's blockwise Triton kernel is not used.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .base import Positional


class Householder(nn.Module):
    """One layer's w_t and beta_t: input (B, T, D) -> state (B, H x (Dh + 1), T), fp32."""

    def __init__(self, d_model: int, n_head: int, head_dim: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.w = nn.Linear(d_model, n_head * head_dim, bias=False)
        self.beta = nn.Linear(d_model, n_head, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        w = F.normalize(self.w(x).float().view(B, T, self.n_head, self.head_dim), dim=-1).flatten(2)
        beta = 2 * torch.sigmoid(self.beta(x).float())
        return torch.cat((w, beta), dim=-1).transpose(1, 2)


class PaTH(Positional):
    about = "PaTH: keys transformed by Householder-like matrices of the tokens between (Yang et al. 2025)"
    relative = True  # reads no position but their order

    def __init__(self, n_head, head_dim, d_model):
        super().__init__(n_head, head_dim, d_model)
        self.state_dim = n_head * (head_dim + 1)

    def layer_module(self):
        return Householder(self.d_model, self.n_head, self.head_dim)

    def split(self, state):
        """state (B, H x (Dh + 1), Tk) -> w (B, H, Tk, Dh), beta (B, H, Tk)."""
        B, _, T = state.shape
        w, beta = state.transpose(1, 2).split((self.n_head * self.head_dim, self.n_head), dim=-1)
        return w.view(B, T, self.n_head, self.head_dim).transpose(1, 2), beta.transpose(1, 2)

    def transformed_scores(self, q, k, state, q_pos, k_pos):
        """q_i^T H_i ... H_(j+1) k_j (B, H, Tq, Tk), keys in order of position (k_pos ascending)."""
        q, k = q.float(), k.repeat_interleave(q.size(1) // k.size(1), dim=1).float()
        w, beta = self.split(state.float())
        wk = (w @ k.transpose(-2, -1)).tril(-1)  # (w_t . k_j) where t comes after j
        r = (w @ w.transpose(-2, -1)) * beta[..., None, :]  # R_ts = beta_s w_t . w_s, read above the diagonal only
        carried = (w @ q.transpose(-2, -1)).masked_fill(k_pos[:, None] > q_pos[None, :], 0.0)  # t <= i
        u = torch.linalg.solve_triangular(r, carried, upper=True, unitriangular=True)  # (B, H, Tk, Tq)
        return q @ k.transpose(-2, -1) - u.transpose(-2, -1) @ (beta[..., None] * wk)

    def content_weights(self, q, k, bias, state, layer, plan):
        order, k_pos = plan.key_order, plan.k_pos
        if order is not None:  # a cache's slots: the product runs in order of position
            k, state, k_pos = k[:, :, order[0]], state[..., order[0]], k_pos[order[0]]
        z = self.transformed_scores(q, k, state, plan.q_pos, k_pos)
        if order is not None:
            z = z[..., order[1]]
        return (z / q.size(-1) ** 0.5 + bias).softmax(-1)
