"""One small digit classifier, trained unchanged under either distribution strategy.

The environment decides the strategy (``--strategy auto``, the default):
- a TF_CONFIG with ``ps`` tasks: TensorFlow 2's ParameterServerStrategy. The ``chief`` process
  schedules steps on the workers with a ClusterCoordinator; each worker applies its gradients to
  the variables on the parameter servers on its own, without waiting for the others
  (asynchronous). ``worker`` and ``ps`` processes only serve until the chief is gone.
- Horovod's variables (set by ``horovodrun`` or ``mpirun``): synchronous data parallelism; every
  step all-reduces the gradients of all ranks (``hvd.DistributedGradientTape``).
- neither: one process.

SageMaker script-mode conventions: hyperparameters arrive as ``--name value`` arguments, the data
channel is SM_CHANNEL_TRAINING (a folder holding ``digits.npz``), and the model plus
``metrics.json`` go to SM_MODEL_DIR.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

# tf.keras must be Keras 2 (tf-keras), the project's convention: its variables and optimizers
# are the ones ParameterServerStrategy knows how to place on ps tasks. Set before TensorFlow is
# imported, here too, because mpirun on SageMaker forwards only the variables it is told to.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
if not __package__:
    # Run as a file (SageMaker's entry_script): make the `script_mode` package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402  (type hints)
import json  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from script_mode import cluster as cl  # noqa: E402
from script_mode import data as digits_data  # noqa: E402
from script_mode.hyperparameters import parse_args  # noqa: E402

METRICS_FILE = "metrics.json"
SAVED_MODEL_DIR = "1"  # a numeric version folder, as TensorFlow Serving expects


# ---------------------------------------------------------------- model, data, evaluation

def build_model() -> tf.keras.Model:
    """A LeNet-sized CNN: big enough for >95 % on the generated digits, small for 2 CPU cores."""
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input((digits_data.IMAGE_SIZE, digits_data.IMAGE_SIZE, 1)),
        layers.Rescaling(1.0 / 255),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(digits_data.NUM_CLASSES),
    ])


def train_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, shard: int, num_shards: int,
                  seed: int) -> tf.data.Dataset:
    """This worker's shard of the training set, shuffled, batched and repeated forever."""
    ds = tf.data.Dataset.from_tensor_slices((x[..., None], y)).shard(num_shards, shard)
    ds = ds.shuffle(len(x) // num_shards + 1, seed=seed + shard, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)


def _loss(labels, logits):
    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def test_accuracy(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    logits = model.predict(x[..., None], batch_size=500, verbose=0)
    return float(np.mean(np.argmax(logits, axis=1) == y))


# ---------------------------------------------------------------- run records

class Recorder:
    """Times training (evaluation excluded) and keeps the per-epoch test accuracy."""

    def __init__(self, target: float):
        self.start_wall = time.perf_counter()
        self.target = target
        self.train_time = 0.0
        self.history: list[dict] = []
        self.time_to_target: float | None = None
        self._t = None

    def begin_epoch(self):
        self._t = time.perf_counter()

    def end_epoch(self):
        self._epoch_time = time.perf_counter() - self._t
        self.train_time += self._epoch_time

    def epoch_result(self, epoch: int, accuracy: float, images: int):
        self.history.append({"epoch": epoch, "test_accuracy": round(accuracy, 4),
                             "epoch_time_s": round(self._epoch_time, 3),
                             "train_time_s": round(self.train_time, 3), "images": images})
        if self.time_to_target is None and accuracy >= self.target:
            self.time_to_target = self.train_time
        print(f"epoch {epoch}: test accuracy {accuracy:.4f}, training time {self.train_time:.1f} s",
              flush=True)

    def _steady_throughput(self) -> float | None:
        if len(self.history) < 2:
            return None
        images = self.history[-1]["images"] - self.history[0]["images"]
        seconds = sum(h["epoch_time_s"] for h in self.history[1:])
        return round(images / seconds, 1)

    def metrics(self, **extra) -> dict:
        images = self.history[-1]["images"] if self.history else 0
        return {
            **extra,
            "test_accuracy": self.history[-1]["test_accuracy"] if self.history else None,
            "target_accuracy": self.target,
            "time_to_target_s": None if self.time_to_target is None else round(self.time_to_target, 3),
            "train_time_s": round(self.train_time, 3),
            "wall_time_s": round(time.perf_counter() - self.start_wall, 3),
            "train_images": images,
            "images_per_s": round(images / self.train_time, 1) if self.train_time else None,
            # Without the first epoch, which also traces functions and (ps) ships the data.
            "images_per_s_steady": self._steady_throughput(),
            "history": self.history,
        }


def write_outputs(model: tf.keras.Model, metrics: dict, model_dir: str) -> None:
    """Save the model (SavedModel, servable) and metrics.json; the JSON goes in atomically."""
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / SAVED_MODEL_DIR)
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(metrics, f, indent=2)
    os.chmod(tmp, 0o644)  # mkstemp makes it owner-only
    os.replace(tmp, out / METRICS_FILE)
    print(f"metrics: {json.dumps({k: v for k, v in metrics.items() if k != 'history'})}",
          flush=True)


def _configure_threads(threads: int) -> None:
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)


# ---------------------------------------------------------------- strategy: parameter server

def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def serve(config: dict, args: argparse.Namespace) -> int:
    """A worker or ps: run a TensorFlow server until the chief has come and gone.

    TF2's workers and parameter servers run no training code of their own; the chief drives them
    over gRPC. Nothing tells them that training is over, so they watch the chief's port (as
    SageMaker's toolkit does for its parameter servers).
    """
    task = config["task"]
    # Intra-op only: with one inter-op thread per process the ps cluster hung here (cross-task
    # Send/Recv waiting on each other).
    proto = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads)
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
                                  task_index=task["index"], protocol="grpc", config=proto,
                                  start=True)
    del server  # kept alive by the runtime; nothing to call on it
    chief = config["cluster"][cl.CHIEF][0]
    print(f"{task['type']} {task['index']} serving; waiting for the chief at {chief}", flush=True)
    deadline = time.monotonic() + args.startup_timeout
    while not _reachable(chief):
        if time.monotonic() > deadline:
            print(f"error: the chief at {chief} did not start within {args.startup_timeout:.0f} s",
                  file=sys.stderr, flush=True)
            return 2
        time.sleep(1)
    misses = 0
    while misses < 3:  # three misses in a row: the chief has exited, not just blinked
        time.sleep(1)
        misses = 0 if _reachable(chief) else misses + 1
    print(f"{task['type']} {task['index']}: chief gone, stopping", flush=True)
    return 0


def _apply_gradients(model, optimizer, images, labels, wrap_tape=lambda tape: tape):
    """One SGD step on one batch; Horovod wraps the tape so the gradients are all-reduced."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(_loss(labels, model(images, training=True)))
    grads = wrap_tape(tape).gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def fit(args: argparse.Namespace, digits: digits_data.Digits, run_epoch, images_per_epoch: int,
        model_to_test) -> Recorder:
    """The epoch loop all strategies share: train one epoch (``run_epoch``), then test the model
    ``model_to_test()`` returns (None: this process does not evaluate)."""
    rec = Recorder(args.target_accuracy)
    for epoch in range(1, args.epochs + 1):
        rec.begin_epoch()
        run_epoch()
        rec.end_epoch()
        model = model_to_test()
        if model is not None:
            rec.epoch_result(epoch, test_accuracy(model, digits.x_test, digits.y_test),
                             epoch * images_per_epoch)
    return rec


def _settings(args: argparse.Namespace) -> dict:
    return {"epochs": args.epochs, "batch_size_per_worker": args.batch_size,
            "learning_rate": args.learning_rate}


def train_ps(config: dict, args: argparse.Namespace, digits: digits_data.Digits) -> dict:
    """The chief: build variables on the ps tasks, schedule steps on the workers, evaluate."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config["cluster"]), task_type=cl.CHIEF, task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    with strategy.scope():  # variables and optimizer slots live on the ps tasks
        model = build_model()
        optimizer = tf.keras.optimizers.Adam(args.learning_rate)

    x, y = digits.x_train, digits.y_train

    def per_worker_dataset_fn():
        # Traced here, run on each worker; its input pipeline id picks its shard of the data.
        return strategy.distribute_datasets_from_function(
            lambda ctx: train_dataset(x, y, args.batch_size, ctx.input_pipeline_id,
                                      ctx.num_input_pipelines, args.seed))

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def train_step(it):
        images, labels = next(it)
        return strategy.run(lambda i, l: _apply_gradients(model, optimizer, i, l),
                            args=(images, labels))

    # One epoch = the training set once, whichever worker takes each step. `schedule` returns at
    # once; a free worker runs the step and updates the variables without waiting for others.
    steps = len(x) // args.batch_size

    def run_epoch():
        for _ in range(steps):
            coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()

    eval_model = build_model()  # a local copy: evaluation must not run through the ps tasks

    def model_to_test():
        eval_model.set_weights(model.get_weights())
        return eval_model

    rec = fit(args, digits, run_epoch, steps * args.batch_size, model_to_test)
    return {"model": eval_model,
            "metrics": rec.metrics(strategy="ps", workers=len(config["cluster"][cl.WORKER]),
                                   parameter_servers=len(config["cluster"][cl.PS]),
                                   **_settings(args))}


# ---------------------------------------------------------------- strategy: Horovod

def train_horovod(args: argparse.Namespace, digits: digits_data.Digits) -> None:
    """Every rank trains on its shard; rank 0 evaluates and writes the outputs."""
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = build_model()
    optimizer = tf.keras.optimizers.Adam(args.learning_rate)
    x, y = digits.x_train, digits.y_train
    iterator = iter(train_dataset(x, y, args.batch_size, rank, size, args.seed))

    @tf.function
    def train_step(images, labels, first):
        # DistributedGradientTape averages the gradients of all ranks: every rank applies the
        # same update, so the copies stay equal.
        loss = _apply_gradients(model, optimizer, images, labels, hvd.DistributedGradientTape)
        if first:
            # Start every rank from rank 0's weights (the optimizer slots exist only now).
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    # Same images per epoch as the ps strategy: the training set once, split over the ranks.
    steps = len(x) // (args.batch_size * size)
    first = [True]

    def run_epoch():
        for _ in range(steps):
            train_step(*next(iterator), tf.constant(first[0]))
            first[0] = False

    rec = fit(args, digits, run_epoch, steps * args.batch_size * size,
              lambda: model if rank == 0 else None)
    if rank == 0:
        write_outputs(model, rec.metrics(strategy="horovod", workers=size, parameter_servers=0,
                                         **_settings(args)), args.model_dir)
    # Leave together: a rank that exits while another is still in Horovod's loop breaks its
    # Gloo connection and makes that rank report an error.
    hvd.join()
    hvd.shutdown()


def train_single(args: argparse.Namespace, digits: digits_data.Digits) -> dict:
    model = build_model()
    optimizer = tf.keras.optimizers.Adam(args.learning_rate)
    iterator = iter(train_dataset(digits.x_train, digits.y_train, args.batch_size, 0, 1, args.seed))
    train_step = tf.function(lambda images, labels: _apply_gradients(model, optimizer, images,
                                                                     labels))
    steps = len(digits.x_train) // args.batch_size

    def run_epoch():
        for _ in range(steps):
            train_step(*next(iterator))

    rec = fit(args, digits, run_epoch, steps * args.batch_size, lambda: model)
    return {"model": model, "metrics": rec.metrics(strategy="single", workers=1,
                                                   parameter_servers=0, **_settings(args))}


# ---------------------------------------------------------------- entry point

def detect_strategy(env: dict[str, str] | None = None) -> str:
    """What the launcher set up: a TF_CONFIG with ps tasks, Horovod's rank variables, or nothing."""
    env = os.environ if env is None else env
    if "TF_CONFIG" in env and cl.PS in json.loads(env["TF_CONFIG"]).get("cluster", {}):
        return "ps"
    if "HOROVOD_RANK" in env or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "horovod"
    return "single"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    strategy = detect_strategy() if args.strategy == "auto" else args.strategy
    tf.keras.utils.set_random_seed(args.seed)
    _configure_threads(args.threads)

    if strategy == "ps":
        if "TF_CONFIG" not in os.environ:
            raise SystemExit("error: --strategy ps needs TF_CONFIG; start it with "
                             "`python -m script_mode.local --strategy ps` or on SageMaker")
        config = cl.normalize(json.loads(os.environ["TF_CONFIG"]))
        if config["task"]["type"] in (cl.WORKER, cl.PS):
            return serve(config, args)
    digits = digits_data.load(args.data_dir)
    if strategy == "horovod":
        train_horovod(args, digits)
        return 0
    result = train_ps(config, args, digits) if strategy == "ps" else train_single(args, digits)
    write_outputs(result["model"], result["metrics"], args.model_dir)
    return 0


if __name__ == "__main__":
    code = main()
    # Worker/ps processes hold a gRPC server that can keep the interpreter from exiting cleanly.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
