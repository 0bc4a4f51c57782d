"""An evaluation variant of a trained model: a value passed into its forward, never set on the model.

python eval.py checkpoint=out/rope eval.rope_scaling=all eval.log_scaling=true   (one Variant per row and length)
python sample.py checkpoint=out/rope rope_scaling=dca                             (a KV cache holds its Variant)
A variant gives each scheme's layers their rotation and plans (hooks, called by GPT.plan); the model as trained builds
none of this. A KV cache is made for one variant (its keys are rotated under it). Nothing on the model changes, so
variants scored in any order give the numbers each gives alone.
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
    # true: the scaling reaches the full-attention layers alone, the sliding-window and chunked layers keep the
    # rotation they were trained with (OLMo 3's YaRN, Gemma 3's linear x8)
    full_layers: bool = False

    def __post_init__(self):
        if self.log_length is not None and self.log_length < 2:
            raise ValueError(f"log scaling needs a training length of at least 2 tokens, got {self.log_length}")
        if self.full_layers and self.parts:  # a cache row holds every layer's keys at one width
            raise ValueError(f"rope scaling {self.scaling.kind} splits every layer's keys: it has no full-layers form")

    @property
    def parts(self) -> int:
        """How many rotations past the scheme's own each query and key gets (ReRoPE 1, DCA 2: split_attention.py)."""
        split = None if self.scaling is None else self.scaling.split
        return 0 if split is None else split.parts

    def hooks(self, pe, q_pos, k_pos, nope: bool, q_ids, k_ids):
        """(rotation, make_plan) for a scheme's layers: the scaled rotation, and plans that carry the queries'
        log-length factor and a split's other rotations (the N layers keep their own rotation and take the factor
        alone); under full_layers, plans whose windows rotate as trained at q_ids and k_ids."""
        q_scale = parts = trained = None
        if self.log_length is not None:
            from .log_scaling import log_length_factor

            q_scale = log_length_factor(q_pos, self.log_length)
        rotation = pe.rotation if nope else partial(pe.rotation, scaling=self.scaling)
        if not nope and self.parts:
            from .split_attention import Parts

            if pe.content_bias is not None:
                raise ValueError(f"rope scaling {self.scaling.kind} scores no content bias ({pe.name})")
            parts = Parts.at(pe, q_pos, k_pos, self.scaling)
            rotation = partial(parts.own_rotation, pe)
        if self.full_layers and not nope:
            trained = (pe.rotation, q_ids, k_ids)
        return rotation, partial(VariantPlan.make, parts=parts, q_scale=q_scale, trained=trained)


AS_TRAINED = Variant()


@dataclass
class VariantPlan(AttnPlan):
    """A plan whose queries carry the log-length factor and whose keys score through their split part's rotation
    (ReRoPE, DCA: queries() and keys() are [own | part 1 | ...] side by side). Under full_layers its windows rotate
    as trained."""

    q_scale: torch.Tensor | None = None  # (Tq, 1) log-length factor of the queries (model/log_scaling.py)
    parts: object = None  # model/split_attention.py Parts
    trained: tuple | None = None  # full_layers: (the scheme's own rotation, query ids, key ids) for the windows

    @classmethod
    def make(cls, pe, q_pos, k_pos, causal, n_head, backend, sink, window=None, rot=None, *, parts, q_scale, trained):
        keep = sink or parts is not None  # a split reads the plan's mask, where plain causal attention has none
        plan = make_plan(pe, q_pos, k_pos, causal, n_head, backend, keep, window, rot)
        plan = cls(**{f.name: getattr(plan, f.name) for f in fields(AttnPlan)}, q_scale=q_scale, trained=trained)
        if parts is not None:
            plan.parts = parts.masked(plan)
            if plan.backend == "flex":  # the plan's own call keeps part 0's keys only
                from .split_attention import part_block_mask

                own = part_block_mask(q_pos, k_pos, parts.split, 0, window, causal)
                plan.mask = replace(plan.mask, block_mask=own)
        return plan

    def queries(self, q):
        out = super().queries(q)
        return out if self.parts is None else torch.cat((out, *self.parts.queries(self.pe, q)), dim=-1)

    def query_scale(self, ssmax):
        learned = super().query_scale(ssmax)  # one factor on every part's queries alike
        if self.q_scale is None:
            return learned
        return self.q_scale if learned is None else learned * self.q_scale

    def keys(self, k):
        own = super().keys(k)
        return own if self.parts is None else torch.cat((own, *self.parts.keys(self.pe, k)), dim=-1)

    def new_keys(self, k):
        own = super().new_keys(k)
        return own if self.parts is None else torch.cat((own, *self.parts.new_keys(self.pe, k)), dim=-1)

    def attend(self, q, k, v, sink=None, content=None):
        if self.parts is None:
            return super().attend(q, k, v, sink, content)
        return self.parts.attend(q, k, v, self, self.mask.bias, sink)  # hooks() refused a content bias

    def window_rotation(self, k_pos, k_rot):
        """Under full_layers the window's layers rotate as trained (the scheme's own rotation at the ids), the
        log-length factor kept; else as any plan's windows."""
        if self.trained is None:
            return super().window_rotation(k_pos, k_rot)
        rotation, q_ids, k_ids = self.trained
        same = k_pos is None  # else a cache's ring, whose positions are its ids
        q_rot = rotation(q_ids)
        return q_rot, q_rot if same and k_ids is q_ids else rotation(k_ids if same else k_pos)

    def remade(self, k_pos, n_head, backend, sink, window, rot, same_keys):
        parts = None if self.parts is None else self.parts.over(self.pe, self.q_pos, None if same_keys else k_pos)
        args = (self.pe, self.q_pos, k_pos, True, n_head, backend, sink, window, rot)
        return self.make(*args, parts=parts, q_scale=self.q_scale, trained=None)
