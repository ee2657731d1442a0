"""Run TensorFlow's automatic mixed-precision rewrite on the training graph, without a GPU.

    python -m training.amp_check [--config KEY=VALUE ...] [--json REPORT.json]

``TRAIN.MIXED_PRECISION`` makes grappler's AMP optimizer (CUDA mode) repaint the training graph:
convolutions and matmuls in float16, with casts at the boundaries its op lists decide. This
builds the training graph as a GPU rank does (every op on ``/GPU:0`` unless the model pins it to
the CPU; ``BACKBONE.DATA_FORMAT=auto`` resolves to NCHW), runs that same optimizer on it offline,
and reports every float16 node under the scopes in ``training.model.scopes.FLOAT32`` (anchors, box
coding, proposals, ROI sampling and sampling boxes, mask targets, losses). Exit status 1 names them.

The rewrite only converts an op it finds a float16 GPU kernel for, so this needs a CUDA build of
TensorFlow (the training image's, or ``pip install tensorflow``; ``make install`` puts one in
``.venv/tf-gpu-build`` for the tests). No GPU is needed: TensorFlow's own switches
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU`` and ``..._IGNORE_PERFORMANCE`` make it
rewrite as for a Volta-or-newer GPU. With ``tensorflow-cpu`` it exits 2 instead of passing.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

# read by grappler at its first AMP run: set before anything can trigger one
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU"] = "1"
os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE"] = "1"

DT_HALF = 19  # tensorflow.core.framework.types_pb2.DT_HALF
TYPE_ATTRS = ("T", "dtype", "SrcT", "DstT", "Tparams", "U")
CONVERTED_OPS = ("Conv2D", "MatMul", "Conv2DBackpropInput", "Conv2DBackpropFilter")


class NoGpuKernels(RuntimeError):
    pass


def require_gpu_kernels() -> None:
    """The rewrite is a no-op without float16 GPU kernels to convert to: refuse instead of passing."""
    from tensorflow.python.framework import kernels
    devices = {k.device_type for k in kernels.get_registered_kernels_for_op("Conv2D").kernel}
    if "GPU" not in devices:
        import tensorflow as tf
        raise NoGpuKernels(
            f"this TensorFlow ({tf.__version__} at {os.path.dirname(tf.__file__)}) has no GPU kernels "
            "(tensorflow-cpu), so the AMP rewrite would convert nothing. Run in the training image, or "
            "with a CUDA build first on the path: PYTHONPATH=.venv/tf-gpu-build (made by `make install`)")


def training_graph(cfg):
    """(graph, train_op) of one GPU rank's training tower for a finalized ``cfg``."""
    from tensorpack.models.registry import disable_layer_logging
    from training.compat import tf, tf1
    from training.model.tower import build_towers
    disable_layer_logging()  # a report, not the model summary
    graph = tf1.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        towers = build_towers(cfg)
    return graph, towers.train_op


def rewrite(graph, train_op):
    """The GraphDef grappler's CUDA AMP optimizer (alone) makes of ``graph`` for fetching ``train_op``."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer
    from training.compat import tf1
    with graph.as_default():
        graph.add_to_collection("train_op", train_op)
        meta = tf1.train.export_meta_graph(graph=graph)
    config = config_pb2.ConfigProto()
    options = config.graph_options.rewrite_options
    options.optimizers[:] = ["auto_mixed_precision"]  # alone: node names stay the model's
    options.min_graph_nodes = -1
    return tf_optimizer.OptimizeGraph(config, meta)


def _is_half(node) -> bool:
    return any(node.attr[a].type == DT_HALF or DT_HALF in node.attr[a].list.type
               for a in TYPE_ATTRS if a in node.attr)


def _scopes_of(name: str, scopes) -> set[str]:
    """The float32 scopes a forward node's name lies under (TensorFlow uniquifies repeats as ``x_1``)."""
    if name.startswith("gradients"):
        return set()
    return {base for base in (re.sub(r"_\d+$", "", part) for part in name.split("/")[:-1]) if base in scopes}


def report(graph_def, scopes) -> dict:
    """Counts of float16 ops, nodes per float32 scope, and the float16 nodes found under those scopes."""
    half_ops = collections.Counter()
    scope_nodes = collections.Counter()
    violations = collections.defaultdict(list)
    for node in graph_def.node:
        half = _is_half(node)
        if half:
            half_ops[node.op] += 1
        for scope in _scopes_of(node.name, scopes):
            scope_nodes[scope] += 1
            if half:
                violations[scope].append(f"{node.op} {node.name}")
    # compute ops before the casts the rewrite inserted: they say more about what went wrong
    return {"float16_ops": dict(half_ops), "scope_nodes": {s: scope_nodes[s] for s in scopes},
            "float16_in_float32_scopes": {s: sorted(v, key=lambda x: (x.startswith("Cast "), x))
                                          for s, v in violations.items()}}


def check(cfg) -> dict:
    from training.model import scopes
    require_gpu_kernels()
    graph, train_op = training_graph(cfg)
    result = report(rewrite(graph, train_op), scopes.FLOAT32)
    mask_only = () if cfg.MODE_MASK else (scopes.MASK_TARGETS, scopes.MASK_LOSS)
    missing = [s for s, n in result["scope_nodes"].items() if n == 0 and s not in mask_only]
    if missing:  # a renamed scope would otherwise pass unchecked
        raise RuntimeError(f"no nodes under the float32 scopes {missing}: training.model.scopes and the model disagree")
    if not any(result["float16_ops"].get(op) for op in CONVERTED_OPS):
        raise RuntimeError("the AMP rewrite converted no convolution or matmul to float16: nothing was checked")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    p.add_argument("--num-classes", type=int, default=80, help="foreground categories (COCO: 80)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    args = p.parse_args(argv)
    from training.config import ConfigError, finalize, new_config
    cfg = new_config()
    try:
        cfg.update_args(["TRAIN.MIXED_PRECISION=True"] + args.config)
        cfg = finalize(cfg, num_ranks=1, class_names=["BG"] + [f"class{i}" for i in range(1, args.num_classes + 1)],
                       has_gpu=True)
        result = check(cfg)
    except (ConfigError, NoGpuKernels) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True))
    converted = ", ".join(f"{op} {n}" for op, n in sorted(result["float16_ops"].items()) if op in CONVERTED_OPS)
    print(f"float16 under the AMP rewrite: {converted}")
    for scope, n in result["scope_nodes"].items():
        bad = result["float16_in_float32_scopes"].get(scope, [])
        print(f"  {scope:16s} {n:5d} nodes  " + (f"{len(bad)} float16: {', '.join(bad[:5])}" if bad else "float32"))
    if result["float16_in_float32_scopes"]:
        print("error: float16 nodes under float32 scopes (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
