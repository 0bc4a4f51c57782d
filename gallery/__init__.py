"""The pictures of a positional scheme, for viz.py: numbers.py computes them, draw.py draws them and their index.

python viz.py positional=rope      python viz.py checkpoint=out/rope      python viz.py viz.all=true
"""
