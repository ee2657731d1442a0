"""How one step's gradients are formed across ranks: the order of loss scaling, the allreduce (in fp16
when compressing) and clipping, in one place.

tensorpack's ``HorovodTrainer`` allreduces what its optimizer's ``compute_gradients`` returns. Under
mixed precision that optimizer is TensorFlow's loss-scale optimizer, whose ``compute_gradients``
has already divided the gradients by the loss scale: fp16 compression would then cast unscaled
gradients to float16, where everything below ~6e-8 becomes 0 — the underflow loss scaling exists to
prevent. So the allreduce is part of the optimizer chain, between the scaled backward pass and the
unscaling, and the trainer itself does not allreduce (:class:`OptimizerAllreduceTrainer`):

    LossScale( Clip( Allreduce( Momentum ) ) )
    compute_gradients: loss x scale -> gradients -> allreduce (fp16 if compressing) -> / scale
    apply_gradients:   skip the step and lower the scale on inf/nan -> global-norm clip -> update

Without mixed precision the chain is ``Clip( Allreduce( Momentum ) )``: the same allreduce of the
same gradients as tensorpack's trainer would make.

Under mixed precision the training graph also holds, read after each step's update (training/callbacks.py
and training/cloudwatch_metrics.py report them): :data:`LOSS_SCALE_TENSOR`, the dynamic loss scale, and
:data:`SKIPPED_STEPS_TENSOR`, how many steps of this process the loss scale skipped because a gradient was
not finite (the same all-finite test the loss scale makes, on the same gradients; a local variable: not
checkpointed, counted from the start of the process; a session must run
``tf1.local_variables_initializer()``, as tensorpack's session creator does).
"""
from __future__ import annotations

from typing import Callable

from tensorpack.tfutils.optimizer import ProxyOptimizer
from tensorpack.train import HorovodTrainer

LOSS_SCALE_TENSOR = "amp/loss_scale:0"
SKIPPED_STEPS_TENSOR = "amp/skipped_steps:0"


def fp16_compression(setting: str, *, size: int, local_size: int, loss_scaled: bool) -> bool:
    """``TRAIN.GRADIENT_COMPRESSION``: "fp16", "none", or "auto" = fp16 when the ranks span nodes and
    the gradients are loss-scaled (mixed precision on GPU).

    Without a loss scale the allreduce carries the true fp32 gradients, and casting them to float16
    flushes those below its smallest subnormal (~6e-8) to 0 and keeps only a few bits of those just
    above, with no scaler to notice. "auto" only compresses where the loss scale (2^15 at the start,
    lowered on overflow) lifts them into float16's range; "fp16" compresses whatever the precision.
    """
    return setting == "fp16" or (setting == "auto" and size > local_size and loss_scaled)


def horovod_allreduce(*, compression: bool) -> Callable:
    """Wraps an optimizer so that its ``compute_gradients`` averages the gradients over all ranks."""
    import horovod.tensorflow as hvd

    def wrap(opt):
        return hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16 if compression else hvd.Compression.none,
                                        op=hvd.Average)
    return wrap


def build_optimizer(base, *, clip: float = 0.0, allreduce: Callable | None = None, mixed_precision: bool = False):
    """The chain above around ``base`` (a ``tf.compat.v1`` optimizer). ``allreduce``: from
    :func:`horovod_allreduce`, or None in a single process that builds its own training op."""
    from tensorpack.tfutils import optimizer as tp_optimizer
    from tensorpack.tfutils.gradproc import GlobalNormClip

    from training.compat import tf1
    opt = allreduce(base) if allreduce else base
    if clip > 0:
        opt = tp_optimizer.apply_grad_processors(opt, [GlobalNormClip(clip)])
    if mixed_precision:
        # float16 compute through grappler's AMP rewrite (GPU) and dynamic loss scaling around the chain
        opt = _CountSkippedSteps(tf1.mixed_precision.enable_mixed_precision_graph_rewrite(opt))
    return opt


class _CountSkippedSteps(ProxyOptimizer):
    """The loss-scale optimizer, plus the two tensors of the module docstring."""

    def __init__(self, opt):
        super().__init__(opt, name="CountSkippedSteps")
        # TensorFlow's v1 loss-scale optimizer keeps its LossScale here; calling it reads the scale.
        self._loss_scale = getattr(opt, "_loss_scale", None)
        if not callable(self._loss_scale):
            raise TypeError(f"{type(opt).__name__} has no _loss_scale to read the loss scale from: "
                            f"this TensorFlow's loss-scale optimizer differs from 2.18's")

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        from training.compat import tf, tf1
        grads = [g for g, _ in grads_and_vars if g is not None]
        update = self._opt.apply_gradients(grads_and_vars, global_step=global_step)
        with tf.name_scope("amp/"):
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
            counter = tf1.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps_counter",
                                   collections=[tf1.GraphKeys.LOCAL_VARIABLES])
            with tf.control_dependencies([update]):
                skipped = tf1.assign_add(counter, 1 - tf.cast(finite, tf.int64))
            with tf.control_dependencies([skipped]):
                tf.identity(skipped, name="skipped_steps")
                tf.identity(self._loss_scale(), name="loss_scale")
        # the count is part of the step, whether or not anything reads it
        return tf.group(update, skipped, name=name)


def amp_tensors(graph) -> dict[str, object]:
    """``{"loss_scale": tensor, "skipped_steps": tensor}`` when ``graph`` trains with mixed precision,
    else {}."""
    try:
        return {"loss_scale": graph.get_tensor_by_name(LOSS_SCALE_TENSOR),
                "skipped_steps": graph.get_tensor_by_name(SKIPPED_STEPS_TENSOR)}
    except KeyError:
        return {}


class OptimizerAllreduceTrainer(HorovodTrainer):
    """tensorpack's Horovod trainer (rank setup, variable broadcast, GPU pinning) for a model whose
    optimizer allreduces its gradients itself (:func:`build_optimizer`)."""

    def __init__(self):
        super().__init__(average=True)

    def allreduce(self, grads):
        return grads
