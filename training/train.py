"""Train Mask R-CNN / Faster R-CNN with Horovod; one process per GPU (or per CPU slot).

    horovodrun -np 2 -H localhost:2 --gloo python -m training.train --logdir train_log/run1 \\
        --config MODE_MASK=True TRAIN.BATCH_SIZE_PER_GPU=2 ...

Rank 0 logs, writes TensorBoard events and checkpoints into --logdir; a run whose log dir holds
a checkpoint continues from it at the saved global step. Bad configuration or data stops here,
before any graph is built. SIGTERM stops every rank at the next step, after rank 0 saved a
checkpoint of it (and wrote stopped.json); rank 0 also keeps heartbeat.json current.

Exit status: 0 trained to the end of the schedule (or nothing left to train); 2 bad configuration
or data; 75 stopped by SIGTERM, after a checkpoint of the last step trained (or during the
start-up, before any step): the same command with the same --logdir continues; anything else:
training failed.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys

# How long the end of training waits for the input thread to finish the batch it is preparing.
# Short, because a stop's grace (SIGKILL after it) runs meanwhile.
INPUT_THREAD_JOIN_S = 15.0

# TensorFlow is imported once the arguments are read: `--help` and usage errors answer at once,
# without the seconds TensorFlow takes to load.


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="maskrcnn train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--logdir", required=True, help="checkpoints, events, logs; resumed from when it has a checkpoint")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides (see training/config.py), values as Python literals")
    p.add_argument("--preset", default="", help="modules in training/configs whose OVERRIDES apply first, in "
                                                "order, comma-separated (e.g. cpu_synthetic or cpu_synthetic,finetune)")
    return p.parse_args(argv)


def build_config(overrides, *, preset: str = ""):
    """Defaults, then each preset's OVERRIDES in order ("cpu_synthetic,finetune"), then ``overrides``."""
    import importlib
    from training.config import ConfigError, new_config
    cfg = new_config()
    for name in filter(None, (n.strip() for n in preset.split(","))):
        try:
            module = importlib.import_module(f"training.configs.{name}")
        except ModuleNotFoundError:
            raise ConfigError(f"--preset: no preset {name!r}; presets are the modules of training/configs "
                              f"(e.g. cpu_synthetic, finetune)") from None
        cfg.update_args(module.OVERRIDES)
    cfg.update_args(overrides)
    return cfg


def load_data(cfg, *, validate_files: bool = True):
    """The training records (all DATA.TRAIN splits) and the first validation split (None when
    DATA.VAL is empty: the run does not evaluate); errors now.

    ``validate_files``: check that every listed image exists (one stat per image: 118k on EFS for
    COCO). Rank 0 does it; the other ranks only read the annotations and wait for its verdict.
    """
    from training.data.coco import load_split, load_splits
    # the records only: pycocotools' index of the training file would hold the annotations twice
    train = load_splits(cfg.DATA.BASEDIR, cfg.DATA.TRAIN, validate=validate_files, keep_coco=False)
    roidb = [r for split in train for r in split.training_roidb()]
    if not cfg.DATA.VAL:
        return train[0], roidb, None
    val = load_split(cfg.DATA.BASEDIR, cfg.DATA.VAL[0], validate=validate_files, require_annotations=False)
    if val.class_names != train[0].class_names:
        from training.data.coco import DatasetError
        raise DatasetError(f"validation split {val.name!r} has categories {val.class_names[1:]}, "
                           f"training has {train[0].class_names[1:]}")
    return train[0], roidb, val


def resolve_weights(path: str, basedir: str, key: str) -> str:
    """An existing checkpoint prefix or .npz for ``key``; relative names are also looked up in DATA.BASEDIR."""
    if not path:
        return ""
    from training.compat import tf
    from training.config import ConfigError
    candidates = [path] if os.path.isabs(path) else [path, os.path.join(basedir, path)]
    for c in candidates:
        if os.path.isfile(c) or os.path.isfile(c + ".index"):
            return c
        if os.path.isdir(c):
            latest = tf.train.latest_checkpoint(c)
            if latest:
                return latest
    raise ConfigError(f"{key}: no checkpoint or .npz at {' or '.join(candidates)} "
                      f"(give an .npz file, a checkpoint prefix like model-5000, or a log dir)")


def pretrained_init(path: str):
    """A checkpoint given as BACKBONE.WEIGHTS: every matching variable but the global step, which
    starts at 0. (An .npz there is restored strictly, weights.strict_backbone_init; a whole model
    to fine-tune from is TRAIN.LOAD_MODEL, weights.strict_finetune_init.)"""
    from tensorpack.tfutils.sessinit import SaverRestoreRelaxed
    return SaverRestoreRelaxed(path, ignore=("global_step",))


def session_config(cfg, local_size: int):
    from tensorpack.tfutils.sesscreate import NewSessionCreator
    from tensorpack.tfutils.common import get_default_sess_config
    from training.compat import tf
    conf = get_default_sess_config()
    threads = max(1, multiprocessing.cpu_count() // max(local_size, 1))
    conf.intra_op_parallelism_threads = threads  # don't oversubscribe the cores shared by local ranks
    conf.inter_op_parallelism_threads = threads
    gpu = bool(tf.config.list_physical_devices("GPU"))
    # TRAIN.XLA compiles the training tower's static-shaped parts only (generalized_rcnn._xla_scope):
    # no session-wide auto-clustering, which would also compile the evaluation tower (a new image
    # size every image) and the mask head (a new row count almost every step).
    if not gpu:
        # grappler's memory optimizer serves GPU memory only; on CPU it just logs cost-model warnings.
        # The rest of grappler stays on here too: it adds ~3 s to a CPU process's first step, but made
        # the demo config's steps ~13% faster (docs/training.md), which matters more over 1000 steps.
        from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig
        conf.graph_options.rewrite_options.memory_optimization = RewriterConfig.OFF
    return NewSessionCreator(config=conf)


def main(argv=None) -> int:
    from training import stopping
    # First: SIGTERM (a SageMaker stop, scancel, a spot interruption) is recorded from now on, and
    # training stops at a step boundary with a checkpoint instead of dying (training/stopping.py).
    stopping.install_handler()
    args = parse_args(argv)
    from training.compat import tf, tf1, use_graph_mode
    use_graph_mode()
    import horovod.tensorflow as hvd
    from tensorpack import QueueInput, StagingInput, TrainConfig, launch_train_with_config, logger as tp_logger
    from tensorpack.callbacks import MergeAllSummaries, MovingAverageSummary, RunUpdateOps
    from tensorpack.callbacks.monitor import JSONWriter, TFEventWriter
    from tensorpack.tfutils.sessinit import ChainInit, SmartInit

    from training import callbacks as cb, cloudwatch_metrics, collectives, gpu_metrics, gradients
    from training.config import ConfigError, finalize, gpu_environment
    from training.data.coco import DatasetError
    from training.data.pipeline import TrainingBatches
    from training.planned_time import PlannedTime
    from training.resume import RESUMED_FROM, plan as plan_resume, resumed_from, set_global_step
    from training.model.generalized_rcnn import MaskRCNN

    hvd.init()
    stopping.install_handler()  # again: MPI's initialisation may have set its own SIGTERM handler
    rank, size = hvd.rank(), hvd.size()
    # before anything creates TensorFlow's eager context: its GPU:0 is then this rank's GPU
    gpu_memory_unavailable = gpu_metrics.pin_eager_gpu(hvd.local_rank())
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    # Before the trainer's session, collectives run in sessions that create no GPU device
    # (training/collectives.py): the trainer's session alone maps GPU:0 to this rank's GPU.
    error, resume = None, None
    logdir = os.path.abspath(args.logdir)
    try:
        cfg = build_config(args.config, preset=args.preset)
        train_split, roidb, val_split = load_data(cfg, validate_files=rank == 0)
        finalize(cfg, num_ranks=size, class_names=train_split.class_names, num_train_images=len(roidb))
        if rank == 0:  # the checkpoint, and the global batch its step counts (config.json)
            resume = plan_resume(logdir, cfg)
        load_model = resolve_weights(cfg.TRAIN.LOAD_MODEL, cfg.DATA.BASEDIR, "TRAIN.LOAD_MODEL (load_model)")
        backbone_weights = resolve_weights(cfg.BACKBONE.WEIGHTS, cfg.DATA.BASEDIR,
                                           "BACKBONE.WEIGHTS (backbone_weights)")
        if backbone_weights.endswith(".npz"):  # every backbone variable, right norm, or stop here
            from training.model.weights import check_weights_file
            check_weights_file(backbone_weights, cfg)
        if load_model:  # every variable of the model, in its shape (class layers aside), or stop here
            from training.model.weights import check_model_file
            check_model_file(load_model, cfg)
    except (ConfigError, DatasetError) as err:
        error = f"error: {err}" + (f" (rank {rank})" if size > 1 else "")
    # every rank stops on any rank's error (rank 0's file check included), or none does; and on a
    # stop requested during the start-up (nothing trained yet: nothing to save)
    verdicts = collectives.allgather_object((error, stopping.requested()), name="startup_verdict")
    errors = [e for e, _ in verdicts if e]
    if errors:
        if rank == 0 or error:
            print(error or errors[0], file=sys.stderr, flush=True)
        return 2
    if any(stop for _, stop in verdicts):
        if rank == 0:
            print(f"stopped by {stopping.signal_name()} before training started: nothing trained in this run, "
                  f"nothing to save (exit status {stopping.STOPPED_EXIT_STATUS})", flush=True)
        return stopping.STOPPED_EXIT_STATUS
    has_gpu = bool(tf.config.list_physical_devices("GPU"))  # lists devices only: creates none, maps nothing
    if cfg.TRAIN.MIXED_PRECISION or cfg.TRAIN.XLA:
        if not has_gpu:
            print("note: TRAIN.MIXED_PRECISION / TRAIN.XLA apply on GPU only; ignored on this CPU run", flush=True)
    for key, value in gpu_environment(cfg).items():  # read when the first GPU kernels are made
        os.environ.setdefault(key, value)

    resume = collectives.broadcast_object(resume, name="resume_state")
    ckpt, step = (resume.checkpoint, resume.step) if resume else (None, 0)
    spe = cfg.TRAIN.STEPS_PER_EPOCH
    if step >= cfg.TRAIN.MAX_STEPS:
        if rank == 0:
            print(f"{ckpt} is at step {step}, the end of the schedule ({cfg.TRAIN.MAX_STEPS}): nothing to train", flush=True)
        return 0
    starting_epoch = step // spe + 1
    if rank == 0:
        tp_logger.set_logger_dir(logdir, action="k")
        with open(os.path.join(logdir, cb.CONFIG_FILE + ".tmp"), "w") as f:
            resumed = {RESUMED_FROM: resumed_from(ckpt, resume.saved)} if resume else {}
            json.dump({**cfg.to_dict(), "_category_ids": train_split.contiguous_to_coco_id, **resumed}, f,
                      indent=1, default=str)
        os.replace(os.path.join(logdir, cb.CONFIG_FILE + ".tmp"), os.path.join(logdir, cb.CONFIG_FILE))
        print(f"training on {size} rank(s), {cfg.TRAIN.BATCH_SIZE_PER_GPU} image(s) per rank, "
              f"{len(roidb)} training images; {cfg.TRAIN.MAX_STEPS} steps = {cfg.TRAIN.MAX_EPOCH} epochs of {spe}"
              f"{_last_epoch_note(cfg.TRAIN.MAX_STEPS, spe)}; "
              f"LR {cfg.TRAIN.SCALED_LR:g}" + (f"; {resume.message}" if resume else ""), flush=True)
        from training import schedule
        print(schedule.plan(cfg, num_images=len(roidb)), flush=True)
        from training.model.weights import from_scratch_warning
        if not resume and (warning := from_scratch_warning(cfg)):  # a new run: not again at each resume
            print(warning, flush=True)
        if val_split is None:
            print("DATA.VAL is empty: this run does not evaluate (evaluate a checkpoint later with "
                  "maskrcnn predict --split S --evaluate)", flush=True)

    if ckpt:
        session_init = SmartInit(ckpt)
        if step != resume.saved_step:  # another global batch: the step of the same images seen
            session_init = ChainInit([session_init, set_global_step(step)])
    elif load_model:
        print(f"fine-tuning from {load_model}", flush=True)
        from training.model.weights import strict_finetune_init
        session_init = strict_finetune_init(load_model)
    elif backbone_weights:
        print(f"backbone weights from {backbone_weights}", flush=True)
        if backbone_weights.endswith(".npz"):
            from training.model.weights import strict_backbone_init
            session_init = strict_backbone_init(backbone_weights, norm=cfg.BACKBONE.NORM)
        else:
            session_init = pretrained_init(backbone_weights)
    else:
        session_init = None
    if rank != 0:  # the trainer broadcasts rank 0's variables (global step included) after init
        session_init = None

    tf1.set_random_seed(cfg.TRAIN.SEED + rank)
    model = MaskRCNN(cfg)
    # A few batches queued, not tensorpack's default 50: host memory per rank (docs/training.md)
    queue = tf1.FIFOQueue(cfg.DATA.QUEUE_BATCHES, [s.dtype for s in model.inputs()], name="input_queue")
    data = QueueInput(TrainingBatches(roidb, cfg, seed=cfg.TRAIN.SEED, rank=rank, start_step=step), queue=queue)
    if has_gpu:
        data = StagingInput(data)  # the next batch's host-to-device copy overlaps this step
    # the model's optimizer allreduces inside loss scaling (training/gradients.py), not the trainer
    loss_scaled = cfg.TRAIN.MIXED_PRECISION and has_gpu  # as the model's optimizer
    if rank == 0 and cfg.TRAIN.GRADIENT_COMPRESSION == "fp16" and not loss_scaled:
        print("note: TRAIN.GRADIENT_COMPRESSION='fp16' without loss scaling (mixed precision on GPU): the "
              "allreduce rounds the fp32 gradients to fp16, flushing those below ~6e-8 to zero; 'auto' "
              "compresses only loss-scaled gradients", flush=True)
    model.allreduce = gradients.horovod_allreduce(compression=gradients.fp16_compression(
        cfg.TRAIN.GRADIENT_COMPRESSION, size=size, local_size=hvd.local_size(), loss_scaled=loss_scaled))
    trainer = gradients.OptimizerAllreduceTrainer()
    global_batch = cfg.TRAIN.BATCH_SIZE_PER_GPU * size
    # rank 0 reports its GPU on the progress line and in the CloudWatch records, the others in a line each
    rank_gpu = gpu_metrics.GpuMetrics(local_rank=hvd.local_rank(), memory_unavailable=gpu_memory_unavailable)
    gpu = rank_gpu if rank == 0 else None

    # rank 0 only (tensorpack drops chief-only callbacks on the other ranks); before the evaluation,
    # so an epoch's checkpoint exists however long its evaluation takes
    checkpoints = cb.Checkpoints(logdir, every_epochs=cfg.TRAIN.CHECKPOINT_PERIOD, last_epoch=cfg.TRAIN.MAX_EPOCH,
                                 minutes=cfg.TRAIN.CHECKPOINT_MINUTES)
    stop = cb.StopOnRequest(checkpoints=checkpoints, logdir=logdir, rank=rank, steps_per_epoch=spe)
    callbacks = [
        cb.EpochSteps(start_step=step, steps_per_epoch=spe, max_steps=cfg.TRAIN.MAX_STEPS),
        # the model's statistics exist once the graph is built: hand over a getter
        cb.ProgressLogger(lambda: model.stats, period=cfg.TRAIN.LOG_PERIOD, global_batch=global_batch,
                          max_steps=cfg.TRAIN.MAX_STEPS, steps_per_epoch=spe, gpu=gpu),
        checkpoints,
        cb.Heartbeat(logdir, steps_per_epoch=spe),
        PlannedTime(global_batch=global_batch, max_steps=cfg.TRAIN.MAX_STEPS),
    ]
    if rank != 0:
        callbacks.append(cb.RankGpuLogger(rank_gpu, period=cfg.TRAIN.LOG_PERIOD, max_steps=cfg.TRAIN.MAX_STEPS, rank=rank))
    if val_split is not None:  # without it no predict tower is built either
        callbacks.append(cb.COCOEvaluator(cfg, val_split, logdir=logdir if rank == 0 else None, rank=rank, size=size))
    callbacks.append(stop)  # last: the other callbacks have done their work on the step it stops after
    config = TrainConfig(
        model=model, data=data, callbacks=callbacks,
        extra_callbacks=[MovingAverageSummary(), MergeAllSummaries(period=max(cfg.TRAIN.LOG_PERIOD, 50)),
                         RunUpdateOps()],
        monitors=[TFEventWriter(), JSONWriter(), *cloudwatch_metrics.monitors(  # CloudWatch EMF, SageMaker TensorBoard
            lambda: model.stats, logdir=logdir, rank=rank, ranks=size, global_batch=global_batch, max_steps=cfg.TRAIN.MAX_STEPS,
            gpu=gpu)],
        steps_per_epoch=spe, starting_epoch=starting_epoch, max_epoch=cfg.TRAIN.MAX_EPOCH,
        session_init=session_init, session_creator=session_config(cfg, hvd.local_size()))
    if gpu is not None:
        gpu.start()
        cb.announce_gpu_metrics(gpu)
    try:
        launch_train_with_config(config, trainer)
    finally:
        if gpu is not None:
            gpu.stop()
        _join_input_thread(data)
    if stop.stopped is None:
        return 0
    # Every rank waits here for rank 0's record, written after its checkpoint: no launcher sees a
    # rank exit (and kills the others) while rank 0 is still saving.
    record = collectives.broadcast_object(stop.record, name="stop_record")
    if rank == 0:
        saved = (f"checkpoint {os.path.join(logdir, record['checkpoint'])}" if record["checkpoint"] else
                 f"but its checkpoint could not be written (see the error above); the latest is "
                 f"{cb.latest_checkpoint(logdir) or 'none'}")
        print(f"stopped by {record['signal']} after step {record['step']} of {cfg.TRAIN.MAX_STEPS}, {saved}; "
              f"the same command with the same --logdir continues from it (exit status "
              f"{stopping.STOPPED_EXIT_STATUS})", flush=True)
    return stopping.STOPPED_EXIT_STATUS


def _join_input_thread(data, timeout_s: float = INPUT_THREAD_JOIN_S) -> None:
    """Waits for tensorpack's enqueue thread, which ends once it finds the session closed.

    It is a daemon thread that tensorpack does not join: left running, it can be inside a
    TensorFlow call (its last enqueue, or closing the queue) while the interpreter exits, and a
    thread that wakes up in a finalizing interpreter is ended through TensorFlow's C++ frames,
    which aborts the process ("FATAL: exception not rethrown") after training succeeded."""
    source = getattr(data, "_input", data)   # StagingInput wraps the QueueInput
    thread = getattr(source, "thread", None)
    if thread is None:
        return
    thread.join(timeout_s)
    if thread.is_alive():
        print(f"warning: the input thread still runs {timeout_s:.0f} s after training ended", flush=True)


def _last_epoch_note(max_steps: int, steps_per_epoch: int) -> str:
    rest = max_steps % steps_per_epoch
    return f" (the last of {rest})" if rest else ""


if __name__ == "__main__":
    sys.exit(main())
