"""Horovod collectives outside the training graph (startup verdicts, resume state, evaluation
results), run in short-lived sessions that never create a GPU device.

tensorpack's ``HorovodTrainer`` creates its session with ``visible_device_list = local rank``, so
GPU:0 of rank k is physical GPU k. TensorFlow fixes that mapping, once per process, when the first
session that uses GPUs is created: a session created earlier with the default config maps GPU:0
to physical GPU 0 on every rank, and on local ranks 1..7 the trainer's session then fails with
"TensorFlow device (GPU:0) is being mapped to multiple devices" (and every rank holds memory on
GPU 0). The sessions here set ``device_count={"GPU": 0}``: TensorFlow's GPU device factory then
returns before parsing the visible device list or creating any GPU device ("If we aren't going to
use any GPUs, don't initialize them", ``BaseGPUDeviceFactory::CreateDevices``), so the trainer's
session is the first and only one that maps GPUs, whenever these run. The collectives themselves
run on the CPU (Horovod's MPI/Gloo path). ``tests/training/test_startup_devices.py`` traces every
session a 2-process run creates and checks this.
"""
from __future__ import annotations


def cpu_only_session_config():
    """A session config that creates no GPU device (and so cannot fix the process's GPU mapping)."""
    from training.compat import tf1
    return tf1.ConfigProto(allow_soft_placement=True, device_count={"GPU": 0})


def active_horovod():
    """horovod.tensorflow when it is initialised with more than one process, else None."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    try:
        if not hvd.is_initialized() or hvd.size() == 1:
            return None
    except ValueError:  # older Horovod raises instead of answering is_initialized
        return None
    return hvd


def _run(collective):
    from training.compat import tf, tf1
    with tf.Graph().as_default() as graph, tf.device("/cpu:0"):
        with tf1.Session(graph=graph, config=cpu_only_session_config()) as session:
            return collective(session)


def broadcast_object(value, *, name: str):
    """Rank 0's ``value`` on every rank (``value`` unchanged without Horovod or with one process)."""
    hvd = active_horovod()
    if hvd is None:
        return value
    return _run(lambda session: hvd.broadcast_object(value, root_rank=0, session=session, name=name))


def allgather_object(value, *, name: str) -> list:
    """Every rank's ``value``, in rank order (``[value]`` without Horovod or with one process)."""
    hvd = active_horovod()
    if hvd is None:
        return [value]
    return _run(lambda session: hvd.allgather_object(value, session=session, name=name))
