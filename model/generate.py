"""Token sampling through a KV cache.

python sample.py checkpoint=out/rope temperature=0.8 top_k=50      (train.py also prints a sample at the end)
"""

import torch
from torch import nn


def hold_matrices(model, dtype: torch.dtype):
    """Keep every matrix weight (each nn.Linear: attention, MLP, the head) in dtype, for decoding under autocast to
    dtype, which would otherwise cast each fp32 weight anew at every step: 6 bytes moved per weight where 2 suffice,
    and a token's floor is reading them once. The same products, since autocast computes in dtype either way;
    embeddings, a scheme's tensors and the cache's positions stay as they are. In place; returns the model."""
    if dtype != torch.float32:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.to(dtype)
    return model


def sample_next(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits (B, V) -> token ids (B,). temperature 0 is argmax; top_k keeps only the k most likely tokens."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model,
    prompt: torch.Tensor,
    cache,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    static: bool = False,
):
    """Yield (B,) new token ids one step at a time; max_new_tokens < 0 means without end. static: decode each
    new token with the compiled fixed-shape step (model/static_decode.py; CUDA graphs on a GPU)."""
    logits = model.decode(prompt, cache)[:, -1]  # the prompt: eager, in as few chunks as the cache allows
    step = lambda tok: model.decode(tok, cache)[:, -1]  # noqa: E731
    if static:  # the compiled fixed-shape step, loaded when asked for
        from .static_decode import StaticDecoder

        step = StaticDecoder(model, cache)
    n = 0
    while max_new_tokens < 0 or n < max_new_tokens:
        tok = sample_next(logits, temperature, top_k, generator)
        yield tok
        n += 1
        if max_new_tokens < 0 or n < max_new_tokens:
            logits = step(tok[:, None])
