"""The numbers behind the pictures of a positional scheme: small functions that return tensors, no plotting.

python viz.py positional=alibi          (gallery/draw.py draws these; viz.py is the entry point)
Each reads the scheme through its interface (positional/base.py), never by its name, so a test can hold every
picture against the scheme's own formula.
"""

import math

import torch

from evaluation.sink_mass import layer_inputs
from model.attention import content_grid
from positional.rope_scaling import KINDS, Scaling


@torch.no_grad()
def position_vectors(pe, n: int) -> torch.Tensor | None:
    """(n, d_model): what pe.embed adds at positions 0..n-1 (at most a learned table's size), or None if nothing."""
    n = n if pe.max_positions is None else min(n, pe.max_positions)
    added = pe.embed(torch.zeros(n, pe.d_model), torch.arange(n)).float()
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
    """(N, H, D): queries q (N, H, Dh) at P = max(distances) against keys k at P - d, scored as the backends score
    them, under a rope Scaling (None: the scheme's own). The rotation state spans 0..P, as a forward of P + 1 tokens
    makes it (dynamic NTK reads that length)."""
    P = int(distances.max())
    rot = pe.rotation(torch.arange(P + 1), scaling)  # per-position tensors (RoPE: cos, sin), or None
    at = lambda pos: None if rot is None else tuple(r[pos] for r in rot)
    q_pos = torch.tensor([P])
    q_rot = pe.rotate(q[:, :, None].float().contiguous(), q_pos, at(q_pos))  # (N, H, 1, W)
    out = []
    for d in distances.split(chunk):  # keys (N, H, chunk, W) at a time: bounded memory at any distance
        keys = k[:, :, None].float().expand(-1, -1, len(d), -1).contiguous()
        out.append((q_rot * pe.rotate_key(keys, P - d, at(P - d))).sum(-1))
    return torch.cat(out, dim=-1) / math.sqrt(q_rot.size(-1))


def random_decay(pe, distances: torch.Tensor, factor: float, original_length: int, samples=128, seed=0) -> dict:
    """Each rope scaling variant (KINDS) -> (D,): the mean logit of random q = k ~ N(0, I) (independent ones average
    to 0) over the heads, by distance. For plain RoPE, sum_i 2 cos(d theta_i) / sqrt(Dh): Su et al. 2021's decay."""
    v = torch.randn(samples, pe.n_head, pe.head_dim, generator=torch.Generator().manual_seed(seed))
    scaled = {kind: Scaling(kind, factor, original_length) for kind in KINDS}
    return {kind: rotary_logits(pe, v, v, distances, scaling=s).mean(dim=(0, 1)) for kind, s in scaled.items()}


@torch.no_grad()
def mean_query_key(model, idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (mean query (H, Dh), mean key (H, Dh)) over the text of idx, after QK-norm and before rotation.
    A query and a key drawn independently from the text score q_bar . R(d) k_bar on average (the score is bilinear)."""
    out = []
    for attn, x, _ in layer_inputs(model, idx):
        q, k, _ = attn.project(x[:, model.pe.n_prefix :])  # the learned sink tokens are not text
        k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)  # GQA
        out.append((q.float().mean(dim=(0, 2)), k.float().mean(dim=(0, 2))))
    return out


@torch.no_grad()
def bias_by_distance(pe, distances: torch.Tensor, query_position: int | None = None) -> torch.Tensor | None:
    """(H, D): pe.score_bias of a query at query_position (default max(distances)) against keys d before it."""
    if pe.score_bias is None:
        return None
    far = int(distances.max())
    P = far if query_position is None else int(query_position)
    if P < far:
        raise ValueError(f"a query at position {P} has no key {far} positions back")
    bias = pe.score_bias(torch.arange(pe.n_head)[:, None], torch.tensor([[P]]), P - distances[None, :])
    return bias.float().expand(pe.n_head, len(distances))


@torch.no_grad()
def content_bias_by_distance(model, idx: torch.Tensor) -> torch.Tensor | None:
    """(layers, H, T): pe.content_bias averaged over idx's text positions, by distance d = 0..T-1."""
    if model.pe.content_bias is None:
        return None
    n, out = model.pe.n_prefix, []
    for attn, x, plan in layer_inputs(model, idx):
        q = plan.queries(attn.project(x)[0])
        fn = attn.content(q, None if attn.pe_layer is None else attn.pe_layer(x), plan)
        grid = content_grid(fn, q.size(0), q.size(1), q.size(2), len(plan.k_pos), q.device)[:, :, n:, n:]
        out.append(torch.stack([grid.diagonal(-d, -2, -1).mean(dim=(0, -1)) for d in range(grid.size(-1))], -1))
    return torch.stack(out)
