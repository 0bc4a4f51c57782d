"""Analyses of trained runs that are findings, not benchmarks: each prints its table (--json keeps it).

python analyses/head_focus.py out/rope        python analyses/position_ablation.py out/rope
python analyses/sink_trend.py out/sinks
"""
