"""3D sinusoidal positions: sinusoidal2d.py's construction over three axes (temporal, height, width).

python train.py data=grids positional=sinusoidal3d     (positions (3, T) laid out as M-RoPE's; data/grids.py)
d_model is cut into three blocks (128: 44, 42, 42 dimensions), each the 1D sinusoids of its axis's position.
"""

from .sinusoidal2d import Sinusoidal2D


class Sinusoidal3D(Sinusoidal2D):
    about = "fixed sinusoids per position axis, over (time, row, column)"
    axes = 3
