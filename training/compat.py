"""The few shims tensorpack 0.11 needs under TensorFlow 2.18, in one place.

Import TensorFlow through this module (``from training.compat import tf``) so that:

* ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported: tensorpack's layers are built on
  Keras 2 (tf-keras); with Keras 3 they fail.
* the graph-mode names tensorpack (and Horovod's TF1 API) still call on the top-level ``tf``
  module exist again (TF 2 moved them under ``tf.compat.v1``).
* eager execution is off: the trainer is a TF1-style graph + session (tensorpack's design).
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1

# Names tensorpack 0.11 / horovod.tensorflow look up on `tf` that only exist in tf.compat.v1 in TF 2.
_V1_NAMES = (
    "global_variables", "local_variables", "trainable_variables", "model_variables",
    "variables_initializer", "global_variables_initializer", "local_variables_initializer",
    "get_default_graph", "get_variable", "get_variable_scope", "variable_scope",
    "get_collection", "add_to_collection", "GraphKeys", "placeholder", "Session",
    "ConfigProto", "GPUOptions", "RunOptions", "RunMetadata", "AUTO_REUSE",
)
for _name in _V1_NAMES:
    if not hasattr(tf, _name) and hasattr(tf1, _name):
        setattr(tf, _name, getattr(tf1, _name))

_graph_mode_set = False


def use_graph_mode() -> None:
    """Switch TensorFlow to graph mode (idempotent); call before building any graph."""
    global _graph_mode_set
    if not _graph_mode_set:
        tf1.disable_eager_execution()
        _graph_mode_set = True


__all__ = ["tf", "tf1", "use_graph_mode"]
