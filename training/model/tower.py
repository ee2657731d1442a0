"""One rank's Mask R-CNN towers on placeholders, for code that runs steps itself with ``feed_dict``.

The trainer builds its towers through tensorpack (input queue, Horovod allreduce); the GPU report
(``training.amp_check``), the throughput benchmark and the model tests need the same graph without
them. This builds it one way for all of them: the training tower exactly as the trainer's (tower
name "", the model's optimizer, the global step) and, if asked, a predict tower beside it: tower
"pred", not training, reusing the training tower's variables (the trainer's evaluator gets the
same from tensorpack's ``get_predictor``, in a tower of tensorpack's naming).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREDICT_TOWER = "pred"


@dataclass
class Towers:
    model: Any              # the MaskRCNN (its ``stats``: the step's metric tensors)
    inputs: list            # training placeholders, in ``model.inputs()`` order: feed a training batch
    cost: Any
    train_op: Any
    pred_inputs: list | None = None     # images, image_hw of the predict tower
    pred_outputs: list | None = None    # its OUTPUT_NAMES tensors: boxes, scores, labels, masks

    def feed(self, batch) -> dict:
        """The ``feed_dict`` of a training batch (training.data.pipeline's collated tuple)."""
        return dict(zip(self.inputs, batch))


def build_towers(cfg, *, predict: bool = False) -> Towers:
    """The towers of a finalized ``cfg`` in the default graph (open the graph and device first)."""
    from tensorpack.tfutils.tower import TowerContext
    from training.compat import tf1
    from training.model.generalized_rcnn import INPUT_NAMES_PREDICT, OUTPUT_NAMES, MaskRCNN

    model = MaskRCNN(cfg)
    specs = model.inputs()
    inputs = [tf1.placeholder(s.dtype, s.shape, s.name) for s in specs]
    with TowerContext("", is_training=True):
        cost = model.build_graph(*inputs)
    train_op = model.optimizer().minimize(cost, global_step=tf1.train.get_or_create_global_step())
    towers = Towers(model, inputs, cost, train_op)
    if predict:
        # build_graph takes every input; the predict tower reads only images and image_hw
        pred_inputs = [tf1.placeholder(s.dtype, s.shape, f"{PREDICT_TOWER}_{s.name}") for s in specs]
        with TowerContext(PREDICT_TOWER, is_training=False), \
                tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            model.build_graph(*pred_inputs)
        graph = tf1.get_default_graph()
        by_name = {s.name: p for s, p in zip(specs, pred_inputs)}
        towers.pred_inputs = [by_name[n] for n in INPUT_NAMES_PREDICT]
        towers.pred_outputs = [graph.get_tensor_by_name(f"{PREDICT_TOWER}/{n}:0") for n in OUTPUT_NAMES]
    return towers
