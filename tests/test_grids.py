"""Multi-axis positions: M-RoPE on text is RoPE, axial 2D RoPE is relative in (dy, dx), 2D/3D sinusoids
are per-axis sinusoids, grid data round-trips with its position ids, KV and sink caches decode multi-axis positions
exactly, bad positions fail clearly, and the grid evaluation scores what it says."""

import numpy as np
import pytest
import torch
from conftest import ROOT, random_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import positional
from data import grids
from data.loader import RowSampler, TokenSplit, select_axes
from data.prepare import prepare
from evaluation.grids import held_out_grids, score_size, training_first_rows
from model.kv_cache import DenseCache, SinkCache
from model.static_decode import StaticDecoder
from positional import PositionAxesError
from utils import checks
from utils.errors import UserError

T = 24
MULTI_AXIS = ["rope2d", "mrope", "sinusoidal2d", "sinusoidal3d"]
GRID = {"name": "grids", "source": "grids", "height": 4, "width": 5, "rule": 30, "density": 0.5, "seed": 3,
        "train_docs": 12, "val_docs": 5, "bos_aligned": True}  # fmt: skip


def tokens(seed=1, batch=2, length=T):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def image_ids(length=T, axes=3, seed=0):
    """M-RoPE-style ids: a text token, then an image of 4 x 5 at temporal id 1, then text again after its largest id."""
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(5), indexing="ij")
    image = torch.stack((torch.ones(20, dtype=torch.long), 1 + rows.flatten(), 1 + cols.flatten()))
    after = 6 + torch.arange(length - 21)
    ids = torch.cat((torch.zeros(3, 1, dtype=torch.long), image, after.expand(3, -1)), dim=1)
    return ids[-axes:]


def rope_twin(name):
    """A rope model and a model of `name` with exactly its weights."""
    rope, other = random_model("rope"), random_model(name)
    other.load_state_dict(rope.state_dict())
    return rope, other


# ---- M-RoPE: text is RoPE ----


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_on_text_is_exactly_rope(interleaved):
    """One id per token, or the same id on every axis, turns every pair at RoPE's angle: the same logits bit for bit,
    in a full forward and through a cache; an image's ids (different per axis) do change them."""
    rope = random_model("rope")
    mrope = random_model("mrope", positional={"name": "mrope", "interleaved": interleaved})
    mrope.load_state_dict(rope.state_dict())
    idx, pos = tokens(), torch.arange(T)
    want = rope(idx)
    assert torch.equal(mrope(idx), want)
    assert torch.equal(mrope(idx, pos=pos.expand(3, -1).clone()), want)
    cache = DenseCache(mrope, 2, 64)
    decoded = torch.cat(
        [mrope.decode(idx[:, t : t + 1], cache, pos=pos.expand(3, -1)[:, t : t + 1]) for t in range(T)], 1
    )
    assert torch.allclose(decoded, want, atol=1e-5)
    assert not torch.allclose(mrope(idx, pos=image_ids()), want, atol=1e-3)


def test_mrope_sections_follow_qwen2_vl():
    pe = positional.build({"name": "mrope"}, 4, 128, 512)
    assert pe.sections == [16, 24, 24]  # Qwen2-VL's mrope_section for head dim 128
    assert pe.pair_axis.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    assert torch.equal(pe.inv_freq, positional.build({"name": "rope"}, 4, 128, 512).inv_freq)  # RoPE's frequencies
    assert positional.build({"name": "mrope"}, 4, 32, 128).sections == [4, 6, 6]
    with pytest.raises(ValueError, match="positional.sections"):
        positional.build({"name": "mrope", "sections": [4, 4, 4]}, 4, 32, 128)
    mixed = positional.build({"name": "mrope", "interleaved": True}, 4, 32, 128)  # Qwen3-VL's idea: round-robin
    assert mixed.pair_axis.tolist() == [0, 1, 2] * 5 + [0] and mixed.sections == [6, 5, 5]
    with pytest.raises(ValueError, match="drop one"):
        positional.build({"name": "mrope", "interleaved": True, "sections": [4, 6, 6]}, 4, 32, 128)


# ---- axial 2D RoPE: relative in (dy, dx) ----


def scores(pe, q, k, q_ids, k_ids):
    return pe.rotate(q, q_ids) @ pe.rotate_key(k, k_ids).transpose(-2, -1)


def test_rope2d_scores_depend_only_on_the_offset_per_axis():
    pe = positional.build({"name": "rope2d"}, 2, 16, 32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 9, 16, generator=g)
    q_ids, k_ids = torch.randint(0, 20, (2, 6), generator=g), torch.randint(0, 20, (2, 9), generator=g)
    base = scores(pe, q, k, q_ids, k_ids)
    shift = torch.tensor([[7], [-3]])  # both axes, by different amounts: every (dy, dx) kept
    assert torch.allclose(scores(pe, q, k, q_ids + shift, k_ids + shift), base, atol=1e-4)
    for axis in (0, 1):  # one key moved along one axis: that key's scores change, the others' do not
        moved = k_ids.clone()
        moved[axis, 4] += 1
        changed = scores(pe, q, k, q_ids, moved)
        assert not torch.allclose(changed[..., 4], base[..., 4], atol=1e-3), axis
        assert torch.allclose(
            torch.cat((changed[..., :4], changed[..., 5:]), -1),
            torch.cat((base[..., :4], base[..., 5:]), -1),
            atol=1e-5,
        )
    swapped = k_ids.flip(0)  # rows and columns are not interchangeable: (dy, dx) != (dx, dy)
    assert not torch.allclose(scores(pe, q, k, q_ids.flip(0), swapped), base, atol=1e-3)


def test_rope2d_lays_both_axes_over_the_whole_frequency_range():
    """Axial RoPE (Heo et al. 2024): rows take the first half of the pairs, columns the second, each at the
    frequencies of a head half as wide."""
    pe, half = positional.build({"name": "rope2d"}, 2, 16, 32), positional.build({"name": "rope"}, 2, 8, 16)
    assert torch.equal(pe.inv_freq, torch.cat((half.inv_freq, half.inv_freq)))
    assert pe.pair_axis.tolist() == [0] * 4 + [1] * 4


def test_rope2d_model_is_translation_invariant_in_2d():
    model, idx, ids = random_model("rope2d"), tokens(), image_ids(axes=2)
    assert torch.allclose(model(idx, pos=ids), model(idx, pos=ids + torch.tensor([[5], [11]])), atol=1e-4)


# ---- 2D / 3D sinusoids ----


def vaswani(pos, dim, base=10000.0):
    """PE(p, 2i) = sin(p / base^(2i/dim)), PE(p, 2i+1) = cos(p / base^(2i/dim)), written out."""
    out = torch.zeros(len(pos), dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = pos.double() / base ** (2 * i / dim)
        out[:, 2 * i], out[:, 2 * i + 1] = angle.sin(), angle.cos()
    return out


@pytest.mark.parametrize("name, d_model, widths", [("sinusoidal2d", 32, [16, 16]), ("sinusoidal3d", 32, [12, 10, 10]),
                                                   ("sinusoidal3d", 128, [44, 42, 42])])  # fmt: skip
def test_axial_sinusoids_are_each_axis_sinusoids_concatenated(name, d_model, widths):
    pe = positional.build({"name": name, "scale": 0.5}, 4, d_model // 4, d_model)
    ids = torch.randint(0, 300, (len(widths), 7), generator=torch.Generator().manual_seed(1))
    want = torch.cat([vaswani(ids[a], w) for a, w in enumerate(widths)], dim=-1)
    assert pe.widths == widths
    torch.testing.assert_close(pe.vectors(ids).double(), want, atol=1e-5, rtol=0)
    x = torch.randn(2, 7, d_model)
    torch.testing.assert_close(pe.embed(x, ids), x + 0.5 * want.float())
    assert torch.equal(pe.vectors(ids[0]), pe.vectors(ids[0].expand(len(widths), -1)))  # (T,): the id on every axis


# ---- grid data ----


def test_grid_data_round_trips(tmp_path):
    """generate -> shard -> load: the documents are the seeded grids, each row the rule of the one above, and the
    loader hands back the stored ids, the part each scheme reads."""
    folder = prepare({**GRID, "cache_dir": str(tmp_path)}, {"kind": "bpe", "vocab_size": 4096}, log=None)
    split = TokenSplit(folder, "train")
    rng = np.random.default_rng([3, 0])
    n = 1 + 4 * 7
    for i in range(12):
        doc = split.document(i)
        assert np.array_equal(doc, grids.tokens(grids.random_grid(rng, 4, 5, 30, 0.5)))
        s, lo, hi = split._locate(i)  # the document's stored position ids
        assert np.array_equal(split.positions[s][:, lo:hi], grids.positions(4, 5)) and len(doc) == n
        cells = doc[1:].reshape(4, 7)[:, 1:-1]  # the grid's cells, less BOS and the two walls of each row
        for r in range(1, 4):  # rule 30, written out: left XOR (centre OR right), dead past the walls
            above = np.pad(cells[r - 1], 1)
            assert np.array_equal(cells[r], above[:-2] ^ (above[1:-1] | above[2:])), (i, r)
    assert grids.positions(4, 5)[:, :8].tolist() == [[0, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1],
                                                     [0, 1, 2, 3, 4, 5, 6, 7]]  # fmt: skip
    assert split.position_axes == 3 and TokenSplit(folder, "val").document(0).size == n
    rows = RowSampler(split, n - 1, seed=0, axes=3)
    x, y = rows.batch(0, 4)
    assert rows.n_rows == 12 and all(
        any(np.array_equal(r, split.document(i)[:-1]) for i in range(12)) for r in x.numpy()
    )
    assert torch.equal(rows.positions(0, 4), torch.from_numpy(grids.positions(4, 5)[:, :-1]))
    assert torch.equal(
        RowSampler(split, n - 1, 0, axes=2).positions(0, 4), torch.from_numpy(grids.positions(4, 5)[1:, :-1])
    )
    assert RowSampler(split, n - 1, 0, axes=1).positions(0, 4) is None  # the token order: raster
    with pytest.raises(UserError, match=f"train.seq_len={n - 1}"):
        RowSampler(split, 32, 0)


def test_grid_options_fail_with_one_line_naming_the_key():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["data=grids", "data.rule=300", "out_dir=x"])
    with pytest.raises(UserError, match="data.rule=300 must be <= 255"):
        checks.check(cfg)
    with pytest.raises(UserError, match="train.seq_len=28") as e:
        grids.GridsData.check_rows(OmegaConf.create({**GRID, "height": 5}), 28)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="cannot read"):
        select_axes(grids.positions(2, 2), 4)


# ---- caches ----


@pytest.mark.parametrize("name", MULTI_AXIS)
def test_kv_cache_decoding_equals_full_forward_at_multi_axis_positions(name):
    model, idx = random_model(name), tokens()
    ids = image_ids(axes=model.pe.axes)
    full = model(idx, pos=ids)
    step = DenseCache(model, 2, 64)
    one_by_one = torch.cat([model.decode(idx[:, t : t + 1], step, pos=ids[:, t : t + 1]) for t in range(T)], dim=1)
    chunked, pieces = DenseCache(model, 2, 64), []
    for a, b in ((0, 9), (9, 11), (11, T)):
        pieces.append(model.decode(idx[:, a:b], chunked, pos=ids[:, a:b]))
    assert torch.allclose(full, one_by_one, atol=1e-4) and torch.allclose(full, torch.cat(pieces, 1), atol=1e-4)
    assert not torch.allclose(full, model(idx), atol=1e-3)  # the ids matter: text positions give other logits
    if model.pe.relative:  # a sink cache that holds everything is a dense cache
        sink = SinkCache(model, 2, 4, T)
        assert torch.allclose(
            torch.cat([model.decode(idx[:, t : t + 1], sink, pos=ids[:, t : t + 1]) for t in range(T)], 1),
            full,
            atol=1e-4,
        )
        with pytest.raises(Exception, match="static=false"):
            StaticDecoder(model, sink, compile=False)(idx[:, :1])


def test_windows_read_the_token_order_not_the_ids():
    """model.window counts tokens in the order they come (the mask's order), not rows or columns: a windowed rope2d
    model decodes as its full forward does, and the window changes what it computes."""
    idx, ids = tokens(), image_ids(axes=2)
    windowed = random_model("rope2d", window=5, window_pattern="SL")
    full = windowed(idx, pos=ids)
    cache = DenseCache(windowed, 2, 64)
    step = torch.cat([windowed.decode(idx[:, t : t + 1], cache, pos=ids[:, t : t + 1]) for t in range(T)], 1)
    assert torch.allclose(step, full, atol=1e-4)
    assert not torch.allclose(full, random_model("rope2d")(idx, pos=ids), atol=1e-3)


def test_a_learned_sink_token_around_mrope_takes_ids_too():
    """positional=sink over mrope: the sink token sits just before the first id on every axis, in a full forward and
    in a cache."""
    model = random_model("sink", positional={"name": "sink", "inner": {"name": "mrope"}})
    idx, ids = tokens(), image_ids()
    assert model.pe.axes == 3
    cache = DenseCache(model, 2, 64)
    step = torch.cat([model.decode(idx[:, t : t + 1], cache, pos=ids[:, t : t + 1]) for t in range(T)], 1)
    assert torch.allclose(step, model(idx, pos=ids), atol=1e-4)


@pytest.mark.parametrize("name", ["mrope", "rope2d"])
def test_sink_cache_reindexes_multi_axis_ids_exactly(name):
    """Past capacity, a one-layer model's logits equal a fresh forward over the kept tokens (4 sinks, the last 8) at
    the kept ids, the window's shifted on every axis so that its smallest id follows the sinks'."""
    model, idx = random_model(name, n_layer=1), tokens(batch=1, length=T)
    ids = image_ids(axes=model.pe.axes)
    cache = SinkCache(model, 1, 4, 8)
    last = torch.cat([model.decode(idx[:, t : t + 1], cache, pos=ids[:, t : t + 1]) for t in range(T)], 1)[:, -1]
    window = ids[:, -8:]
    kept_ids = torch.cat((ids[:, :4], window - (window.min() - 4)), dim=1)
    kept = torch.cat((idx[:, :4], idx[:, -8:]), dim=1)
    assert torch.allclose(last, model(kept, pos=kept_ids)[:, -1], atol=1e-5)


def test_mrope_streams_text_exactly_as_rope():
    """Text through a sink cache far past its capacity: M-RoPE's re-indexed ids are RoPE's in-cache positions."""
    rope, mrope = rope_twin("mrope")
    idx = tokens(batch=1, length=40)
    caches = [SinkCache(m, 1, 4, 8) for m in (rope, mrope)]
    a, b = (
        torch.cat([m.decode(idx[:, t : t + 1], c) for t in range(40)], 1)
        for m, c in zip((rope, mrope), caches, strict=True)
    )
    assert torch.equal(a, b)


# ---- bad input ----


def test_positions_a_scheme_cannot_read_fail_clearly():
    idx = tokens()
    with pytest.raises(PositionAxesError, match=r"positional=rope reads one position per token.*\(2, 24\)"):
        random_model("rope")(idx, pos=image_ids(axes=2))
    with pytest.raises(PositionAxesError, match=r"positional=sinusoidal reads one position per token"):
        random_model("sinusoidal")(idx, pos=image_ids(axes=3))
    with pytest.raises(PositionAxesError, match=r"positional=rope2d reads positions of shape \(T,\) or \(2, T\)"):
        random_model("rope2d")(idx, pos=image_ids(axes=3))
    with pytest.raises(PositionAxesError, match="for 25 tokens"):
        random_model("mrope")(tokens(length=25), pos=image_ids())
    with pytest.raises(PositionAxesError, match="decode takes pos=.* only for a multi-axis scheme"):
        rope = random_model("rope")
        rope.decode(idx, DenseCache(rope, 2, 64), pos=torch.arange(T)[None])


# ---- the grid evaluation ----


class Oracle(torch.nn.Module):
    """Stands in for a model on a grid: sure of the next token everywhere but row 0 (uniform there), and, if
    wrong_walls, sure of the wrong token where a wall comes next."""

    def __init__(self, wrong_walls: bool):
        super().__init__()
        self.pe, self.wrong_walls = positional.build({"name": "rope"}, 1, 4, 4), wrong_walls

    def forward(self, x, pos=None):
        nxt = torch.cat((x[:, 1:], torch.full_like(x[:, :1], grids.RIGHT)), dim=1)  # the last target: a right wall
        if self.wrong_walls:
            nxt = torch.where(nxt >= grids.LEFT, grids.DEAD, nxt)
        logits = 30.0 * torch.nn.functional.one_hot(nxt, len(grids.CHARS) + 1).float()
        logits[:, : GRID["width"] + 2] = 0  # row 0 (its targets): a guess
        return logits


def test_grid_score_reads_rows_after_the_first_and_cells_for_accuracy():
    perfect = score_size(Oracle(False), GRID, 4, 5, 6, seed=0, device="cpu")
    assert perfect["nll"] < 1e-6 and perfect["cell_accuracy"] == 1.0  # row 0, where it guesses, is not scored
    assert perfect["scored_tokens"] == 3 * 7
    walls = score_size(Oracle(True), GRID, 4, 5, 6, seed=0, device="cpu")
    assert walls["cell_accuracy"] == 1.0 and walls["nll"] > 5  # walls are scored for NLL, not for accuracy
    by_column = walls["nll_by_column"]  # columns 0 and width + 1 are the walls
    assert len(by_column) == 7 and min(by_column[0], by_column[-1]) > 20 and max(by_column[1:-1]) < 1e-6


def test_held_out_grids_never_start_like_a_training_grid():
    seen = training_first_rows(GRID)
    held = held_out_grids(GRID, 6, 5, 10, seed=1)
    assert len(seen) > 5 and not {g[0].tobytes() for g in held} & seen
    assert np.array_equal(held, held_out_grids(GRID, 6, 5, 10, seed=1))  # seeded
    assert all(np.array_equal(g, grids.evolve(g[0], 6, 30)) for g in held)
