"""Host RAM per rank for the training annotations at COCO train2017 scale.

    python bench/annotation_memory.py [--code DIR ...] [--images 118287] [--instances 860001]

Generates (once, cached in the temp dir) an annotation file of train2017's size: 118,287 images,
860,001 instances of COCO's image sizes, polygons of 20-30 points (10% of instances in two parts),
1% crowd regions as uncompressed RLE. Only the annotations: the image folder holds just the first
image, which is all ``load_split`` checks without file validation (what ranks other than 0 do).

Then, for each ``--code`` checkout (default: this one), a fresh process imports the trainer
(TensorFlow included, as a rank has it), reads its RSS, runs ``training.train.load_data`` as the
trainer does (DATA.VAL=(): the training annotations only), keeps what it returns, collects garbage
and reads VmRSS (held for the whole run) and VmHWM (peak) from /proc/self/status. The figures are
the increase over the RSS before loading. Pass the code before a change (e.g. a ``git archive``
of the old commit) and after to compare them in one sitting.
Writes bench/results/annotation_memory-<device>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import _common

TRAIN2017_IMAGES = 118287
TRAIN2017_INSTANCES = 860001
SIZES = ((640, 427), (640, 480), (500, 375), (640, 512), (427, 640), (480, 640))

MEASURE = r"""
import gc, json, sys
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}
from training.train import load_data, build_config
cfg = build_config([f"DATA.BASEDIR={sys.argv[1]!r}", "DATA.TRAIN=('train2017',)", "DATA.VAL=()"])
gc.collect()
before = status()
kept = load_data(cfg, validate_files=False)
gc.collect()
after = status()
print(json.dumps({"records": len(kept[1]), "rss_before": before["VmRSS"], "rss_after": after["VmRSS"],
                  "hwm_after": after["VmHWM"], "hwm_before": before["VmHWM"]}))
"""


def _polygon(rng, w: int, h: int, points: int) -> list[float]:
    cx, cy = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.9) * h
    radius = rng.uniform(5, 0.3 * min(w, h)) * rng.uniform(0.6, 1.0, points)
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    xy = np.stack([np.clip(cx + radius * np.cos(angles), 0, w), np.clip(cy + radius * np.sin(angles), 0, h)], 1)
    return np.round(xy, 2).reshape(-1).tolist()


def generate(out: Path, images: int, instances: int, seed: int = 0) -> Path:
    """Writes out/annotations/instances_train2017.json, streamed (the whole dict would need GBs)."""
    ann_file = out / "annotations" / "instances_train2017.json"
    if ann_file.exists():
        return ann_file
    rng = np.random.default_rng(seed)
    ann_file.parent.mkdir(parents=True, exist_ok=True)
    (out / "train2017").mkdir(exist_ok=True)
    (out / "train2017" / "000000000001.jpg").write_bytes(b"")  # the one file load_split checks
    per_image = rng.multinomial(instances, np.full(images, 1 / images))
    tmp = ann_file.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write('{"info":{},"licenses":[],"categories":[')
        f.write(",".join(json.dumps({"id": c, "name": f"class{c}", "supercategory": "x"}) for c in range(1, 81)))
        f.write('],"images":[')
        f.write(",".join(json.dumps({"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "width": SIZES[i % 6][0],
                                     "height": SIZES[i % 6][1]}) for i in range(images)))
        f.write('],"annotations":[')
        ann_id = 0
        for i, count in enumerate(per_image):
            w, h = SIZES[i % 6]
            for _ in range(count):
                ann_id += 1
                crowd = rng.random() < 0.01
                if crowd:
                    runs = rng.integers(1, 400, 300)
                    seg = {"size": [h, w], "counts": (runs * (w * h) // runs.sum()).tolist()}
                else:
                    seg = [_polygon(rng, w, h, int(rng.integers(20, 31))) for _ in range(1 + (rng.random() < 0.1))]
                xs = np.concatenate([p[0::2] for p in seg]) if not crowd else np.array([0.0, w / 2])
                ys = np.concatenate([p[1::2] for p in seg]) if not crowd else np.array([0.0, h / 2])
                bbox = [round(float(xs.min()), 2), round(float(ys.min()), 2), round(float(np.ptp(xs)), 2),
                        round(float(np.ptp(ys)), 2)]
                ann = {"id": ann_id, "image_id": i + 1, "category_id": int(rng.integers(1, 81)), "iscrowd": int(crowd),
                       "area": round(bbox[2] * bbox[3] * 0.6, 2), "bbox": bbox, "segmentation": seg}
                f.write(("," if ann_id > 1 else "") + json.dumps(ann, separators=(",", ":")))
        f.write("]}")
    os.replace(tmp, ann_file)
    return ann_file


def measure(code: Path, data: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(data)], cwd=code, env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        sys.exit(f"measuring {code} failed:\n{proc.stderr[-3000:]}")
    raw = json.loads(proc.stdout.splitlines()[-1])
    gib = 2 ** 30
    return {"code": str(code), "records": raw["records"],
            "held_gib": round((raw["rss_after"] - raw["rss_before"]) / gib, 3),
            "peak_gib": round((raw["hwm_after"] - raw["rss_before"]) / gib, 3),
            "rss_before_loading_gib": round(raw["rss_before"] / gib, 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--code", nargs="+", default=[str(_common.REPO)], help="checkouts to measure, in turn")
    p.add_argument("--images", type=int, default=TRAIN2017_IMAGES)
    p.add_argument("--instances", type=int, default=TRAIN2017_INSTANCES)
    p.add_argument("--data", default="", help="dataset dir (default: generated in the temp dir)")
    p.add_argument("--output", default="", help="result JSON (default: bench/results/annotation_memory-<device>.json)")
    args = p.parse_args(argv)
    data = Path(args.data or Path(tempfile.gettempdir()) / f"maskrcnn-bench-ann-{args.images}-{args.instances}")
    ann_file = generate(data, args.images, args.instances)
    runs = []
    for code in args.code:
        runs.append(measure(Path(code).resolve(), data))
        print(runs[-1], flush=True)
    result = {"images": args.images, "instances": args.instances,
              "annotation_file_mib": round(ann_file.stat().st_size / 2 ** 20, 1), "runs": runs}
    if len(runs) > 1:
        result["held_last_vs_first"] = round(runs[-1]["held_gib"] / runs[0]["held_gib"], 3)
        result["peak_last_vs_first"] = round(runs[-1]["peak_gib"] / runs[0]["peak_gib"], 3)
    _common.write_result("annotation_memory", args, result)


if __name__ == "__main__":
    main()
