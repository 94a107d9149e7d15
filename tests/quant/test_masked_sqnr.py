"""Output SQNR under an attention mask counts the positions the mask keeps: a padded position's output is read
by nothing downstream (minilm_l6 W8A8: last_hidden_state 6.8 dB over all positions, 20.3 dB over the valid ones,
while its pooled sentence embedding kept cosine 0.996). Anything that is not a 0/1 mask of the output's leading
[batch, sequence] dims leaves every position counted."""
import numpy as np

from qcompiler.quant import quantize
from qcompiler.quant.interop.report import OutputError, valid_positions
from tests.quant.test_additive_masks import _attention


def _pair():
    r = np.random.default_rng(0)
    ref = r.standard_normal((2, 6, 4)).astype(np.float32)
    got = ref + 0.01 * r.standard_normal(ref.shape).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], np.int64)
    got[mask == 0] += 100.0          # garbage where the mask says padding
    return ref, got, mask


def test_padding_is_not_counted():
    ref, got, mask = _pair()
    everywhere, valid = OutputError(), OutputError()
    everywhere.update(ref, got)
    valid.update(ref, got, {"attention_mask": mask, "input_ids": np.zeros((2, 6), np.int64)})
    assert everywhere.sqnr_db() < 0 and valid.sqnr_db() > 35


def test_what_is_not_a_mask_counts_everything():
    ref, _, mask = _pair()
    assert valid_positions({"attention_mask": mask}, ref).sum() == 7
    assert valid_positions({"input_ids": mask}, ref) is None                     # not named a mask
    assert valid_positions({"attention_mask": mask * 2}, ref) is None            # not 0/1
    assert valid_positions({"attention_mask": mask.astype(np.float32)}, ref) is None
    assert valid_positions({"attention_mask": np.ones_like(mask)}, ref) is None  # no padding
    assert valid_positions({"attention_mask": mask[:, :5]}, ref) is None         # other dims
    assert valid_positions({"attention_mask": mask}, ref[:, :, 0].T) is None


def test_report_names_the_masked_outputs():
    m, feeds = _attention(-1e4, False)
    res = quantize(m, feeds, progress=False)
    assert res.report["sqnr_masked_outputs"] == ["y"]
    for f in feeds:
        f["mask"][:] = 1
    assert quantize(m, feeds, progress=False).report["sqnr_masked_outputs"] == []
