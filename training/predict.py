"""Predict with a trained checkpoint: COCO-format results (boxes, scores, RLE masks) and/or pictures.

    maskrcnn predict --checkpoint train_log/run1 --split val2017 --output results.json [--evaluate]
    maskrcnn predict --checkpoint train_log/run1/model-2500 --images photos/ --output results.json
    maskrcnn predict --checkpoint train_log/run1 --images photos/ --draw drawn/ --score-threshold 0.5

--checkpoint is a log dir (its latest checkpoint) or a checkpoint prefix; the run's config.json
next to it rebuilds the model. It can also be a published model file, a tensorpack .npz such as
COCO-R50FPN-MaskRCNN-Standard.npz, as tensorpack's predict.py --load takes it: the model is the
default config (R50-FPN Mask R-CNN, the file's architecture; --config changes it), every variable
restored from the file; the classes are the --split's, or COCO's 80 for a file with 81 class outputs.

    maskrcnn predict --checkpoint COCO-R50FPN-MaskRCNN-Standard.npz --images photos/ --draw drawn/

With --split the image ids and category ids are the dataset's; with --images the images are
numbered 1.. in file-name order, each result also names its file.
--evaluate scores a split's results with COCOeval and prints the metric lines and mAP table that
training prints (for a run trained with DATA.VAL=(), or another split).
--draw DIR writes every image with its detections of at least --score-threshold drawn on it
(translucent masks, boxes, class names, scores) to DIR, under the image's own file name and format.
--max-images N predicts (and evaluates) only the first N images.
--batch-size images go through the network per run (default: the run's TEST.BATCH_SIZE); a batch
holds images of one padded size, so the detections do not depend on it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
DRAW_SCORE_THRESHOLD = 0.5


def parse_args(argv=None):
    # `maskrcnn evaluate` is this command with --evaluate (launch/cli.py names argv[0] after it)
    prog = sys.argv[0] if sys.argv[0] == "maskrcnn evaluate" else "maskrcnn predict"
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="log dir, checkpoint prefix (model-STEP) or model file (tensorpack .npz)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="a folder of images")
    src.add_argument("--split", help="a split of the dataset under DATA.BASEDIR (e.g. val2017)")
    p.add_argument("--output", help="results JSON to write")
    p.add_argument("--evaluate", action="store_true", help="with --split: COCO evaluation of the results")
    p.add_argument("--draw", metavar="DIR", help="write each image with its detections drawn on it to DIR")
    p.add_argument("--score-threshold", type=float, default=DRAW_SCORE_THRESHOLD,
                   help=f"--draw shows detections scoring at least this (default {DRAW_SCORE_THRESHOLD})")
    p.add_argument("--batch-size", type=int, help="images per network run (default: the run's TEST.BATCH_SIZE)")
    p.add_argument("--max-images", type=int, default=0,
                   help="only the first N images (the split's order, or file-name order); 0: all")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (e.g. DATA.BASEDIR=...)")
    return p.parse_args(argv)


def resolve_checkpoint(path: str) -> tuple[str, Path]:
    """``(checkpoint prefix, the run's log dir)``; a clear error when there is none."""
    from training.callbacks import latest_checkpoint
    if os.path.isdir(path):
        ckpt = latest_checkpoint(path)
        if not ckpt:
            raise SystemExit(f"error: no checkpoint in {path} (expected a 'checkpoint' file naming model-STEP)")
        return ckpt, Path(path)
    if not os.path.exists(path + ".index"):
        raise SystemExit(f"error: checkpoint {path} not found ({path}.index does not exist)")
    return path, Path(path).parent


def load_run_config(logdir: Path, overrides):
    """The run's finalized config (config.json), re-finalized for one process on this machine."""
    from training.callbacks import CONFIG_FILE
    from training.config import AttrDict, finalize, new_config
    path = logdir / CONFIG_FILE
    if not path.exists():
        raise SystemExit(f"error: {path} is missing: predict needs the config the model was trained with")
    saved = json.loads(path.read_text())
    category_ids = {int(k): int(v) for k, v in saved.pop("_category_ids", {}).items()}
    saved.pop("_resumed_from", None)  # where the run resumed from (training/resume.py), not a config key
    cfg = new_config()

    def apply(node: AttrDict, values: dict, prefix=""):
        for key, value in values.items():
            if isinstance(value, dict):
                apply(node, value, prefix + key + ".")
            else:
                cfg.set_value(prefix + key, value)

    apply(cfg, saved)
    cfg.set_value("BACKBONE.DATA_FORMAT", "auto")  # the weights do not depend on it: use this machine's best
    cfg.update_args(overrides)
    class_names = cfg.DATA.CLASS_NAMES
    finalize(cfg, num_ranks=1, class_names=class_names)
    if not category_ids:
        category_ids = {i: i for i in range(1, len(class_names))}
    return cfg, category_ids


def is_model_file(path: str) -> bool:
    """A published model file (tensorpack's ``.npz``), rather than a run's checkpoint."""
    return str(path).endswith(".npz")


def base_config(overrides):
    """The default config with ``overrides``, not finalized: what a model file's model is built from."""
    from training.config import ConfigError, new_config
    cfg = new_config()
    cfg.set_value("BACKBONE.DATA_FORMAT", "auto")
    try:
        cfg.update_args(list(overrides))
    except ConfigError as err:
        raise SystemExit(f"error: {err}")
    return cfg


def model_file_config(path: str, overrides, split=None):
    """``(finalized config, {class: category id})`` for the model file ``path``: the default config
    (tensorpack's R50-FPN Mask R-CNN, as COCO-R50FPN-MaskRCNN-Standard.npz was trained) with
    ``overrides``. The classes are ``split``'s (a training.data.coco.CocoSplit) when given, else
    COCO's 80 when the file's class logits have 81 outputs. Every variable of the model must be in
    the file with its shape and every entry of the file used (training.model.weights.plan_finetune),
    checked here, before any graph is built."""
    from training.config import ConfigError, finalize
    from training.data import coco_categories
    from training.model.weights import WeightsError, check_model_file, model_file_shapes, num_categories
    if not os.path.isfile(path):
        raise SystemExit(f"error: model file {path} not found")
    try:
        categories = num_categories(model_file_shapes(path))
    except (WeightsError, OSError, ValueError) as err:
        raise SystemExit(f"error: {path} is not a readable model file: {err}")
    if categories is None:
        raise SystemExit(f"error: {path} has no class logits (fastrcnn/outputs/class/b): not a detector's model file "
                         f"(an ImageNet backbone is BACKBONE.WEIGHTS for training, not a model)")
    if split is not None:
        class_names, category_ids = list(split.class_names), dict(split.contiguous_to_coco_id)
        if len(class_names) - 1 != categories:
            raise SystemExit(f"error: {path} classifies {categories} categories but split {split.name} has "
                             f"{len(class_names) - 1}: give the dataset the file was trained on")
    elif categories == len(coco_categories.COCO_CATEGORIES):
        class_names, category_ids = list(coco_categories.CLASS_NAMES), dict(coco_categories.CATEGORY_IDS)
    else:
        raise SystemExit(f"error: {path} classifies {categories} categories, not COCO's 80: name the dataset it was "
                         f"trained on with --split NAME (and --config DATA.BASEDIR=...) so its classes are known")
    cfg = base_config(overrides)
    try:
        finalize(cfg, num_ranks=1, class_names=class_names)
        check_model_file(path, cfg, key="--checkpoint")
    except ConfigError as err:   # WeightsError is one: names the variable and the keys to set
        raise SystemExit(f"error: {err}")
    return cfg, category_ids


def model_session_init(checkpoint: str):
    """A tensorpack SessionInit for a run's checkpoint, or for a model file the strict restore of
    every model variable (training.model.weights.strict_finetune_init)."""
    if is_model_file(checkpoint):
        from training.model.weights import strict_finetune_init
        return strict_finetune_init(checkpoint)
    from tensorpack.tfutils.sessinit import SmartInit
    return SmartInit(checkpoint)


def predict_session_config():
    """Session options for prediction: grappler's memory optimizer off.

    It only plans GPU memory for training (swapping, recomputation), and its cost model has no
    estimate for CropAndResize (ROIAlign, mask targets): it printed an "Error in PredictCost()"
    warning per CropAndResize on every run, through absl logging, which TF_CPP_MIN_LOG_LEVEL does
    not silence.
    """
    from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig
    from tensorpack.tfutils.common import get_default_sess_config
    conf = get_default_sess_config()
    conf.graph_options.rewrite_options.memory_optimization = RewriterConfig.OFF
    return conf


def build_predictor(cfg, checkpoint: str):
    from training.compat import use_graph_mode
    use_graph_mode()
    from tensorpack.predict import OfflinePredictor, PredictConfig
    from tensorpack.tfutils.sesscreate import NewSessionCreator
    from training.model.generalized_rcnn import INPUT_NAMES_PREDICT, OUTPUT_NAMES, MaskRCNN
    predictor = OfflinePredictor(PredictConfig(model=MaskRCNN(cfg), session_init=model_session_init(checkpoint),
                                               session_creator=NewSessionCreator(config=predict_session_config()),
                                               input_names=list(INPUT_NAMES_PREDICT), output_names=list(OUTPUT_NAMES)))
    return lambda images, image_hw: predictor(images, image_hw)


def check_args(args) -> str | None:
    """The problem with the command line, if any (before anything is loaded or written)."""
    if not args.output and not args.draw and not args.evaluate:
        return "nothing to do: give --output FILE (results JSON), --draw DIR (pictures) and/or --evaluate"
    if args.evaluate and not args.split:
        return "--evaluate needs --split (a folder of images has no ground truth)"
    if not 0.0 <= args.score_threshold <= 1.0:
        return f"--score-threshold must be between 0 and 1, got {args.score_threshold}"
    if args.max_images < 0:
        return f"--max-images must be 0 (all) or more, got {args.max_images}"
    if args.batch_size is not None and args.batch_size < 1:
        return f"--batch-size must be at least 1, got {args.batch_size}"
    if args.draw and os.path.exists(args.draw) and not os.path.isdir(args.draw):
        return f"--draw {args.draw} is a file: give a folder (it is created if missing)"
    return None


class Drawer:
    """Writes each image with its detections of at least ``threshold`` drawn, as ``folder/<file name>``."""

    def __init__(self, folder: Path, class_names, threshold: float):
        self.folder = folder
        self.class_names = list(class_names)
        self.threshold = threshold
        self.count = 0

    def __call__(self, file_name, image, det) -> None:
        from training.draw import class_color, draw_instances, write_image
        keep = det["scores"] >= self.threshold
        labels = det["labels"][keep]
        drawn = draw_instances(image, det["boxes"][keep], det["masks"][keep] if det["masks"] is not None else None,
                               names=[self.class_names[i] for i in labels], scores=det["scores"][keep],
                               colors=[class_color(int(i)) for i in labels])
        self.folder.mkdir(parents=True, exist_ok=True)
        write_image(self.folder / Path(file_name).name, drawn)
        self.count += 1


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    overrides = list(args.config) + ([f"TEST.BATCH_SIZE={args.batch_size}"] if args.batch_size else [])
    split = None
    if is_model_file(args.checkpoint):
        checkpoint = args.checkpoint
        if args.split:   # the file's classes are the dataset's
            split = _load_split(base_config(overrides).DATA.BASEDIR, args.split)
            if split is None:
                return 2
        cfg, category_ids = model_file_config(checkpoint, overrides, split)
    else:
        checkpoint, logdir = resolve_checkpoint(args.checkpoint)
        cfg, category_ids = load_run_config(logdir, overrides)
    from training import evaluation
    from training.callbacks import evaluate_split, predict_split
    from training.data.pipeline import iterate_test_images
    from training.inference import detect_all
    if args.images:
        folder = Path(args.images)
        paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
        paths = paths[:args.max_images] if args.max_images else paths
        if not paths:
            print(f"error: no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}", file=sys.stderr)
            return 2
    elif split is None:
        split = _load_split(cfg.DATA.BASEDIR, args.split)
        if split is None:
            return 2
    drawer = Drawer(Path(args.draw), cfg.DATA.CLASS_NAMES, args.score_threshold) if args.draw else None
    predict_fn = build_predictor(cfg, checkpoint)
    if args.images:
        per_image = {}
        images = iterate_test_images(paths, num_workers=cfg.DATA.NUM_WORKERS)
        for idx, image, det in detect_all(predict_fn, images, cfg):
            per_image[idx] = evaluation.detections_to_coco(idx + 1, det["boxes"], det["scores"], det["labels"],
                                                           det["masks"], category_ids)
            for r in per_image[idx]:
                r["file_name"] = paths[idx].name
            if drawer:
                drawer(paths[idx], image, det)
        results = [r for idx in sorted(per_image) for r in per_image[idx]]
    else:
        on_image = (lambda record, image, det: drawer(record["file_name"], image, det)) if drawer else None
        results = predict_split(predict_fn, split, cfg, on_image=on_image, max_images=args.max_images)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(results))
        os.replace(tmp, out)
        print(f"wrote {len(results)} detections to {out}")
    if drawer:
        print(f"drew the detections scoring {args.score_threshold:g} or more on {drawer.count} images in {drawer.folder}")
    if args.evaluate:
        evaluate_split(split, results, cfg, max_images=args.max_images)
    return 0


def _load_split(basedir, name):
    """The split, or None after printing why it cannot be read."""
    from training.data.coco import DatasetError, load_split
    try:
        return load_split(basedir, name, require_annotations=False)
    except DatasetError as err:
        print(f"error: {err}", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())
