"""Model sizes and scheme specs for the benchmarks, composed by Hydra as a run's are (utils/schema.py, configs/).

python bench/train_bench.py --model d12      python bench/decode_bench.py --model tiny --positional alibi
"""

from pathlib import Path

from hydra import compose, initialize_config_dir

import positional
import utils.schema  # noqa: F401  (registers the config schemas the yaml files name)

ROOT = Path(__file__).resolve().parent.parent
SIZES = sorted(p.stem for p in (ROOT / "configs" / "model").glob("*.yaml"))
SCHEMES = [*positional.names(), *sorted(p.stem for p in (ROOT / "configs" / "positional").glob("*.yaml"))]  # + presets


def run_config(scheme: str, overrides: list[str]) -> dict:
    """The resolved training config of `python train.py positional=<scheme> <overrides>`."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"positional={scheme}", *overrides])
    return utils.schema.plain(cfg)


def model_config(scheme: str, size: str, seq_len: int, vocab: int | None = None, extra=()) -> dict:
    """GPTConfig keywords for model=<size> positional=<scheme> at train.seq_len=<seq_len> (and extra overrides);
    vocab: the tokenizer's unless given."""
    run = run_config(scheme, [f"model={size}", f"train.seq_len={seq_len}", *extra])
    return utils.schema.model_config(run, vocab or run["tokenizer"]["vocab_size"])
