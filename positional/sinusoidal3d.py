"""3D sinusoidal positions: sinusoidal2d.py's construction over three axes (temporal, height, width).

python train.py data=grids positional=sinusoidal3d     (positions (3, T) laid out as M-RoPE's; data/grids.py)
"""

from .sinusoidal2d import Sinusoidal2D


class Sinusoidal3D(Sinusoidal2D):
    about = "fixed sinusoids per position axis, over (time, row, column)"
    axes = 3
