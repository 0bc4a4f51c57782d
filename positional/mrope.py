"""M-RoPE (Qwen2-VL, Wang et al. 2024): RoPE whose pairs are split into temporal, height and width sections.

python train.py data=grids positional=mrope                     (positions (3, T): temporal, height, width)
python train.py positional=mrope                                (text: one id per token, exactly RoPE)
python train.py data=grids positional=mrope positional.interleaved=true
Each pair keeps RoPE's frequency; the first sections[0] pairs turn with the temporal id, the next sections[1] with the
height id, the rest with the width id (Qwen2-VL's mrope_section, [16, 24, 24] of 64 pairs; default: that ratio for
this head). A text token carries the same id on every axis, so text alone is exactly RoPE (tests/test_grids.py, on
logits). Relative on every axis: a sink cache shifts all axes by one amount.
interleaved: pair i turns with axis i mod 3, so every axis spans RoPE's whole frequency range (Qwen3-VL's interleaved
MRoPE). Sections leave the width axis only the slowest frequencies: at head dim 32 its fastest pair turns 0.003 rad
per column, 1/300 of RoPE's fastest.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from settings import Rule, setting

from .base import PositionalOptions
from .rope import RoPE

QWEN2_VL_SECTIONS = (16, 24, 24)


def default_sections(pairs: int) -> list[int]:
    """Qwen2-VL's 16:24:24 split of a head's rotary pairs, rounded (the width takes what is left)."""
    t, h = (round(pairs * n / sum(QWEN2_VL_SECTIONS)) for n in QWEN2_VL_SECTIONS[:2])
    return [t, h, pairs - t - h]


@dataclass
class MRoPEOptions(PositionalOptions):
    base: float = setting(10000.0, "pass a positive rotary base", gt=0)
    # pairs per section, summing to head dim / 2 (checked at build); null: Qwen2-VL's 16:24:24 (tiny: [4, 6, 6])
    sections: list[int] | None = setting(None, "e.g. positional.sections=[4,6,6]", ge=1, le=2**16, length=3)
    interleaved: bool = False  # true: pair i turns with axis i mod 3

    RULES: ClassVar = (
        Rule(
            ("sections", "interleaved"),
            lambda sections, interleaved: sections is None or not interleaved,
            "{0} cuts the pairs into blocks, {1} deals them round-robin: drop one",
        ),
    )


class MRoPE(RoPE):
    about = "M-RoPE: RoPE's pairs in temporal, height and width sections (Qwen2-VL, Wang et al. 2024)"
    Options = MRoPEOptions
    axes = 3

    def __init__(
        self, n_head, head_dim, d_model, base: float = 10000.0, sections=None, interleaved: bool = False, scaling=None
    ):
        super().__init__(n_head, head_dim, d_model, base, scaling=scaling)
        pairs = head_dim // 2
        self.interleaved = bool(interleaved)
        if interleaved:  # sections are then just the counts
            axis_of_pair = [i % 3 for i in range(pairs)]
            sections = [axis_of_pair.count(axis) for axis in range(3)]
        else:  # contiguous blocks: temporal, then height, then width
            sections = default_sections(pairs) if sections is None else [int(s) for s in sections]
            axis_of_pair = [axis for axis, n in enumerate(sections) for _ in range(n)]
        if sum(sections) != pairs:  # three positive counts: MRoPEOptions
            raise ValueError(
                f"positional.sections={sections} must sum to the head's {pairs} rotary pairs (temporal, height, "
                f"width); e.g. positional.sections={default_sections(pairs)}"
            )
        self.sections = sections
        self.register_buffer("pair_axis", torch.tensor(axis_of_pair), persistent=False)

    def extra_repr(self):
        return f"sections={self.sections}, interleaved={self.interleaved}, " + super().extra_repr()
