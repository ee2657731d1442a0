"""Export a trained checkpoint as a TensorFlow SavedModel that takes an encoded image and returns
detections in that image's pixels, so that a client (or the serving container) needs only TensorFlow.

    maskrcnn export --checkpoint train_log/run1 --output exported/run1

--checkpoint is a log dir (its latest checkpoint) or a checkpoint prefix, as for training.predict;
the run's config.json next to it rebuilds the model. A published model file (tensorpack's .npz,
e.g. COCO-R50FPN-MaskRCNN-Standard.npz) exports as training.predict runs it: the default config,
COCO's classes for 81 class outputs, or --split NAME's (with --config DATA.BASEDIR=...); its
config.json is written from that config. The export directory holds the SavedModel
(saved_model.pb, variables/), ``classes.json`` (the dataset's category ids and names) and the run's
``config.json``. Its one signature, ``serving_default``, runs what ``training.predict`` runs around
the network, inside the graph:

    input   image_bytes   string scalar: a JPEG or PNG file's bytes
    outputs boxes         float32 [N, 4]  x1, y1, x2, y2 in the image's pixels
            classes       int32 [N]       the dataset's category ids (config.json's _category_ids)
            class_names   string [N]
            scores        float32 [N]
            masks         uint8 [N, H, W] 0/1 at the image's resolution (with MODE_MASK; else [N, 1, 1] zeros)

Before the network: decode to BGR (OpenCV's order, which the model was trained on), resize the
short edge to PREPROC.TEST_SHORT_EDGE_SIZE within PREPROC.MAX_SIZE (bilinear, the sizes rounded
half up as training.data.augment and tensorpack round them), pad to a multiple of 32. After: boxes
scaled back and clipped to the image, masks pasted at the image's resolution as
MRCNN.ACCURATE_PASTE says, by the very ops training.predict pastes with
(training.model.mask_head.paste_masks_graph, on the CPU). JPEG is decoded
with the accurate integer DCT, OpenCV's, so pixels match what training.predict reads; the resize
rounds like OpenCV's only to within one grey level, so boxes can differ from training.predict's by a
fraction of a pixel. An EXIF orientation is applied, as OpenCV applies it (training/exif.py).

The graph is built for this machine's backbone data format (NHWC on CPU); it runs on a GPU too.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

SIGNATURE = "serving_default"
INPUT_NAME = "image_bytes"
OUTPUT_KEYS = ("boxes", "classes", "class_names", "scores", "masks")
CLASSES_FILE = "classes.json"     # {"categories": [{"id": category id, "name": ...}, ...]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="maskrcnn export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="log dir, checkpoint prefix (model-STEP) or model file (tensorpack .npz)")
    p.add_argument("--split", help="with a model file: the dataset split whose classes the file was trained on "
                                   "(default: COCO's 80 for a file with 81 class outputs)")
    p.add_argument("--output", required=True, help="directory to create for the SavedModel (must not exist, or be empty)")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides (e.g. TEST.RESULT_SCORE_THRESH=0.3)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------ graph pieces
def decode_bgr(tf, image_bytes):
    """[H, W, 3] uint8 BGR from JPEG/PNG (also GIF/BMP) bytes; grey and RGBA files give 3 channels.
    A JPEG or PNG comes turned as its EXIF orientation says, as cv2.imread gives it."""
    from training.exif import apply_orientation, orientation

    rgb = tf.cond(tf.io.is_jpeg(image_bytes),
                  # INTEGER_ACCURATE: libjpeg's default (ISLOW), the one OpenCV uses; TensorFlow's own
                  # default is the fast DCT, whose pixels differ by a few grey levels.
                  lambda: tf.io.decode_jpeg(image_bytes, channels=3, dct_method="INTEGER_ACCURATE"),
                  lambda: tf.io.decode_image(image_bytes, channels=3, dtype=tf.uint8, expand_animations=False))
    rgb.set_shape([None, None, 3])
    rgb = apply_orientation(tf, rgb, orientation(tf, image_bytes))
    rgb.set_shape([None, None, 3])
    return tf.reverse(rgb, axis=[-1])


def resized_hw(tf, height, width, short_size: float, max_size: float):
    """training.data.augment.resized_shape in the graph: the same float64 arithmetic and the same
    rounding half up, so the sizes are identical."""
    h, w = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    short = tf.constant(float(short_size), tf.float64)
    scale = short / tf.minimum(h, w)
    new_h = tf.where(h < w, short, scale * h)
    new_w = tf.where(h < w, scale * w, short)
    if max_size:
        longest = tf.maximum(new_h, new_w)
        shrink = tf.constant(float(max_size), tf.float64) / longest
        new_h = tf.where(longest > max_size, new_h * shrink, new_h)
        new_w = tf.where(longest > max_size, new_w * shrink, new_w)
    new_h = tf.maximum(1, tf.cast(tf.floor(new_h + 0.5), tf.int32))
    new_w = tf.maximum(1, tf.cast(tf.floor(new_w + 0.5), tf.int32))
    return new_h, new_w


def preprocess(tf, image_bytes, cfg):
    """``(batch [1, Hp, Wp, 3] uint8, image_hw [1, 2], (sx, sy) float32, (height, width))``, as
    training.data.pipeline.prepare_test_image prepares a decoded image."""
    from training.data.examples import SIZE_DIVISOR
    image = decode_bgr(tf, image_bytes)
    height, width = tf.shape(image)[0], tf.shape(image)[1]
    new_h, new_w = resized_hw(tf, height, width, cfg.PREPROC.TEST_SHORT_EDGE_SIZE, cfg.PREPROC.MAX_SIZE)
    # Bilinear with half-pixel centres and no antialiasing: cv2.resize's INTER_LINEAR.
    resized = tf.image.resize(image[None], tf.stack([new_h, new_w]), method="bilinear", antialias=False)
    resized = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
    pad_h = (new_h + SIZE_DIVISOR - 1) // SIZE_DIVISOR * SIZE_DIVISOR - new_h
    pad_w = (new_w + SIZE_DIVISOR - 1) // SIZE_DIVISOR * SIZE_DIVISOR - new_w
    batch = tf.pad(resized, [[0, 0], [0, pad_h], [0, pad_w], [0, 0]])
    image_hw = tf.stack([new_h, new_w])[None]
    sx = tf.cast(tf.cast(new_w, tf.float64) / tf.cast(width, tf.float64), tf.float32)
    sy = tf.cast(tf.cast(new_h, tf.float64) / tf.cast(height, tf.float64), tf.float32)
    return batch, image_hw, (sx, sy), (height, width)


def postprocess(tf, cfg, outputs, scale, image_size, category_ids: dict[int, int], class_names: list[str]):
    """The signature's outputs from the network's (boxes, scores, labels 1..C, soft ROI masks,
    detections per image): a batch of one image, so every detection is its."""
    boxes, scores, labels, masks, _per_image = outputs
    sx, sy = scale
    height, width = image_size
    boxes = tf.reshape(boxes, [-1, 4]) / tf.stack([sx, sy, sx, sy])
    w, h = tf.cast(width, tf.float32), tf.cast(height, tf.float32)
    boxes = tf.stack([tf.clip_by_value(boxes[:, 0], 0, w), tf.clip_by_value(boxes[:, 1], 0, h),
                      tf.clip_by_value(boxes[:, 2], 0, w), tf.clip_by_value(boxes[:, 3], 0, h)], axis=1)
    labels = tf.cast(labels, tf.int32)
    # index 0 (background) never occurs: detections are 1..C
    ids = [0] + [category_ids[i] for i in range(1, len(class_names))]
    result = {"boxes": boxes,
              "classes": tf.gather(tf.constant(ids, tf.int32), labels),
              "class_names": tf.gather(tf.constant(class_names), labels),
              "scores": tf.reshape(scores, [-1])}
    if cfg.MODE_MASK:
        from training.model.mask_head import paste_masks_graph
        result["masks"] = paste_masks_graph(boxes, masks, height, width, accurate=cfg.MRCNN.ACCURATE_PASTE)
    else:
        result["masks"] = tf.zeros([tf.shape(boxes)[0], 1, 1], tf.uint8)
    return {k: tf.identity(v, name=f"export/{k}") for k, v in result.items()}


# ------------------------------------------------------------------------------ export
def check_output_dir(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise SystemExit(f"error: {output} exists and is not an empty directory: choose a new --output "
                         f"(an export is never written over another)")


def export(checkpoint_arg: str, output: str | os.PathLike, overrides=(), split_name: str | None = None) -> Path:
    """Write the SavedModel of ``checkpoint_arg`` (a run or a model file) to ``output``; returns the directory."""
    from training import predict
    from training.predict import load_run_config, predict_session_config, resolve_checkpoint

    output = Path(output)
    check_output_dir(output)
    if predict.is_model_file(checkpoint_arg):
        checkpoint, logdir = checkpoint_arg, None
        split = None
        if split_name:
            split = predict._load_split(predict.base_config(overrides).DATA.BASEDIR, split_name)
            if split is None:
                raise SystemExit(2)
        cfg, category_ids = predict.model_file_config(checkpoint, list(overrides), split)
    else:
        if split_name:
            raise SystemExit("error: --split names a model file's classes; a run's config.json has its own")
        checkpoint, logdir = resolve_checkpoint(checkpoint_arg)
        cfg, category_ids = load_run_config(logdir, list(overrides))
    class_names = list(cfg.DATA.CLASS_NAMES)
    missing = [i for i in range(1, len(class_names)) if i not in category_ids]
    if missing:
        raise SystemExit(f"error: {logdir}/config.json's _category_ids has no category for classes {missing} "
                         f"of {class_names}: export the config the run wrote")

    from training.compat import tf, tf1, use_graph_mode
    use_graph_mode()
    from tensorflow.python.saved_model import signature_def_utils, tag_constants
    from tensorpack.tfutils.tower import PredictTowerContext
    from training.callbacks import CONFIG_FILE
    from training.model.generalized_rcnn import OUTPUT_NAMES, MaskRCNN

    # Written beside the output, then renamed: a failed export leaves no directory that looks finished.
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    graph = tf.Graph()
    with graph.as_default():
        image_bytes = tf1.placeholder(tf.string, [], name=INPUT_NAME)
        batch, image_hw, scale, image_size = preprocess(tf, image_bytes, cfg)
        model = MaskRCNN(cfg)
        # The training inputs stay unfed placeholders: the inference graph does not use them.
        unused = [tf1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()[2:]]
        with PredictTowerContext(""):
            model.build_graph(batch, image_hw, *unused)
        network = [graph.get_tensor_by_name(name + ":0") for name in OUTPUT_NAMES]
        outputs = postprocess(tf, cfg, network, scale, image_size, category_ids, class_names)
        signature = signature_def_utils.predict_signature_def(inputs={INPUT_NAME: image_bytes}, outputs=outputs)
        with tf1.Session(graph=graph, config=predict_session_config()) as sess:
            sess.run(tf1.global_variables_initializer())
            predict.model_session_init(checkpoint).init(sess)
            builder = tf1.saved_model.Builder(str(staging))
            builder.add_meta_graph_and_variables(sess, [tag_constants.SERVING],
                                                 signature_def_map={SIGNATURE: signature}, strip_default_attrs=True)
            builder.save()
    categories = [{"id": category_ids[i], "name": class_names[i]} for i in range(1, len(class_names))]
    (staging / CLASSES_FILE).write_text(json.dumps({"categories": categories}, indent=1) + "\n")
    if logdir is not None:
        shutil.copyfile(logdir / CONFIG_FILE, staging / CONFIG_FILE)
    else:   # a model file: the config it was exported with, in a run's config.json format
        (staging / CONFIG_FILE).write_text(json.dumps({**cfg.to_dict(), "_category_ids": category_ids}, indent=1) + "\n")
    if output.exists():
        output.rmdir()   # empty (checked above)
    os.replace(staging, output)
    return output


def main(argv=None) -> int:
    args = parse_args(argv)
    out = export(args.checkpoint, args.output, args.config, args.split)
    print(f"exported a SavedModel to {out} (signature {SIGNATURE}: {INPUT_NAME} -> {', '.join(OUTPUT_KEYS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
