"""Reading EMF records as CloudWatch Logs would, and a real tensorpack run of the trainer's monitor.

``EMF_SCHEMA`` is the JSON schema AWS publishes with the embedded metric format specification
("Specification: Embedded metric format", section "Embedded metric format example and JSON schema",
awsdocs/amazon-cloudwatch-user-guide doc_source/CloudWatch_Embedded_Metric_Format_Specification.md),
written out here without its "$id"/"title"/"examples" annotations. The current specification allows
30 keys in a DimensionSet and an optional StorageResolution; the published schema says 9 and has no
StorageResolution, the stricter of the two, which records of 2 keys and no StorageResolution meet.
:func:`parse_emf_line` adds what the specification says in prose and the schema cannot: the log
event is one JSON object and nothing else, every dimension key is a root member with a string value
(CloudWatch's Dimension: 1-1024 ASCII characters), every metric name is a root member with a number
or an array of at most 100 numbers, at most 100 metrics per directive.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema

REPO = Path(__file__).resolve().parents[1]

_STRING_1_255 = {"type": "string", "pattern": "^(.*)$", "minLength": 1, "maxLength": 255}
EMF_SCHEMA = {
    "type": "object",
    "required": ["_aws"],
    "properties": {
        "_aws": {
            "type": "object",
            "required": ["Timestamp", "CloudWatchMetrics"],
            "properties": {
                "Timestamp": {"type": "integer"},
                "CloudWatchMetrics": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["Namespace", "Dimensions", "Metrics"],
                        "properties": {
                            "Namespace": _STRING_1_255,
                            "Dimensions": {
                                "type": "array", "minItems": 1,
                                "items": {"type": "array", "minItems": 0, "maxItems": 9, "items": _STRING_1_255},
                            },
                            "Metrics": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["Name"],
                                    "properties": {
                                        "Name": _STRING_1_255,
                                        "Unit": {"type": "string", "pattern": (
                                            "^(Seconds|Microseconds|Milliseconds|Bytes|Kilobytes|Megabytes|Gigabytes|"
                                            "Terabytes|Bits|Kilobits|Megabits|Gigabits|Terabits|Percent|Count|"
                                            "Bytes\\/Second|Kilobytes\\/Second|Megabytes\\/Second|Gigabytes\\/Second|"
                                            "Terabytes\\/Second|Bits\\/Second|Kilobits\\/Second|Megabits\\/Second|"
                                            "Gigabits\\/Second|Terabits\\/Second|Count\\/Second|None)$")},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _no_constant(name):
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_emf_line(line: str) -> dict:
    """The record of one log event, or AssertionError/ValueError naming what CloudWatch would reject."""
    assert line == line.strip() and line.startswith("{") and line.endswith("}"), \
        f"an EMF log event is a JSON object and nothing else: {line[:80]!r}"
    record = json.loads(line, parse_constant=_no_constant)
    jsonschema.validate(record, EMF_SCHEMA)
    for directive in record["_aws"]["CloudWatchMetrics"]:
        assert len(directive["Metrics"]) <= 100
        for dimension_set in directive["Dimensions"]:
            for key in dimension_set:
                value = record.get(key)
                assert isinstance(value, str), f"dimension {key!r} must be a root member with a string value"
                assert 1 <= len(value) <= 1024 and value.isascii() and value.isprintable(), value
        for metric in directive["Metrics"]:
            value = record.get(metric["Name"])
            assert _number(value) or (isinstance(value, list) and len(value) <= 100
                                      and all(_number(v) for v in value)), \
                f"metric {metric['Name']!r} must be a root member holding a number, not {value!r}"
    return record


def extracted_metrics(record: dict) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
    """The data points CloudWatch makes of one record: (namespace, metric name, dimensions, value),
    one per metric and dimension set."""
    out = []
    for directive in record["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            dims = tuple((key, record[key]) for key in dimension_set)
            for metric in directive["Metrics"]:
                out.append((directive["Namespace"], metric["Name"], dims, record[metric["Name"]]))
    return out


# A real tensorpack training loop (SimpleTrainer, graph mode) with the trainer's monitor and a toy
# model whose losses are read from the data: a NaN in the data is a NaN loss at that step. Runs in a
# process of its own (graph mode for the whole process). Cases: "finished" (with an evaluation's
# figures put as COCOEvaluator puts them, and a NaN at step 3), "failed" (an error raised at step 3),
# "stopped" (tensorpack's StopTraining at step 3, as a stop request ends a run).
_TOY_RUN = textwrap.dedent("""
    import json, os, sys
    import training.compat
    from training.compat import tf, tf1, use_graph_mode
    use_graph_mode()
    from tensorpack import DataFromList, ModelDesc, QueueInput, SimpleTrainer, TrainConfig, launch_train_with_config
    from tensorpack.callbacks import Callback
    from tensorpack.train.base import StopTraining
    from training import cloudwatch_metrics, metrics

    case, logdir = sys.argv[1], sys.argv[2]
    STEPS = 6

    class Toy(ModelDesc):
        def inputs(self):
            return [tf.TensorSpec((), tf.float32, "x")]
        def build_graph(self, x):
            # The weight's gradient does not depend on x: a NaN in the data makes that one step's
            # losses NaN, not the weight (and every later step).
            w = tf1.get_variable("w", [], initializer=tf1.constant_initializer(2.0))
            # Every loss the model reports, each a multiple of x (fastrcnn box loss = x, label = x / 2).
            scale = {metrics.RPN_LABEL_LOSS: 0.1, metrics.RPN_BOX_LOSS: 0.2, metrics.FASTRCNN_LABEL_LOSS: 0.5,
                     metrics.FASTRCNN_BOX_LOSS: 1.0, metrics.MASKRCNN_LOSS: 0.3}
            self.stats = {name: k * x for name, k in scale.items()}
            self.stats[metrics.WEIGHT_DECAY_COST] = tf.square(w - 1.0)
            total = tf.add_n(list(self.stats.values()), name="total_cost")
            self.stats[metrics.TOTAL_COST] = total
            return total
        def optimizer(self):
            lr = tf.identity(tf.constant(0.01), name=metrics.LEARNING_RATE)
            return tf1.train.GradientDescentOptimizer(lr)

    class Events(Callback):
        def _trigger_step(self):
            if self.global_step == 3 and case == "failed":
                raise RuntimeError("a step failed")
            if self.global_step == 3 and case == "stopped":
                raise StopTraining("a stop was requested")
        def _trigger_epoch(self):
            if self.epoch_num == 2:  # as COCOEvaluator puts the figures of an evaluation
                for i, name in enumerate(metrics.EVALUATION_METRICS):
                    self.trainer.monitors.put_scalar(name, 0.01 * (i + 1))

    values = [[float(v)] for v in (0.9, 0.8, float("nan"), 0.6, 0.5, 0.4)] * 4
    model = Toy()
    monitors = cloudwatch_metrics.monitors(lambda: model.stats, logdir=logdir, rank=0, ranks=4, global_batch=8,
                                           max_steps=STEPS, environ=os.environ)
    config = TrainConfig(model=model, data=QueueInput(DataFromList(values, shuffle=False)), callbacks=[Events()],
                         monitors=monitors, steps_per_epoch=3, max_epoch=2)
    try:
        launch_train_with_config(config, SimpleTrainer())
    except RuntimeError as err:
        print("raised:", err)
""")


def toy_run(logdir: Path, case: str, *, environ: dict[str, str]) -> list[str]:
    """The EMF file's lines after a toy run of ``case`` ("finished", "failed", "stopped")."""
    logdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO),
           **environ}
    proc = subprocess.run([sys.executable, "-c", _TOY_RUN, case, str(logdir)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from training.cloudwatch_metrics import EMF_FILE
    return (logdir / EMF_FILE).read_text().splitlines()
