"""Shared by the trainer benchmarks: config, dataset and result files."""
from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def add_common_args(parser):
    parser.add_argument("--preset", default="cpu_synthetic", help="training/configs module (the fixed small config)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides")
    parser.add_argument("--data", default="", help="COCO-format dataset dir (default: a generated synthetic one)")
    parser.add_argument("--output", default="", help="result JSON (default: bench/results/<name>-<device>.json)")


def dataset(path: str) -> Path:
    if path:
        return Path(path)
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
    cfg.update_args(importlib.import_module(f"training.configs.{args.preset}").OVERRIDES)
    data = dataset(args.data)
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
