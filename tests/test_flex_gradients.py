"""Flex's backward takes the gradient of every learned tensor a score_mod reads (checked on the CPU).

python -m pytest -q tests/test_flex_gradients.py
Compiled flex computes a captured tensor's gradient by scattering into it where score_mod indexes it, and its
CUDA lowering refuses a score_mod that indexes one such tensor twice (FoX's cumulative gates at the query row and the
key row, once) or computes on it before indexing: training a scheme so failed on the GPU, while every CPU path
passed. A tensor read whole, never indexed, gets a gradient per score that no scatter sums: refused here too. In
training a learned position bias (T5, KERPLE, FIRE) reaches flex as one table of one entry per score
(model/flex.py bias_table); the tests below hold that and its gradients. The check is torch's own
(validate_joint_graph), run here on the joint graph that torch.compile traces for the model, so no GPU is needed."""

import pytest
import torch
from conftest import SCHEMES, assert_same_logits_and_grads, random_model

from model import flex as flex_backend

flex_api = pytest.importorskip("torch.nn.attention.flex_attention")
flex_lowering = pytest.importorskip("torch._inductor.kernel.flex.flex_attention")
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.partitioners import default_partition  # noqa: E402

# every scheme whose bias runs inside flex's score_mod, and a learned sink over the biased schemes
FLEX = [name for name in SCHEMES if (pe := random_model(name).pe).score_bias or pe.content_bias]
VARIANTS = FLEX + [("sink", inner) for inner in ("alibi", "t5", "kerple", "fire")]
LEARNED = [name for name in FLEX if flex_backend.learned_bias(random_model(name).pe)]


class Traced(Exception):
    """Stops torch.compile once the joint graph is read: nothing runs (flex has no CPU backward to run)."""


def flex_joint_graphs(model, idx) -> list:
    """The joint (forward + backward) graphs of every flex call in the model's compiled training step."""
    found = []

    def partition(joint, inputs, **kw):
        for node in joint.graph.nodes:
            if node.op == "call_function" and "flex_attention_backward" in str(node.target):
                found.extend(getattr(joint, a.target) for a in node.args if getattr(a, "op", None) == "get_attr")
        return default_partition(joint, inputs, **kw)

    def stop(gm, example_inputs):
        raise Traced

    backend = aot_autograd(fw_compiler=stop, bw_compiler=stop, partition_fn=partition)
    torch._dynamo.reset()
    with pytest.raises(Exception) as stopped:
        torch.compile(model, backend=backend, fullgraph=True)(idx[:, :-1], idx[:, 1:])
    assert "Traced" in repr(stopped.value), stopped.value  # stopped by the backend, not by a tracing error
    torch._dynamo.reset()
    return found  # score_mod's forward, joint and mask graphs: only a joint graph scatters gradients


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_flex_backward_accepts_every_learned_bias(variant, monkeypatch):
    """Every scheme's score_mod passes the CUDA lowering's check, and its captured tensors' gradients are summed.
    A learned bias (T5, KERPLE, FIRE) is read in training from a table of one entry per (head, query, key), so its
    only scatter is into that table: flex's backward adds each score's gradient into what its score_mod reads with
    an atomic add, and T5's 32 x H table took a whole tile's adds at one address (0.038x RoPE's speed on an H100);
    autograd sums the table into the parameters outside the kernel."""
    monkeypatch.setattr(flex_api, "_validate_device", lambda *a: None)  # trace the CUDA graph on the CPU
    name, inner = (variant, None) if isinstance(variant, str) else variant
    kw = {"positional": {"name": "sink", "inner": {"name": inner}}} if inner else {}
    model = random_model(name, n_layer=1, attn_backend="flex", **kw)  # every layer's flex call is alike
    idx = torch.randint(0, 97, (2, 131), generator=torch.Generator().manual_seed(0))
    graphs = flex_joint_graphs(model, idx)
    assert graphs, "no flex backward traced"
    for graph in graphs:
        flex_lowering.validate_joint_graph(graph.graph)  # raises where the CUDA lowering would
        assert not unreduced_gradients(graph.graph)
    if name in LEARNED:
        scatter = torch.ops.flex_lib.zeros_and_scatter.default
        nodes = [node for graph in graphs for node in graph.graph.nodes]
        targets = [tuple(node.args[0]) for node in nodes if node.op == "call_function" and node.target is scatter]
        assert targets and set(targets) == {(4, 130, 130)}, targets


def unreduced_gradients(graph) -> list:
    """A joint graph's gradients of captured tensors that are not scattered where the score_mod indexed them: a
    tensor read whole (FIRE's scalars c and L, once) gets one gradient per score, which nothing sums. torch turns
    an index t[0] into the scatter (with an atomic add) that does."""
    returned = next(n for n in graph.nodes if n.op == "output").args[0]
    if not isinstance(returned, (list, tuple)):  # score_mod's forward graph, or a mask graph
        return []
    scatter = torch.ops.flex_lib.zeros_and_scatter.default
    return [g for g in returned[1:] if g is not None and g.target is not scatter]  # [0]: the score's own


@pytest.mark.parametrize("variant", [*LEARNED, ("sink", "t5")], ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_flex_training_gradients_equal_the_reference(variant, monkeypatch):
    """The table flex reads in training gives the reference's logits and every parameter's gradient (flex eager)."""
    monkeypatch.setattr(flex_api, "_validate_device", lambda *a: None)  # flex's unfused backward runs on the CPU
    name, inner = (variant, None) if isinstance(variant, str) else variant
    kw = {"positional": {"name": "sink", "inner": {"name": inner}}} if inner else {}
    flex, ref = random_model(name, attn_backend="flex", **kw), random_model(name, attn_backend="reference", **kw)
    assert_same_logits_and_grads(flex, ref, torch.randint(0, 97, (2, 131), generator=torch.Generator().manual_seed(2)))
