"""ROIAlign against a NumPy reference of tensorpack's ROIAlign (examples/FasterRCNN/modeling/model_box.py).

tensorpack's ``roi_align`` averages 2x2 bilinear samples per bin, placed at the centres of the
bin's four sub-bins. ``multilevel_roi_align`` divides image boxes by the level's stride and
``crop_and_resize`` subtracts 0.5, so image coordinate ``u`` is feature index ``u / stride - 0.5``
(cell ``i`` centred at ``(i + 0.5) * stride``). With ``pad_border=True`` it pads the feature map by
one edge-replicated cell on each side (``tf.pad(..., mode='SYMMETRIC')``, boxes shifted by one):
a sample between index -1 and 0 (or H-1 and H) reads the edge value, and ``tf.image.crop_and_resize``
returns 0 for a sample outside the padded map (index < -1 or > H).
"""
import numpy as np
import pytest

from training.model.roi_align import fpn_level_of, multilevel_roi_align, roi_align


def _bilinear(feat, y, x):
    """Sample ``feat [H, W, C]`` at index coordinates (y, x) as tensorpack does: on the map padded by
    one edge-replicated cell on each side, zero outside that padded map."""
    padded = np.pad(feat.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="edge")
    y, x = y + 1, x + 1  # index coordinates on the padded map
    h, w = padded.shape[:2]
    if y < 0 or y > h - 1 or x < 0 or x > w - 1:
        return np.zeros(feat.shape[2], np.float64)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * padded[y0, x0] + (1 - ly) * lx * padded[y0, x1]
            + ly * (1 - lx) * padded[y1, x0] + ly * lx * padded[y1, x1])


def reference_roi_align(feat, box, stride, size):
    x1, y1, x2, y2 = box
    bw, bh = (x2 - x1) / size, (y2 - y1) / size
    out = np.zeros((size, size, feat.shape[2]))
    for i in range(size):
        for j in range(size):
            acc = 0
            for sy in (0.25, 0.75):
                for sx in (0.25, 0.75):
                    # image point -> feature index coordinate (cell k is centred at (k + 0.5) * stride)
                    y = (y1 + (i + sy) * bh) / stride - 0.5
                    x = (x1 + (j + sx) * bw) / stride - 0.5
                    acc = acc + _bilinear(feat, y, x)
            out[i, j] = acc / 4
    return out


def _roi_align(tf, sess, feats, boxes, idx, *, stride, size):
    return sess.run(roi_align(tf.constant(feats, tf.float32), tf.constant(boxes, tf.float32),
                              tf.constant(idx, tf.int32), stride=stride, output_size=size))


@pytest.mark.parametrize("stride", [1, 4])
def test_roi_align_matches_numpy_reference(tf_session, stride):
    tf, sess = tf_session
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(2, 12, 10, 3)).astype(np.float32)
    boxes = np.array([[4.0, 6.0, 30.0, 25.0], [1.5, 2.5, 9.0, 7.0], [10.0, 8.0, 38.0, 45.0]], np.float32) * (stride / 4)
    idx = np.array([0, 1, 1], np.int32)
    out = _roi_align(tf, sess, feats, boxes, idx, stride=stride, size=3)
    assert out.shape == (3, 3, 3, 3)
    for k in range(3):
        ref = reference_roi_align(feats[idx[k]], boxes[k], stride, 3)
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4)


def test_roi_align_at_the_image_border_matches_numpy_reference(tf_session):
    """Boxes starting at 0, covering the whole map, ending on / past the last cell and starting
    before the first: samples up to one cell outside the outer centres read the edge values, samples
    further out read 0."""
    tf, sess = tf_session
    rng = np.random.default_rng(2)
    stride = 4
    feats = rng.normal(size=(1, 6, 5, 2)).astype(np.float32)   # image 24 x 20 (h x w)
    boxes = np.array([[0, 0, 8, 8],            # at the top-left corner
                      [0, 0, 20, 24],          # the whole image
                      [12, 16, 20, 24],        # at the bottom-right corner
                      [14, 18, 30, 34],        # past the last cell
                      [-9, -7, 6, 5]],         # before the first cell
                     np.float32)
    out = _roi_align(tf, sess, feats, boxes, np.zeros(5), stride=stride, size=2)
    for k in range(len(boxes)):
        ref = reference_roi_align(feats[0], boxes[k], stride, 2)
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-5, err_msg=f"box {boxes[k]}")


def test_roi_align_border_by_hand(tf_session):
    """A constant map of ones: every sample within one cell of the outer centres reads 1, so the
    whole-image box pools to 1 everywhere; a bin whose right samples fall beyond the padded map
    (index > W) averages 1, 0, 1, 0 = 0.5."""
    tf, sess = tf_session
    ones = np.ones((1, 4, 4, 1), np.float32)    # stride 1: cell k centred at k + 0.5
    # box x 3..7, y 0..4, one bin: samples x at 3 + 1 - 0.5 = 3.5 (past the last centre 3, within one
    # cell: 1) and 3 + 3 - 0.5 = 5.5 (past index 4: 0); y at 0.5 and 2.5 (inside)
    boxes = np.array([[0, 0, 4, 4], [3, 0, 7, 4]], np.float32)
    whole = _roi_align(tf, sess, ones, boxes[:1], [0], stride=1, size=4)
    np.testing.assert_allclose(whole, np.ones((1, 4, 4, 1)), atol=1e-6)
    overhang = _roi_align(tf, sess, ones, boxes[1:], [0], stride=1, size=1)
    np.testing.assert_allclose(overhang, [[[[0.5]]]], atol=1e-6)


def test_feature_cell_i_is_centred_at_i_plus_half_stride(tf_session):
    """On a map whose value is its column index, a zero-width box at image x = (i + 0.5) * stride
    samples column i exactly (tensorpack: x / stride - 0.5), first and last cell included."""
    tf, sess = tf_session
    stride = 8
    cols = np.broadcast_to(np.arange(6, dtype=np.float32), (1, 5, 6))[..., None]
    centres = (np.array([0, 2, 2.5, 5]) + 0.5) * stride
    boxes = np.stack([centres, np.full(4, 12.0), centres, np.full(4, 13.0)], axis=1)
    out = _roi_align(tf, sess, cols, boxes, np.zeros(4), stride=stride, size=1)
    np.testing.assert_allclose(out[:, 0, 0, 0], [0, 2, 2.5, 5], atol=1e-5)


def test_fpn_level_boundaries_match_tensorpack(tf_session):
    """tensorpack's fpn_map_rois_to_levels: level = floor(4 + log2(sqrt(area) / 224 + 1e-6)),
    <= 2 -> P2, >= 5 -> P5. sqrt(area) 224 gives 4 + log2(1 + 1e-6) > 4 -> P4, just under 224 -> P3;
    112 -> 3 + 4.3e-6 -> P3, 448 -> P5; a zero-area box -> P2."""
    tf, sess = tf_session
    sides = [10, 111.9, 112, 223.9, 224, 447.9, 448, 2000]
    boxes = np.array([[5, 7, 5 + s, 7 + s] for s in sides] + [[3, 3, 3, 9]], np.float32)
    levels = sess.run(fpn_level_of(tf.constant(boxes), canonical_size=224.0))
    np.testing.assert_array_equal(levels, [0, 0, 1, 1, 2, 2, 3, 3, 0])   # P2, P2, P3, P3, P4, P4, P5, P5, P2


def test_fpn_levels_and_multilevel_order(tf_session):
    tf, sess = tf_session
    boxes = np.array([[0, 0, 224, 224], [0, 0, 20, 20], [0, 0, 112, 112], [0, 0, 900, 900]], np.float32)
    levels = sess.run(fpn_level_of(tf.constant(boxes), canonical_size=224.0))
    np.testing.assert_array_equal(levels, [2, 0, 1, 3])  # P4, P2, P3, P5
    rng = np.random.default_rng(1)
    feats = [rng.normal(size=(1, 64 // s, 64 // s, 2)).astype(np.float32) for s in (4, 8, 16, 32)]
    small = np.array([[8, 8, 40, 40], [4, 4, 20, 30], [30, 2, 60, 50], [0, 40, 64, 64]], np.float32)
    out = sess.run(multilevel_roi_align([tf.constant(f) for f in feats], tf.constant(small), tf.zeros([4], tf.int32),
                                        output_size=2, canonical_size=64.0))
    lv = sess.run(fpn_level_of(tf.constant(small), canonical_size=64.0))
    for k in range(4):
        ref = reference_roi_align(feats[lv[k]][0], small[k], (4, 8, 16, 32)[lv[k]], 2)
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4)
