"""A plain GPT-2 decoder from stock torch modules: the yardstick bench/cpu_bench.py holds nanopos's GPT against.

python bench/cpu_bench.py
What a GPT-2 block costs with nothing positional or nanochat-specific in it. Keys and values take n_kv_head heads
(GQA), so its matrix multiplies match nanopos's GPT of the same config FLOP for FLOP.
"""

import torch.nn.functional as F
from torch import nn


class PlainBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, mlp_ratio: int):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, d_model // n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.c_attn = nn.Linear(d_model, (n_head + 2 * n_kv_head) * self.head_dim)
        self.c_proj = nn.Linear(d_model, d_model)
        hidden = mlp_ratio * d_model
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d_model))

    def forward(self, x):
        B, T, C = x.shape
        kv = self.n_kv_head * self.head_dim
        qkv = self.c_attn(self.ln_1(x)).split([C, kv, kv], dim=-1)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in qkv)  # (B, heads, T, head_dim)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_head != self.n_kv_head)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, vocab_size, n_layer, n_head, n_kv_head, d_model, mlp_ratio, seq_len, **_):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d_model), nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_head, n_kv_head, mlp_ratio) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[: idx.size(1)]
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
