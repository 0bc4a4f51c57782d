"""2D sinusoidal positions: each axis its share of the embedding, filled with that axis's 1D sinusoids.

python train.py data=grids positional=sinusoidal2d     (positions (2, T): row, column; data/grids.py)
d_model is cut into one block per axis, as even as pairs allow (128 over 3 axes: 44, 42, 42), block a holding the
sinusoids of the position on axis a at the frequencies of a block that wide, added times `scale` as in sinusoidal.py.
Absolute: a grid larger than trained on brings rows and columns the model never saw. A (T,) position sits at (p, p).
"""

import torch

from .base import Positional
from .sinusoidal import SinusoidalOptions, frequencies, sinusoids


def axis_widths(d_model: int, axes: int) -> list[int]:
    """Dimensions per axis: whole (sin, cos) pairs, the first axes a pair more."""
    pairs, extra = divmod(d_model // 2, axes)
    return [2 * (pairs + (a < extra)) for a in range(axes)]


class Sinusoidal2D(Positional):
    about = "fixed sinusoids per position axis, over (row, column)"
    Options = SinusoidalOptions
    axes = 2

    def __init__(self, n_head, head_dim, d_model, base: float = 10000.0, scale: float = 1.0):
        super().__init__(n_head, head_dim, d_model)
        self.widths = axis_widths(d_model, self.axes)
        if min(self.widths) < 2:
            raise ValueError(
                f"positional={self.name} needs a (sin, cos) pair per axis: model.d_model={d_model} is too narrow"
            )
        self.scale = float(scale)
        for a, width in enumerate(self.widths):
            self.register_buffer(f"inv_freq{a}", frequencies(width, base), persistent=False)

    def vectors(self, pos: torch.Tensor) -> torch.Tensor:
        """(T, d_model) unscaled: each axis's sinusoids in its block (a last odd dimension stays 0)."""
        pos = self.per_axis(pos)
        blocks = [sinusoids(pos[a], getattr(self, f"inv_freq{a}")) for a in range(self.axes)]
        out = torch.cat(blocks, dim=-1)
        return torch.nn.functional.pad(out, (0, self.d_model - out.size(-1)))

    def embed(self, x, pos):
        return x + self.scale * self.vectors(pos).to(x.dtype)
