"""Shared by the trainer benchmarks: config, dataset and result files."""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def load_test_helper(name: str, under: str = ""):
    """A helper module of tests/ (not a package) by its path: the emulated hosts, moto, the narrow
    COCO-shapes settings (``under="training"``), ..."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / under / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --scale coco: the default (full-size) config at batch 4 on the COCO-realistic fixture: short edge 800,
# max 1333, P2-P6 with the default anchors, masks on, ~7 objects an annotated image.
COCO_SCALE_OVERRIDES = ["DATA.TRAIN=('train2017',)", "DATA.VAL=('val2017',)", "TRAIN.BATCH_SIZE_PER_GPU=4"]
COCO_FIXTURE = {"train": 200, "val": 16, "seed": 0}


def add_common_args(parser):
    parser.add_argument("--scale", choices=("cpu", "coco"), default="cpu",
                        help="cpu: --preset on the synthetic shapes; coco: the default config at batch 4 on "
                             "the COCO-realistic fixture (COCO image sizes, 800 px short edge)")
    parser.add_argument("--preset", default="cpu_synthetic", help="training/configs module (the fixed small config)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides")
    parser.add_argument("--data", default="", help="COCO-format dataset dir (default: a generated synthetic one)")
    parser.add_argument("--output", default="", help="result JSON (default: bench/results/<name>-<device>.json)")


def dataset(path: str, scale: str = "cpu") -> Path:
    if path:
        return Path(path)
    if scale == "coco":
        fixture = load_test_helper("coco_fixture")
        out = Path(tempfile.gettempdir()) / "maskrcnn-bench-coco"
        if not (out / "annotations" / "instances_val2017.json").exists():
            fixture.generate(out, fixture.CocoFixtureSpec(**COCO_FIXTURE))
        return out
    from training.configs.cpu_synthetic import DATASET
    from training.data.synthetic import SyntheticSpec, generate
    out = Path(tempfile.gettempdir()) / "maskrcnn-bench-synthetic"
    if not (out / "annotations" / "instances_val2017.json").exists():
        generate(out, SyntheticSpec(**{**DATASET, "train": 200, "val": 20}))
    return out


def load_config(args, *, num_ranks: int = 1):
    import importlib
    from training.config import finalize, new_config
    from training.data.coco import load_split
    cfg = new_config()
    scale = getattr(args, "scale", "cpu")
    cfg.update_args(COCO_SCALE_OVERRIDES if scale == "coco"
                    else importlib.import_module(f"training.configs.{args.preset}").OVERRIDES)
    data = dataset(args.data, scale)
    cfg.update_args([f"DATA.BASEDIR={str(data)!r}", "BACKBONE.DATA_FORMAT='auto'", *args.config])
    split = load_split(data, cfg.DATA.TRAIN[0])
    finalize(cfg, num_ranks=num_ranks, class_names=split.class_names)
    return cfg, split


def device_name() -> str:
    from training.compat import tf
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return "gpu-" + details.get("device_name", "unknown").replace(" ", "_")
    return f"cpu-{os.cpu_count()}cores"


def write_result(name: str, args, result: dict) -> Path:
    device = device_name()
    result = {"benchmark": name, "device": device, "host": platform.node(), "python": platform.python_version(),
              "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **result}
    out = Path(args.output) if args.output else RESULTS / f"{name}-{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return out
