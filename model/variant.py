"""An evaluation variant of a trained model: a value passed into its forward, never set on the model.

python eval.py checkpoint=out/rope eval.rope_scaling=all eval.log_scaling=true   (one Variant per row and length)
python sample.py checkpoint=out/rope rope_scaling=rerope                          (a KV cache holds its Variant)
A variant gives each scheme's layers their rotation and plans (hooks, called by GPT.plan): the model as trained
builds none of this. A KV cache is made for one variant (its keys are rotated under it). Nothing on the model
changes, so variants scored in any order give the numbers each gives alone.
"""

from dataclasses import dataclass, fields, replace
from functools import partial

import torch

from positional.rope_scaling import Scaling

from .attention import AttnPlan, make_plan


@dataclass(frozen=True)
class Variant:
    scaling: Scaling | None = None  # a RoPE extension in place of the model's own frequencies; None: as trained
    log_length: int | None = None  # the training length L of log-length scaling, max(1, ln n / ln L); None: off

    def __post_init__(self):
        if self.log_length is not None and self.log_length < 2:
            raise ValueError(f"log scaling needs a training length of at least 2 tokens, got {self.log_length}")

    @property
    def far(self) -> bool:
        """Whether keys past a window score through a second rotation (ReRoPE: positional/rerope.py)."""
        return self.scaling is not None and self.scaling.far is not None

    def hooks(self, pe, q_pos, k_pos, nope: bool):
        """(rotation, make_plan) for a scheme's layers: the scaled rotation, and plans that carry the queries'
        log-length factor and ReRoPE's far scores (the N layers keep their own rotation and take the factor alone)."""
        q_scale = far = None
        if self.log_length is not None:
            from .log_scaling import log_length_factor

            q_scale = log_length_factor(q_pos, self.log_length)
        if not nope and self.far:
            from .rerope_attention import Far

            if pe.content_bias is not None:
                raise ValueError(f"far scores (rope scaling {self.scaling.kind}) read no content bias ({pe.name})")
            far = Far.at(pe, q_pos, k_pos, self.scaling)
        rotation = pe.rotation if nope else partial(pe.rotation, scaling=self.scaling)
        return rotation, partial(VariantPlan.make, far=far, q_scale=q_scale)


AS_TRAINED = Variant()


@dataclass
class VariantPlan(AttnPlan):
    """A plan whose queries carry the log-length factor, and whose far keys (ReRoPE) score through a second
    rotation: queries() and keys() return [near | far] side by side."""

    q_scale: torch.Tensor | None = None  # (Tq, 1) log-length factor of the queries (model/log_scaling.py)
    far: object = None  # model/rerope_attention.py Far

    @classmethod
    def make(cls, pe, q_pos, k_pos, causal, n_head, backend="auto", sink=False, window=None, rot=None, *, far, q_scale):
        keep = sink or far is not None  # far scores read the plan's mask, where plain causal attention has none
        plan = make_plan(pe, q_pos, k_pos, causal, n_head, backend, keep, window, rot)
        plan = cls(**{f.name: getattr(plan, f.name) for f in fields(AttnPlan)}, q_scale=q_scale)
        if far is not None:
            plan.far = far.masked(plan)
            if plan.backend == "flex":  # the plan's own call keeps the near keys only
                from .rerope_attention import split_block_mask

                near = split_block_mask(q_pos, k_pos, far.window, window, causal, far=False)
                plan.mask = replace(plan.mask, block_mask=near)
        return plan

    def queries(self, q):
        out = super().queries(q)
        return out if self.far is None else torch.cat((out, self.far.queries(self.pe, q)), dim=-1)

    def query_scale(self, ssmax):
        learned = super().query_scale(ssmax)  # one factor on the near and far queries alike
        if self.q_scale is None:
            return learned
        return self.q_scale if learned is None else learned * self.q_scale

    def keys(self, k):
        near = super().keys(k)
        return near if self.far is None else torch.cat((near, self.far.keys(self.pe, k)), dim=-1)

    def new_keys(self, k):
        near = super().new_keys(k)
        return near if self.far is None else torch.cat((near, self.far.new_keys(self.pe, k)), dim=-1)

    def attend(self, q, k, v, sink=None, content=None):
        if self.far is None:
            return super().attend(q, k, v, sink, content)
        return self.far.attend(q, k, v, self, self.mask.bias, sink)  # hooks() refused a content bias

    def remade(self, k_pos, n_head, backend, sink, window, rot, same_keys):
        far = None if self.far is None else self.far.over(self.pe, self.q_pos, None if same_keys else k_pos)
        return self.make(self.pe, self.q_pos, k_pos, True, n_head, backend, sink, window, rot, far=far,
                         q_scale=self.q_scale)  # fmt: skip
