"""ROIAlign against a NumPy reference (2x2 bilinear samples per bin, averaged)."""
import numpy as np
import pytest

from training.model.roi_align import fpn_level_of, multilevel_roi_align, roi_align


def _bilinear(feat, y, x):
    """Sample ``feat [H, W, C]`` at index coordinates (y, x); zero outside [0, H-1] x [0, W-1]."""
    h, w = feat.shape[:2]
    if y < 0 or y > h - 1 or x < 0 or x > w - 1:
        return np.zeros(feat.shape[2], np.float64)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * feat[y0, x0] + (1 - ly) * lx * feat[y0, x1]
            + ly * (1 - lx) * feat[y1, x0] + ly * lx * feat[y1, x1])


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


@pytest.mark.parametrize("stride", [1, 4])
def test_roi_align_matches_numpy_reference(tf_session, stride):
    tf, sess = tf_session
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(2, 12, 10, 3)).astype(np.float32)
    boxes = np.array([[4.0, 6.0, 30.0, 25.0], [1.5, 2.5, 9.0, 7.0], [10.0, 8.0, 38.0, 45.0]], np.float32) * (stride / 4)
    idx = np.array([0, 1, 1], np.int32)
    out = sess.run(roi_align(tf.constant(feats), tf.constant(boxes), tf.constant(idx), stride=stride, output_size=3))
    assert out.shape == (3, 3, 3, 3)
    for k in range(3):
        ref = reference_roi_align(feats[idx[k]], boxes[k], stride, 3)
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4)


def test_fpn_levels_and_multilevel_order(tf_session):
    tf, sess = tf_session
    boxes = np.array([[0, 0, 224, 224], [0, 0, 20, 20], [0, 0, 112, 112], [0, 0, 900, 900]], np.float32)
    levels = sess.run(fpn_level_of(tf.constant(boxes), canonical_size=224.0))
    np.testing.assert_array_equal(levels, [2, 0, 1, 3])  # P4, P2, P3, P5
    rng = np.random.default_rng(1)
    feats = [rng.normal(size=(1, 64 // s, 64 // s, 2)).astype(np.float32) for s in (4, 8, 16, 32)]
    small = np.array([[8, 8, 40, 40], [4, 4, 20, 30], [30, 2, 60, 50]], np.float32)
    out = sess.run(multilevel_roi_align([tf.constant(f) for f in feats], tf.constant(small), tf.zeros([3], tf.int32),
                                        output_size=2, canonical_size=64.0))
    lv = sess.run(fpn_level_of(tf.constant(small), canonical_size=64.0))
    for k in range(3):
        ref = reference_roi_align(feats[lv[k]][0], small[k], (4, 8, 16, 32)[lv[k]], 2)
        np.testing.assert_allclose(out[k], ref, rtol=1e-4, atol=1e-4)
