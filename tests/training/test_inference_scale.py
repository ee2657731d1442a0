"""Detections go back to the original image along each axis by the resize's own scale."""
import numpy as np

from training.config import finalize, new_config
from training.inference import detect_batch


def test_boxes_are_divided_by_each_axis_scale_of_the_resize():
    cfg = finalize(new_config(), num_ranks=1, class_names=["BG", "thing"], has_gpu=False)
    cfg.freeze(False)
    cfg.MODE_MASK = False
    image = np.zeros((480, 640, 3), np.uint8)
    seen = []

    def predict_fn(batch, image_hw):
        seen.append(image_hw.tolist())
        return (np.array([[533.5, 400.0, 1067.0, 800.0]], np.float32), np.array([0.9], np.float32),
                np.array([1], np.int32), np.zeros((1, 1, 1), np.float32), [1])

    (det,) = detect_batch(predict_fn, [image], cfg)
    # 480x640 -> 800 x 1066.67, rounded to 800x1067: sx = 1067/640, sy = 800/480 = 5/3. The network's
    # right-bottom quarter [533.5, 400, 1067, 800] is the image's [320, 240, 640, 480]; tensorpack's
    # single scale sqrt(sx * sy) = 1.66693 would give [320.05, 239.96, 640.09 (clipped to 640), 479.92].
    assert seen == [[[800, 1067]]]
    np.testing.assert_allclose(det["boxes"], [[320, 240, 640, 480]], rtol=1e-6)
