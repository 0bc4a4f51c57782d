"""Attention sinks (StreamingLLM, Xiao et al. 2024): a learned sink token prepended to every sequence.

python train.py positional=sink        (wraps RoPE; positional.inner={name:alibi} wraps ALiBi, likewise nope, t5)
python sample.py checkpoint=out/sink cache=sink      (streams past the training length at constant memory)
n_sink learned vectors before the text take the attention mass that softmax must put somewhere, so a cache that keeps
them plus a window of recent tokens stays stable. Everything else comes from the wrapped relative scheme.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from settings import setting

from .base import Positional, PositionalOptions


@dataclass
class SinkOptions(PositionalOptions):
    n_sink: int = setting(1, "pass how many learned sink tokens to prepend", ge=1, le=4096)
    # the wrapped scheme's options: +positional.inner.base=500000 adds one
    inner: Any = setting(
        {"name": "rope"},
        "e.g. positional.inner={name:alibi}",
        test=lambda spec: "name" in spec,
        must="be the wrapped scheme's options, its name among them",
    )


class Sink(Positional):
    about = "RoPE and a learned attention-sink token before every row (Xiao et al. 2024)"
    Options = SinkOptions
    relative = True

    def __init__(self, n_head, head_dim, d_model, inner: Positional, n_sink: int = 1):
        super().__init__(n_head, head_dim, d_model)
        if not inner.relative:
            raise ValueError(f"positional=sink wraps a relative scheme (rope, alibi, nope, t5), not {inner.name}")
        self.inner, self.n_prefix = inner, int(n_sink)
        self.sink = nn.Parameter(torch.randn(self.n_prefix, d_model))
        self.rotary, self.axes, self.state_dim = inner.rotary, inner.axes, inner.state_dim
        for hook in ("score_bias", "content_bias", "content_weights"):  # the ones the inner scheme gives
            if getattr(inner, hook) is not None:
                setattr(self, hook, getattr(inner, hook))

    def layer_module(self):
        return self.inner.layer_module()

    def prefix(self):
        return self.sink

    def embed(self, x, pos):
        return self.inner.embed(x, pos)

    def rotation(self, pos, scaling=None):
        return self.inner.rotation(pos, scaling)

    def rotate(self, x, pos, rotation=None):
        return self.inner.rotate(x, pos, rotation)

    def rotate_key(self, x, pos, rotation=None):
        return self.inner.rotate_key(x, pos, rotation)

    def rotated_dim(self):
        return self.inner.rotated_dim()
