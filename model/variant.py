"""An evaluation variant of a trained model: a value passed into its forward, never set on the model.

python eval.py checkpoint=out/rope eval.rope_scaling=all eval.log_scaling=true   (one Variant per row and length)
python sample.py checkpoint=out/rope rope_scaling=rerope                          (a KV cache holds its Variant)
A KV cache is made for one variant (its keys are rotated under it). Nothing on the model changes, so variants scored
in any order give the numbers each gives alone.
"""

from dataclasses import dataclass

from positional.rope_scaling import Scaling


@dataclass(frozen=True)
class Variant:
    scaling: Scaling | None = None  # a RoPE extension in place of the model's own frequencies; None: as trained
    log_length: int | None = None  # the training length L of log-length scaling, max(1, ln n / ln L); None: off

    def __post_init__(self):
        if self.log_length is not None and self.log_length < 2:
            raise ValueError(f"log scaling needs a training length of at least 2 tokens, got {self.log_length}")


AS_TRAINED = Variant()
