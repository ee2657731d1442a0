"""Input worker processes: each prepares training images straight into shared batch buffers.

Why processes, and why started this way:

* Threads stopped at ~1.2x on 2 workers: the per-box NumPy of the RPN sampler, pycocotools and
  ``np.packbits`` hold the GIL. Processes scale with cores.
* A worker is a fresh interpreter (``python -m training.data.workers``, fork + exec), never a
  fork of the trainer: the trainer holds TensorFlow, Horovod/MPI and CUDA state that a plain
  fork would copy half-alive. Not multiprocessing's ``spawn``/``forkserver`` either: their
  children re-import the parent's ``__main__``, so a trainer module that imports TensorFlow at its
  top would load it in every worker. Here a worker imports only
  ``training.data.batch_layout`` and what it needs (NumPy, OpenCV, pycocotools, no TensorFlow,
  no tensorpack).
* Results never travel through a pipe: each batch is one anonymous shared-memory file
  (``memfd``) that the parent creates and passes to the worker with the task (the descriptor
  itself, over a Unix socket: no name in /dev/shm that a crash could leak). The worker maps it
  and writes its slot; the parent's batch arrays are views of the same memory, so the parent
  does no per-image work beyond planning.
* Workers die with the parent: each holds the read end of a "lifeline" pipe whose only write
  end is in the parent; when the parent closes the pool, exits, crashes or is killed, the pipe
  reads EOF and the worker exits at once. Workers ignore SIGINT: Ctrl-C reaches the whole
  process group, and the parent (which gets it too) is the one that shuts them down. They ignore
  SIGTERM too: a stop request is the trainer's (training/stopping.py), which finishes its step and
  saves a checkpoint with their batches, but Slurm's scancel sends it to every process of the job.
* A worker's exception comes back as text (its traceback and the image's path) and is raised
  in the parent as :class:`InputWorkerError`; a worker that dies (killed, out of memory, a
  segfault in a native library) is reported with its exit status and the images it held.
"""
from __future__ import annotations

import collections
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import wait

_HEADER = struct.Struct("!I")
MAX_TASKS_PER_WORKER = 2  # one being prepared, one ready to start: a worker never waits for the parent
STOP_TIMEOUT_S = 5.0


class InputWorkerError(RuntimeError):
    """An input worker failed on an image (the message holds its path and the worker's traceback)
    or died; training cannot continue without that image's batch."""


# --------------------------------------------------------------------------------------- messages
def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise EOFError("the other end closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def send_message(sock: socket.socket, obj, fd: int | None = None) -> None:
    """Send a pickled ``obj``; ``fd``, if given, travels with it (SCM_RIGHTS: the receiver gets its
    own descriptor of the same file)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(len(data))
    if fd is None:
        sock.sendall(header + data)
        return
    sent = socket.send_fds(sock, [header], [fd])
    sock.sendall(header[sent:] + data)


def recv_message(sock: socket.socket):
    """``(obj, [descriptors])`` of the next message; EOFError when the other end is gone."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 1)
    if not head:
        raise EOFError("the other end closed the connection")
    head += _recv_exact(sock, _HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    return pickle.loads(_recv_exact(sock, size)), fds


# ----------------------------------------------------------------------------------- parent side
class _Worker:
    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc, self.sock = proc, sock
        self.in_flight: dict = {}  # task key -> image path


class WorkerPool:
    """``num_workers`` input processes. ``submit`` queues a task for a batch buffer, ``wait_done``
    returns finished task keys; tasks go to the least busy worker, at most
    ``MAX_TASKS_PER_WORKER`` each. ``close`` (also on garbage collection) stops every worker."""

    def __init__(self, num_workers: int, cfg):
        if num_workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {num_workers}")
        self._queue: collections.deque = collections.deque()
        self._workers: list[_Worker] = []
        lifeline_r, self._lifeline_w = os.pipe()  # not inheritable: only listed descriptors reach a child
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
                   # one thread per worker: the workers are the parallelism (8 ranks x N workers on a
                   # 96-core node would otherwise each start a BLAS / OpenMP pool as wide as the node)
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            for _ in range(num_workers):
                parent_sock, child_sock = socket.socketpair()
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "training.data.workers", str(child_sock.fileno()), str(lifeline_r)],
                        pass_fds=(child_sock.fileno(), lifeline_r), stdin=subprocess.DEVNULL, env=env,
                        start_new_session=True)  # Ctrl-C goes to the trainer, which stops them
                finally:
                    child_sock.close()
                self._workers.append(_Worker(proc, parent_sock))
                send_message(parent_sock, cfg)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(lifeline_r)

    def submit(self, key, fd: int, task: tuple, path: str) -> None:
        """Queue ``task`` (``(buffer id, its size, the live buffer ids, slot, layout, record,
        augmentation, rng)``) on the shared buffer ``fd``; ``path`` names the image in errors.
        ``fd`` must stay open until the task is sent (by this call or a later ``wait_done``)."""
        self._queue.append((key, fd, task, path))
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue:
            worker = min(self._workers, key=lambda w: len(w.in_flight))
            if len(worker.in_flight) >= MAX_TASKS_PER_WORKER:
                return
            key, fd, task, path = self._queue[0]
            try:
                send_message(worker.sock, (key, *task), fd)
            except OSError:
                raise self._died(worker, path) from None
            self._queue.popleft()
            worker.in_flight[key] = path

    def wait_done(self) -> list:
        """Block until some tasks finish; their keys. Raises InputWorkerError for a failed task or a
        dead worker."""
        busy = [w for w in self._workers if w.in_flight]
        if not busy:
            raise RuntimeError("wait_done with no task in flight")
        done = []
        for sock in wait([w.sock for w in busy]):
            worker = next(w for w in busy if w.sock is sock)
            try:
                (key, error), _ = recv_message(sock)
            except (EOFError, OSError):
                raise self._died(worker, ", ".join(worker.in_flight.values())) from None
            path = worker.in_flight.pop(key)
            if error is not None:
                raise InputWorkerError(f"input worker (pid {worker.proc.pid}) failed on image {path}:\n{error}")
            done.append(key)
        self._dispatch()
        return done

    def _died(self, worker: _Worker, paths: str) -> InputWorkerError:
        try:
            code = worker.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        status = ("did not exit" if code is None else f"was killed by signal {-code}" if code < 0
                  else f"exited with code {code}")
        return InputWorkerError(f"input worker (pid {worker.proc.pid}) {status} while preparing {paths or 'nothing'}"
                                " (out of memory? see the system log)")

    def close(self) -> None:
        """Stop every worker: closing the lifeline ends them even mid-image; then reap them."""
        if self._lifeline_w is not None:
            os.close(self._lifeline_w)
            self._lifeline_w = None
        for worker in self._workers:
            worker.sock.close()
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
        self._workers = []
        self._queue.clear()

    def __del__(self):
        if getattr(self, "_lifeline_w", None) is not None:
            self.close()


# ----------------------------------------------------------------------------------- worker side
def _exit_with_parent(lifeline: int) -> None:
    while os.read(lifeline, 1):  # the parent never writes: this returns only at EOF
        pass
    os._exit(0)


def _serve(sock: socket.socket) -> None:
    import cv2

    from training.data.batch_layout import AnchorCache, fill_slot
    cv2.setNumThreads(1)  # parallelism comes from the workers; OpenCV's pool would oversubscribe the cores
    (cfg, _) = recv_message(sock)
    anchors = AnchorCache(cfg)
    maps: dict[int, mmap.mmap] = {}  # the parent's batch buffers, mapped once each
    while True:
        try:
            (key, buffer_id, capacity, live_ids, slot, layout, record, aug, rng), fds = recv_message(sock)
        except EOFError:
            return
        for gone in set(maps) - set(live_ids):  # buffers the parent dropped: let their memory go
            del maps[gone]
        error = None
        try:
            if buffer_id not in maps:
                maps[buffer_id] = mmap.mmap(fds[0], capacity)
            fill_slot(layout.views(maps[buffer_id]), slot, record, aug, rng,
                      anchors.get(layout.height, layout.width), cfg)
        except Exception:  # reported to the parent, which stops training with it
            error = traceback.format_exc()
        finally:
            for fd in fds:
                os.close(fd)
        send_message(sock, (key, error))


def main(argv=None) -> None:
    sock_fd, lifeline = (int(a) for a in (argv or sys.argv[1:]))
    for sig in (signal.SIGINT, signal.SIGTERM):   # the trainer decides when its workers end (see above)
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(lifeline,), daemon=True, name="lifeline").start()
    try:
        _serve(socket.socket(fileno=sock_fd))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent went away while this worker answered


if __name__ == "__main__":
    main()
