"""Rank 0's training metrics in CloudWatch's embedded metric format (EMF), and its TensorBoard copy.

An EMF record is one JSON object on one line: the metric values and the dimension values as members,
and under ``_aws`` the timestamp and which members are metrics in which namespace with which
dimension sets (AWS, "Specification: Embedded metric format"). CloudWatch Logs turns every such
log event into metric data points, whatever sent it (AWS, "Using the PutLogEvents API to send
manually-created embedded metric format logs": the ``x-amzn-logs-format: json/emf`` header is
optional).

Where the records go, per path:

- EC2 cluster: :data:`EMF_FILE` in the run's log directory (``<EFS>/logs/<run name>/``), one record
  a line. The CloudWatch agent of the master node tails ``<EFS>/logs/*/`` + :data:`EMF_FILE`
  (infra/userdata/cluster_node.sh, ship_logs) into the deployment's node log group; the agent sends
  a log stream whose events look like EMF (``{...}`` with ``"CloudWatchMetrics"``) with that header
  (amazon-cloudwatch-agent, plugins/outputs/cloudwatchlogs). A file, not the agent's EMF listener
  on port 25888: it is the run's metric record on EFS too, and a record written while the agent is
  down (restarting, not yet installed) is sent when it is back, from the agent's saved offset.
- SageMaker: no EMF. SageMaker copies the container's output to /aws/sagemaker/TrainingJobs, one
  log event a line, but with several processes mpirun and horovodrun prefix every line
  (``[1,0]<stdout>:``), and an EMF event must be a JSON object and nothing else; SageMaker does not
  document EMF extraction for that log group either. SageMaker's own path is the training job's
  metric definitions (training.metrics.METRIC_DEFINITIONS), regexes over the same log, published
  under /aws/sagemaker/TrainingJobs with the job's Host dimension.

A run writes records only when it knows its deployment: ``MASKRCNN_DEPLOYMENT``, or the
``STACK_NAME`` of the cluster node's /etc/maskrcnn/cluster.env (mounted into the training
container). A local run (``make demo``, the tests) writes none unless told.

Records, with the names of training/metrics.py:

- at the start: step, run_active=1, heartbeat=1;
- about every ``interval_s`` seconds while steps advance: step, epoch, progress, images/s,
  images/s/gpu, learning_rate, the mean of every loss over the steps since the previous record,
  loss_not_finite (steps whose total_cost was NaN or infinite), heartbeat=1, run_active=1; where
  rank 0 has a GPU, gpu_utilization (the mean of nvidia-smi's samples since the previous record) and
  gpu_peak_memory_gib; under mixed precision amp_loss_scale and amp_skipped_steps (since the start);
- after an evaluation: the COCO mAP figures, with the epoch and step;
- at the end: run_finished, run_failed or run_stopped = 1, and run_active=0.

The alarms built on these (infra/constructs/monitoring.py) read run_active and heartbeat together:
a run that dies without its last record (killed, out of memory, its node gone) leaves run_active at 1
and its heartbeat stops.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
from typing import Callable, Iterable, Mapping

from training import metrics as names

EMF_FILE = "cloudwatch-metrics.log"
DEPLOYMENT_ENV = "MASKRCNN_DEPLOYMENT"    # the training stack's name, when not from cluster.env
CLUSTER_ENV_FILE = "/etc/maskrcnn/cluster.env"
# Set by the SageMaker launcher: a second TensorBoard event writer there, the directory SageMaker
# uploads to the job's TensorBoard S3 path while it runs.
TENSORBOARD_DIR_ENV = "MASKRCNN_TENSORBOARD_DIR"
RECORD_INTERVAL_S = 60.0                  # CloudWatch's standard resolution: one data point a minute
PATH_CLUSTER = "cluster"
PATH_SAGEMAKER = "sagemaker"
PATH_LOCAL = "local"
# A dimension value is 1 to 1024 ASCII characters with no control characters (CloudWatch Dimension).
_MAX_DIMENSION_VALUE = 1024


def _dimension_value(text: str, what: str) -> str:
    value = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)[:_MAX_DIMENSION_VALUE]
    if not any(c.isascii() and c.isalnum() for c in value):
        raise ValueError(f"{what} {text!r} has no ASCII letter or digit: CloudWatch takes only ASCII in a "
                         f"dimension value; name the deployment or the run with letters and digits")
    return value


def emf_record(values: Mapping[str, float], *, deployment: str, run: str, path: str,
               timestamp_ms: int, properties: Mapping[str, object] | None = None) -> dict:
    """One EMF document for ``values`` (metric name -> number) under training.metrics.NAMESPACE.

    Values that are not finite numbers are left out: JSON has no NaN or infinity (Python's json
    would write the bare word NaN, which CloudWatch cannot parse), and CloudWatch accepts neither.
    Units come from training.metrics.UNITS. ``properties`` are extra log fields, not metrics.
    """
    finite = {name: int(v) if isinstance(v, numbers.Integral) else float(v) for name, v in values.items()
              if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)}
    reserved = {"_aws", names.DEPLOYMENT_DIMENSION, names.RUN_DIMENSION, names.PATH_PROPERTY}
    clash = reserved & (set(finite) | set(properties or {}))
    if clash:
        raise ValueError(f"{sorted(clash)} are the record's own members, not metric or property names")
    metrics = [{"Name": name, "Unit": names.UNITS.get(name, "None")} for name in finite]
    record: dict = {
        "_aws": {"Timestamp": int(timestamp_ms), "CloudWatchMetrics": [{
            "Namespace": names.NAMESPACE,
            "Dimensions": [list(s) for s in names.DIMENSION_SETS],
            "Metrics": metrics}]},
        names.DEPLOYMENT_DIMENSION: _dimension_value(deployment, "deployment"),
        names.RUN_DIMENSION: _dimension_value(run, "run name"),
        names.PATH_PROPERTY: path,
        **(properties or {}),
        **finite,
    }
    return record


def emf_line(record: dict) -> str:
    """The record as one line of strict JSON (allow_nan=False: a NaN that slipped through is an error
    here, not an event CloudWatch drops)."""
    return json.dumps(record, allow_nan=False, separators=(",", ":"))


class EmfFile:
    """Appends records to ``<logdir>/EMF_FILE``, one line each, flushed at once (the agent reads the
    file while it grows)."""

    def __init__(self, logdir: str, *, deployment: str, run: str, path: str,
                 clock: Callable[[], float] = time.time):
        self.path = os.path.join(logdir, EMF_FILE)
        self._deployment, self._run, self._where, self._clock = deployment, run, path, clock
        _dimension_value(deployment, "deployment")
        _dimension_value(run, "run name")

    def write(self, values: Mapping[str, float], properties: Mapping[str, object] | None = None) -> dict:
        record = emf_record(values, deployment=self._deployment, run=self._run, path=self._where,
                            timestamp_ms=int(self._clock() * 1000), properties=properties)
        with open(self.path, "a") as f:
            f.write(emf_line(record) + "\n")
        return record


def _cluster_stack_name(path: str = CLUSTER_ENV_FILE) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "STACK_NAME" and value:
                    return value
    except OSError:
        return None
    return None


def deployment_and_path(environ: Mapping[str, str] = os.environ,
                        cluster_env: str = CLUSTER_ENV_FILE) -> tuple[str | None, str]:
    """The deployment the metrics belong to (None: write no records) and which path runs them."""
    path = (PATH_SAGEMAKER if "SM_TRAINING_ENV" in environ or "TRAINING_JOB_NAME" in environ
            else PATH_CLUSTER if os.path.exists(cluster_env) else PATH_LOCAL)
    deployment = environ.get(DEPLOYMENT_ENV) or (_cluster_stack_name(cluster_env)
                                                 if path == PATH_CLUSTER else None)
    return deployment, path


def _all_finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(float(v)) for v in values)


def run_status(*, failed: bool, step: int, max_steps: int) -> str:
    """Which end-of-run metric a run that ends at ``step`` reports."""
    if failed:
        return names.RUN_FAILED
    return names.RUN_FINISHED if step >= max_steps else names.RUN_STOPPED


def _monitor_class():
    """The tensorpack monitor, defined on first use: importing this module needs no TensorFlow."""
    from tensorpack.callbacks.monitor import MonitorBase

    from training.compat import tf1

    class CloudWatchMetrics(MonitorBase):
        """Writes rank 0's EMF records (see the module docstring); a monitor, so it also sees the
        COCO figures COCOEvaluator puts (``trainer.monitors.put_scalar``)."""

        def __init__(self, stats, *, sink: EmfFile, max_steps: int, global_batch: int, ranks: int,
                     interval_s: float = RECORD_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                     gpu=None):
            """``stats``: ``{name: tensor}`` of the model's losses, or a function returning it once
            the graph is built. ``gpu``: a training.gpu_metrics.GpuMetrics, started by then."""
            self._stats, self._sink, self._gpu = stats, sink, gpu
            self._max_steps, self._global_batch, self._ranks = max_steps, global_batch, max(ranks, 1)
            self._interval_s, self._clock = interval_s, clock
            self._evaluation: dict[str, float] = {}

        def _setup_graph(self):
            stats = self._stats() if callable(self._stats) else self._stats
            self._names = [n for n in names.LOSS_METRICS if n in stats]
            if names.TOTAL_COST not in self._names:
                raise ValueError(f"the model's stats have no {names.TOTAL_COST!r}: {sorted(stats)}")
            self._fetches = [stats[n] for n in self._names]
            graph = tf1.get_default_graph()
            self._lr = graph.get_tensor_by_name(names.LEARNING_RATE + ":0")
            from training.gradients import amp_tensors
            self._amp_fetches = amp_tensors(graph)

        def _reset(self):
            self._since, self._since_step = self._clock(), self.global_step
            self._sums = dict.fromkeys(self._names, 0.0)
            self._finite_steps = self._not_finite = 0

        def _before_train(self):
            self._reset()
            self._learning_rate = float("nan")
            self._amp = {}
            self._utilization = self._gpu.window() if self._gpu is not None else None
            self._sink.write({names.STEP: self.global_step, names.RUN_ACTIVE: 1, names.HEARTBEAT: 1})

        def _before_run(self, _):
            return tf1.train.SessionRunArgs(fetches=[self._fetches, self._lr, self._amp_fetches])

        def _after_run(self, _, run_values):
            losses, learning_rate, self._amp = run_values.results
            losses, self._learning_rate = [float(v) for v in losses], float(learning_rate)
            if _all_finite(losses):
                for n, v in zip(self._names, losses):
                    self._sums[n] += v
                self._finite_steps += 1
            else:
                self._not_finite += 1

        def _trigger_step(self):
            if self.global_step >= self._max_steps or self._clock() - self._since >= self._interval_s:
                self._write_progress()

        def _write_progress(self):
            steps = self.global_step - self._since_step
            if steps <= 0:
                return
            elapsed = max(self._clock() - self._since, 1e-9)
            rate = steps * self._global_batch / elapsed
            values = {names.STEP: self.global_step, names.EPOCH: self.epoch_num,
                      names.PROGRESS: 100.0 * self.global_step / self._max_steps,
                      names.IMAGES_PER_SECOND: rate, names.IMAGES_PER_SECOND_PER_GPU: rate / self._ranks,
                      names.LEARNING_RATE: self._learning_rate, names.LOSS_NOT_FINITE: self._not_finite,
                      names.HEARTBEAT: 1, names.RUN_ACTIVE: 1}
            if self._finite_steps:
                values.update({n: s / self._finite_steps for n, s in self._sums.items()})
            if self._gpu is not None:
                utilization, peak = self._utilization.take(), self._gpu.peak_memory_bytes()
                if utilization is not None:
                    values[names.GPU_UTILIZATION_MEAN] = utilization
                if peak is not None:
                    values[names.GPU_PEAK_MEMORY_GIB] = peak / 2**30
            if self._amp:
                values[names.AMP_LOSS_SCALE] = float(self._amp["loss_scale"])
                values[names.AMP_SKIPPED_STEPS] = int(self._amp["skipped_steps"])
            self._sink.write(values)
            self._reset()

        def process_scalar(self, name, val):
            if name in names.EVALUATION_METRICS:
                self._evaluation[name] = val

        def _trigger_epoch(self):
            # After the callbacks' own trigger_epoch (monitors come last): this epoch's evaluation,
            # if it had one, has put its figures.
            if self._evaluation:
                self._sink.write({**self._evaluation, names.EPOCH: self.epoch_num, names.STEP: self.global_step})
                self._evaluation = {}

        def _after_train(self):
            # tensorpack calls this from a `finally`: an exception on its way out is still current.
            failed = sys.exc_info()[0] is not None
            self._write_progress()   # the steps since the last record, however the run ends
            status = run_status(failed=failed, step=self.global_step, max_steps=self._max_steps)
            reason = (f"{sys.exc_info()[0].__name__}: {sys.exc_info()[1]}" if failed
                      else f"ended at step {self.global_step} of {self._max_steps}")
            self._sink.write({status: 1, names.RUN_ACTIVE: 0, names.STEP: self.global_step},
                             properties={"Reason": reason[:1000]})

    return CloudWatchMetrics


def monitors(stats, *, logdir: str, rank: int, ranks: int, global_batch: int, max_steps: int,
             environ: Mapping[str, str] = os.environ, gpu=None) -> list:
    """The extra tensorpack monitors of rank 0 (none on other ranks): the EMF records when the run
    knows its deployment, and a TensorBoard writer into $MASKRCNN_TENSORBOARD_DIR when set."""
    if rank != 0:
        return []
    out = []
    deployment, path = deployment_and_path(environ)
    if deployment:
        sink = EmfFile(logdir, deployment=deployment, run=os.path.basename(os.path.normpath(logdir)), path=path)
        out.append(_monitor_class()(stats, sink=sink, max_steps=max_steps, global_batch=global_batch, ranks=ranks,
                                       gpu=gpu))
    tensorboard_dir = environ.get(TENSORBOARD_DIR_ENV)
    if tensorboard_dir:
        from tensorpack.callbacks.monitor import TFEventWriter
        os.makedirs(tensorboard_dir, exist_ok=True)
        out.append(TFEventWriter(logdir=tensorboard_dir))
    return out
