"""How much of one GPU rank's training step can stay on the GPU, read from the graph and TensorFlow's
kernel registry, without a GPU.

    python bench/gpu_readiness.py [--batches 500] [--short-edge 640 800] [--config K=V ...]

Builds the default training step (R50-FPN, mask head, batch 4 per GPU, COCO's 80 classes, NCHW,
every op on /GPU:0 unless the model pins it to the CPU) as a graph, once with mixed precision off
and once after grappler's AMP rewrite (``training.amp_check``), in a subprocess that imports the
CUDA build of TensorFlow kept beside the virtualenv (``.venv/tf-gpu-build``, made by ``make
install``): only that build's kernel registry lists GPU kernels. Without it the inspection runs on
the CPU build and the result says so (every op then counts as host-only).

Reported for the ops the training op depends on (input placeholders to the optimizer update):

- ``host_ops``: ops whose type and dtypes have no GPU kernel, or that the model pins to the CPU,
  with their name scopes (soft placement puts them on the host);
- ``crossings``: tensors that cross between host-placed and GPU-placed ops (each a device-to-host
  or host-to-device copy in the step; int32 tensors are left out: TensorFlow keeps them in host
  memory on a GPU device anyway), and ``sync_ops``: GPU ops whose output size depends on the data
  (``Where``, NMS, ...): each copies a count to the host and waits for the GPU there; and
  ``loops``: graph loops (``While``, ``LoopCond``), whose predicate the host reads back from the
  GPU before every iteration. Ops inside the functions the step calls (``non_max_suppression_padded``
  is one) count as well;
- ``shapes``: over a representative sequence of training batches (the pipeline's own plans with
  multi-scale short edges, ``--short-edge``), the distinct padded batch shapes: each one is a new
  set of convolution shapes for cuDNN to autotune (and XLA to compile); plus the convolutions and
  matmuls whose shape depends on per-step ROI counts (a new shape whenever a count changes).

The figures are properties of the graph and the pipeline: the machine does not change them.
Writes bench/results/gpu_readiness.json.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _common

TF_GPU_BUILD = _common.REPO / ".venv" / "tf-gpu-build"
# GPU kernels that size their output from the data: the host reads a count back before it can go on
SYNC_OPS = ("Where", "NonMaxSuppressionV2", "NonMaxSuppressionV3", "NonMaxSuppressionV4", "NonMaxSuppressionV5",
            "Unique", "UniqueV2", "DynamicPartition", "BooleanMask", "ListDiff", "SparseToDense")
# loops: the host reads the loop predicate back from the GPU before every iteration
LOOP_OPS = ("While", "StatelessWhile", "LoopCond")
TYPE_ATTRS_SKIP = ("_class", "_output_shapes")
# kernels registered for DEVICE_DEFAULT (int32 shape arithmetic, variable reads) run on a GPU device too
GPU_DEVICE_TYPES = ("GPU", "DEFAULT")


# ----------------------------------------------------------------------------------- inspection (subprocess)
def _step_nodes(graph_def, fetch: str) -> dict:
    """Nodes the fetch depends on (data and control edges), by name."""
    by_name = {n.name: n for n in graph_def.node}
    seen, todo = {}, [fetch]
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen[name] = by_name[name]
        todo.extend(i.lstrip("^").split(":")[0] for i in by_name[name].input)
    return seen


def _function_nodes(graph_def, nodes) -> dict:
    """Nodes of the functions the step's nodes call (``PartitionedCall``, ``While``, ``If``, ...),
    through calls inside them too, as ``"caller scope/function/node" -> NodeDef``: library
    functions such as ``non_max_suppression_padded`` run their ops there, out of the graph's node list."""
    library = {f.signature.name: f for f in graph_def.library.function}
    found, todo, seen = {}, [(name, node) for name, node in nodes.items()], set()
    while todo:
        name, node = todo.pop()
        for value in node.attr.values():
            called = [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]
            for fn in called:
                if fn not in library or (name, fn) in seen:
                    continue
                seen.add((name, fn))
                for inner in library[fn].node_def:
                    key = f"{name}/{fn}/{inner.name}"
                    found[key] = inner
                    todo.append((key, inner))
    return found


def _gpu_kernel(node, registry_cache):
    """The GPU (or DEVICE_DEFAULT) KernelDef for this node's type and dtypes, or None."""
    from tensorflow.python.framework import kernels
    if node.op not in registry_cache:
        registry_cache[node.op] = [k for k in kernels.get_registered_kernels_for_op(node.op).kernel
                                   if k.device_type in GPU_DEVICE_TYPES]
    for kdef in registry_cache[node.op]:
        ok = True
        for c in kdef.constraint:
            if c.name not in node.attr:
                continue  # a default the kernel accepts
            value = node.attr[c.name]
            allowed = set(c.allowed_values.list.type)
            types = list(value.list.type) if value.HasField("list") else [value.type]
            if allowed and not all(t in allowed for t in types):
                ok = False
                break
        if ok:
            return kdef
    return None


def _input_args(node) -> list[str]:
    """The op's argument name of each data input of ``node``, in order."""
    from tensorflow.python.framework import op_def_registry
    names = []
    for arg in op_def_registry.get(node.op).input_arg:
        if arg.number_attr:
            n = node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            n = len(node.attr[arg.type_list_attr].list.type)
        else:
            n = 1
        names += [arg.name] * n
    return names


def _scope(name: str) -> str:
    parts = name.split("/")[:-1]
    return "/".join(parts[:3]) or "(top)"


def inspect(cfg, *, amp: bool) -> dict:
    import tensorflow as tf
    from tensorflow.python.framework import kernels
    from training import amp_check
    from training.compat import tf1

    gpu_build = any(k.device_type == "GPU" for k in kernels.get_registered_kernels_for_op("Conv2D").kernel)
    graph, train_op = amp_check.training_graph(cfg)
    graph_def = amp_check.rewrite(graph, train_op) if amp and gpu_build else graph.as_graph_def()
    nodes = _step_nodes(graph_def, train_op.name)
    # output dtypes of every node, from an imported copy of the (possibly rewritten) graph
    imported = tf1.Graph()
    with imported.as_default():
        tf1.import_graph_def(graph_def, name="")
    cache: dict = {}
    skip = {"Placeholder", "VariableV2", "VarHandleOp", "Const", "NoOp", "Identity"}
    host, host_memory = {}, {}
    for name, node in nodes.items():
        pinned = "CPU" in node.device.upper()
        if node.op in skip and not pinned:
            continue
        kdef = None if pinned else _gpu_kernel(node, cache)
        if kdef is None:
            host[name] = "pinned to the CPU" if pinned else "no GPU kernel"
        elif kdef.host_memory_arg:
            args = _input_args(node)
            host_memory[name] = {i for i, a in enumerate(args) if a in kdef.host_memory_arg}
    # soft placement: an op with no GPU kernel runs on the host; Identity/Const follow their input
    crossings = collections.Counter()
    crossing_tensors = set()
    for name, node in nodes.items():
        for position, inp in enumerate(i for i in node.input if not i.startswith("^")):
            src = inp.split(":")[0]
            # a GPU kernel that reads an input in host memory (an Assert's condition) copies it there
            reads_on_host = name in host or position in host_memory.get(name, ())
            if src not in nodes or (src in host) == reads_on_host or nodes[src].op == "Const":
                continue  # constants are placed where they are read
            op = imported.get_operation_by_name(src)
            idx = int(inp.split(":")[1]) if ":" in inp else 0
            dtype = op.outputs[idx].dtype
            if dtype in (tf.int32, tf.resource, tf.string):
                continue
            key = (src, idx, "GPU->host" if reads_on_host else "host->GPU")
            if key not in crossing_tensors:
                crossing_tensors.add(key)
                crossings[(key[2], _scope(name if reads_on_host else src))] += 1
    # inside called functions: ops without a GPU kernel, count read-backs and loops
    in_functions = _function_nodes(graph_def, nodes)
    for name, node in in_functions.items():
        if node.op not in skip and _gpu_kernel(node, cache) is None:
            host[name] = "no GPU kernel"
    everything = {**nodes, **in_functions}
    sync = collections.Counter(_scope(n) + " " + node.op for n, node in everything.items()
                               if node.op in SYNC_OPS and n not in host)
    loops = collections.Counter(_scope(n) + " " + node.op for n, node in everything.items()
                                if node.op in LOOP_OPS and n not in host)
    host_ops = collections.Counter(f"{_scope(n)} {nodes[n].op} ({why})" for n, why in host.items())
    # shapes: convolutions/matmuls of the forward step whose shape follows the ROI counts
    roi_dependent = image_dependent = 0
    for op in imported.get_operations():
        if op.name not in nodes or op.name.startswith("gradients") or op.type not in ("Conv2D", "MatMul", "Conv2DBackpropInput"):
            continue
        shape = op.inputs[0].shape
        if shape.rank is None:
            continue
        dims = shape.as_list()
        if any(d is None for d in dims[1:]):
            image_dependent += 1  # spatial sides follow the padded batch
        elif dims[0] is None:
            roi_dependent += 1    # rows follow the ROI count of the step
    return {"tensorflow": tf.__version__, "gpu_build": gpu_build, "mixed_precision": amp,
            "amp_rewrite_applied": bool(amp and gpu_build), "step_ops": len(nodes),
            "host_ops_total": sum(host_ops.values()), "host_ops": dict(sorted(host_ops.items())),
            "crossings_total": len(crossing_tensors),
            "crossings": {f"{d} at {s}": n for (d, s), n in sorted(crossings.items())},
            "sync_ops_total": sum(sync.values()), "sync_ops": dict(sorted(sync.items())),
            "loops_total": sum(loops.values()), "loops": dict(sorted(loops.items())),
            "image_shape_dependent_convs": image_dependent, "roi_count_dependent_convs_matmuls": roi_dependent}


def step_config(overrides, *, amp: bool, debug_checks: bool | None = None):
    from training.config import finalize, new_config
    cfg = new_config()
    cfg.update_args([*_common.COCO_SCALE_OVERRIDES[2:], "BACKBONE.DATA_FORMAT='auto'",
                     f"TRAIN.MIXED_PRECISION={amp}", *overrides])
    return finalize(cfg, num_ranks=1, class_names=["BG"] + [f"class{i}" for i in range(1, 81)], has_gpu=True)


def _inspect_main(args) -> None:
    from training.compat import use_graph_mode
    use_graph_mode()
    result = inspect(step_config(args.config, amp=args.mixed_precision), amp=args.mixed_precision)
    Path(args.inspect).write_text(json.dumps(result, indent=1))


def run_inspection(config, *, amp: bool) -> dict:
    """The inspection in a fresh process, with the CUDA build first on the path if it is there."""
    gpu_build = (TF_GPU_BUILD / "tensorflow").is_dir()
    path = ([str(TF_GPU_BUILD)] if gpu_build else []) + [str(_common.REPO)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]),
           "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU": "1",
           "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE": "1", "CUDA_VISIBLE_DEVICES": ""}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "inspect.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inspect", str(out), "--config", *config]
        if amp:
            cmd.append("--mixed-precision")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"inspection failed:\n{proc.stderr[-4000:]}")
        result = json.loads(out.read_text())
    if not result["gpu_build"]:
        result["note"] = ("the CUDA build of TensorFlow was not importable (.venv/tf-gpu-build missing: run "
                          "`make install`): the CPU build's registry lists no GPU kernels")
    return result


# ----------------------------------------------------------------------------------- shapes of a batch sequence
def batch_shapes(config, short_edge, batches: int) -> dict:
    from training.data.pipeline import TrainingBatches
    args = argparse.Namespace(scale="coco", preset="", data="", output="",
                              config=[*config, f"PREPROC.TRAIN_SHORT_EDGE_SIZE={list(short_edge)}"])
    cfg, split = _common.load_config(args)
    shapes = collections.Counter()
    for layout, *_ in itertools.islice(TrainingBatches(split.training_roidb(), cfg, seed=0).plans(), batches):
        shapes[(layout.batch, layout.height, layout.width)] += 1
    return {"short_edge": list(short_edge), "max_size": cfg.PREPROC.MAX_SIZE, "batches": batches,
            "distinct_padded_batch_shapes": len(shapes),
            "most_common": [f"{b}x{h}x{w}: {n}" for (b, h, w), n in shapes.most_common(5)]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides of the step")
    p.add_argument("--batches", type=int, default=500, help="batches of the representative sequence")
    p.add_argument("--short-edge", type=int, nargs=2, default=[640, 800], metavar=("MIN", "MAX"),
                   help="multi-scale training short edges of the sequence (tensorpack's multi-scale: 640 800)")
    p.add_argument("--output", default="", help="result JSON (default: bench/results/gpu_readiness.json)")
    p.add_argument("--inspect", default="", help=argparse.SUPPRESS)  # the subprocess's own entry
    p.add_argument("--mixed-precision", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inspect:
        return _inspect_main(args)
    runs = {}
    for amp in (False, True):
        runs["amp_on" if amp else "amp_off"] = run_inspection(args.config, amp=amp)
        print(json.dumps({k: v for k, v in runs["amp_on" if amp else "amp_off"].items()
                          if k.endswith("total")}), flush=True)
    shapes = {"multi_scale": batch_shapes(args.config, args.short_edge, args.batches),
              "single_scale": batch_shapes(args.config, (800, 800), args.batches)}
    result = {"overrides": args.config, "batch_size": 4, "data_format": "NCHW", "runs": runs, "shapes": shapes}
    out = Path(args.output) if args.output else _common.RESULTS / "gpu_readiness.json"
    _common.write_result("gpu_readiness", argparse.Namespace(output=str(out)), result)


if __name__ == "__main__":
    main()
