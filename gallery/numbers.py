"""The numbers behind the pictures of a positional scheme: small functions that return tensors, no plotting.

python viz.py positional=alibi          (gallery/draw.py draws these; viz.py is the entry point)
Each reads the scheme through its interface (positional/base.py), never by its name, so a test can hold every
picture against the scheme's own formula:
  position_vectors          the vector a scheme adds to the token embeddings at each position, or None
  similarity_by_offset      cosine (or dot product) of position p's vector with p + k's, averaged over p, by k
  rotary_logits             the logit of a query at position P against a key at P - d, for each distance d
  random_decay              its mean over random q = k (RoPE's long-term decay), under each rope scaling variant
  mean_query_key            a trained model's mean query and key per layer and head on text (the trained decay)
  bias_by_distance          score_bias of a query at position P against keys at P - d, per head
  content_bias_by_distance  a bias that reads the text (Shaw, FoX): its mean over text per layer, head, distance
"""

import math

import torch

from evaluation.sink_mass import layer_inputs
from model.attention import content_grid
from positional.rope_scaling import KINDS, Scaling


@torch.no_grad()
def position_vectors(pe, n: int) -> torch.Tensor | None:
    """(n, d_model): what pe.embed adds at positions 0..n-1 (n cut to a learned table's size); None when it adds
    nothing. Read from embed itself, so the picture is of what the model adds, scale included."""
    if pe.max_positions is not None:
        n = min(n, pe.max_positions)
    zeros = torch.zeros(n, pe.d_model)
    added = pe.embed(zeros, torch.arange(n)).float()
    return added if added.abs().amax() > 0 else None


def similarity_by_offset(vectors: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """(n,): entry k is the mean over p of sim(v_p, v_{p+k}), sim the cosine or the dot product."""
    if kind not in ("cosine", "dot"):
        raise ValueError(f"similarity kind '{kind}' is not one of cosine, dot")
    v = vectors.double()
    if kind == "cosine":
        v = v / v.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    gram = v @ v.T
    return torch.stack([gram.diagonal(k).mean() for k in range(len(v))]).float()


@torch.no_grad()
def rotary_logits(pe, q, k, distances: torch.Tensor, chunk: int = 512, scaling=None) -> torch.Tensor:
    """(N, H, D): queries q (N, H, Dh) at position P = max(distances) against keys k (N, H, Dh) at P - d, scored as
    the attention backends score them: rotated q . rotated k / sqrt(rotated width), under a rope Scaling (None: the
    scheme's own). The rotation state is made once over positions 0..P, as a full forward of P + 1 tokens makes it
    (dynamic NTK reads that length)."""
    P = int(distances.max())
    rot = pe.rotation(torch.arange(P + 1), scaling)  # a tuple of per-position tensors (RoPE: cos, sin), or None

    def at(pos):
        return None if rot is None else tuple(r[pos] for r in rot)

    q_pos = torch.tensor([P])
    q_rot = pe.rotate(q[:, :, None].float().contiguous(), q_pos, at(q_pos))  # (N, H, 1, W)
    out = []
    for d in distances.split(chunk):  # keys (N, H, chunk, W) at a time: bounded memory at any distance
        k_pos = P - d
        keys = k[:, :, None].float().expand(-1, -1, len(d), -1).contiguous()
        out.append((q_rot * pe.rotate_key(keys, k_pos, at(k_pos))).sum(-1))
    return torch.cat(out, dim=-1) / math.sqrt(q_rot.size(-1))


def random_decay(
    pe, distances: torch.Tensor, factor: float, original_length: int, samples: int = 128, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Each rope scaling variant (KINDS) -> (D,): the mean logit, over random q = k ~ N(0, I) and the heads, at each
    distance. q = k: a token against its own content d positions back; independent random q and k would average
    to 0 at every distance. For plain RoPE the mean is sum_i 2 cos(d theta_i) / sqrt(Dh), the long-term decay of
    Su et al. 2021. The variants extend by `factor` from `original_length`."""
    v = torch.randn(samples, pe.n_head, pe.head_dim, generator=torch.Generator().manual_seed(seed))
    return {
        kind: rotary_logits(pe, v, v, distances, scaling=Scaling(kind, factor, original_length)).mean(dim=(0, 1))
        for kind in KINDS
    }


@torch.no_grad()
def mean_query_key(model, idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (mean query (H, Dh), mean key (H, Dh)) over the text tokens of idx (B, T), before rotation (after
    QK-norm), each key head repeated over the query heads that share it (GQA). A query and a key drawn
    independently from the text score q_bar . R(d) k_bar on average: exactly, since the score is bilinear."""
    out = []
    for attn, x, _ in layer_inputs(model, idx):
        q, k, _ = attn.project(x[:, model.pe.n_prefix :])  # the learned sink tokens are not text
        k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)
        out.append((q.float().mean(dim=(0, 2)), k.float().mean(dim=(0, 2))))
    return out


@torch.no_grad()
def bias_by_distance(pe, distances: torch.Tensor, query_position: int | None = None) -> torch.Tensor | None:
    """(H, D): pe.score_bias of a query at query_position (default max(distances)) against keys at distances d
    before it, or None for a scheme without a position-only bias. Trained values where pe is a trained model's."""
    if pe.score_bias is None:
        return None
    P = int(distances.max()) if query_position is None else int(query_position)
    if P < int(distances.max()):
        raise ValueError(f"a query at position {P} has no key {int(distances.max())} positions back")
    h = torch.arange(pe.n_head)[:, None]
    bias = pe.score_bias(h, torch.tensor([[P]]), P - distances[None, :])
    return bias.float().expand(pe.n_head, len(distances))


@torch.no_grad()
def content_bias_by_distance(model, idx: torch.Tensor) -> torch.Tensor | None:
    """(layers, H, T): a bias that reads queries or the layer input (positional/base.py content_bias), each layer's
    own, averaged over the sequences of idx (B, T) and over every query with a key d positions back, d = 0..T-1;
    None for a scheme without one. Text positions only: the learned sink tokens are left out."""
    if model.pe.content_bias is None:
        return None
    n, out = model.pe.n_prefix, []
    for attn, x, plan in layer_inputs(model, idx):
        q, _, _ = attn.project(x)
        q = plan.queries(q)
        state = None if attn.pe_layer is None else attn.pe_layer(x)
        fn = attn.content(q, state, plan)
        grid = content_grid(fn, q.size(0), q.size(1), q.size(2), len(plan.k_pos), q.device)[:, :, n:, n:]
        out.append(torch.stack([grid.diagonal(-d, -2, -1).mean(dim=(0, -1)) for d in range(grid.size(-1))], -1))
    return torch.stack(out)
