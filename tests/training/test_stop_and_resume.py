"""A real 2-rank training run (horovodrun --gloo, as `make demo` starts it) stopped by SIGTERM
mid-epoch, the signal sent to the ranks as a job script or interruption watcher sends it
(``python -m launch.rank_signals --logdir``): both ranks stop after the same step, every step up to
the stop is kept (a checkpoint of that step, later than the last per-epoch one), and the ranks
exit with the documented status. Rank 0's log shows the stop's order of events: the signal, at most
the step already under way, that step's checkpoint, ``stopped.json``, the stop line. The next run
in the same log dir continues at that step with the same schedule (epoch ends, last step), writing
time-interval checkpoints (TRAIN.CHECKPOINT_MINUTES) under the same retention as the per-epoch ones.

A step takes a fraction of a second here, so epochs are 20 steps: the signal, sent when step 23 is
logged, lands well inside epoch 2 (steps 21-40) even on a loaded machine.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from event_order import out_of_order, rank_output
from test_train_run import REPO, train_args
from training.callbacks import latest_checkpoint
from training.run_status import STOP_FILE, epoch_of, read_heartbeat
from training.stopping import STOPPED_EXIT_STATUS

RANKS = 2
STEPS_PER_EPOCH = 20
LAST = 2 * STEPS_PER_EPOCH
SIGNAL_AT = 23
SAGEMAKER_GRACE_S = 120   # SageMaker's SIGKILL follows its SIGTERM after 120 s (Slurm's: after KillWait)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from training.data.synthetic import SyntheticSpec, generate
    out = tmp_path_factory.mktemp("shapes")
    generate(out, SyntheticSpec(train=12, val=4, size=96, max_object_size=48, seed=3))
    return out


def _train(logdir, data, *extra) -> list[str]:
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    assert horovodrun, "horovodrun is missing next to the interpreter: run `make install`"
    return [horovodrun, "-np", str(RANKS), "-H", f"localhost:{RANKS}", "--gloo", sys.executable, "-m",
            "training.train", *train_args(logdir, data, 2, f"TRAIN.IMAGES_PER_EPOCH={RANKS * 2 * STEPS_PER_EPOCH}",
                                          "DATA.VAL=()", *extra)]


def _env():
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                PYTHONPATH=str(REPO))


def _steps(out: str) -> list[int]:
    # rank 0's progress lines, behind horovodrun's "[0]<stdout>:" prefix
    return [int(m.group(1)) for m in re.finditer(rf"\bstep (\d+)/{LAST} ", out)]


def _listed(logdir) -> list[str]:
    state = (logdir / "checkpoint").read_text()
    return re.findall(r'^all_model_checkpoint_paths: "([^"]+)"', state, re.M)


@pytest.mark.slow
def test_sigterm_checkpoints_the_next_step_and_the_next_run_continues_there(dataset, tmp_path):
    logdir = tmp_path / "log"
    started = time.time()
    proc = subprocess.Popen(_train(logdir, dataset), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, signalled, sent = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if signalled is None and re.search(rf"\bstep {SIGNAL_AT}/{LAST} ", line):
                signalled = time.time()
                sent = subprocess.run([sys.executable, "-m", "launch.rank_signals", "--logdir", str(logdir)],
                                      cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
        proc.wait(timeout=SAGEMAKER_GRACE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.time()
    out = "".join(lines)
    assert signalled is not None, out[-3000:]
    assert sent.returncode == 0 and f"SIGTERM sent to {RANKS} training rank(s) of {logdir} on this host" in sent.stdout
    # A backstop against a hang only (SageMaker's SIGKILL comes 120 s after its SIGTERM): the order
    # of events below is what shows the stop waits for nothing but the step under way and the save.
    assert ended - signalled < SAGEMAKER_GRACE_S, f"{ended - signalled:.0f} s from SIGTERM to exit"
    # both ranks exit with the documented status (horovodrun reports the first and ends the job)
    assert f"Exit code: {STOPPED_EXIT_STATUS}" in out, out[-3000:]
    for rank in range(RANKS):
        assert f"[rank {rank}] SIGTERM received: stopping after this step, with a checkpoint" in out

    record = json.loads((logdir / STOP_FILE).read_text())
    stopped = record["step"]
    # Rank 0 learns of the request at the start of a step (its own signal) or at its end (another
    # rank's, summed in that step): either way it trains no step after that one, saves it, and
    # only then reports the stop.
    rank0 = rank_output(out, 0)
    after_signal = rank0.split("[rank 0] SIGTERM received", 1)[-1]
    assert set(_steps(after_signal)) <= {stopped}, after_signal[-3000:]
    problem = out_of_order(rank0, [r"\[rank 0\] SIGTERM received: stopping after this step",
                                   rf"Model saved to .*/model-{stopped}\.",
                                   rf"stopped by SIGTERM after step {stopped} of {LAST}, checkpoint "])
    assert problem is None, problem
    assert STEPS_PER_EPOCH < SIGNAL_AT < stopped < LAST, record     # in epoch 2, after its first checkpoint
    assert record == {"signal": "SIGTERM", "step": stopped, "epoch": 2, "checkpoint": f"model-{stopped}",
                      "time": record["time"]}
    # the signal, then the checkpoint, then stopped.json (which names it), then the exit
    saved_at = (logdir / f"model-{stopped}.index").stat().st_mtime
    assert signalled <= saved_at <= record["time"] <= ended, (signalled, saved_at, record["time"], ended)
    assert latest_checkpoint(str(logdir)) == str(logdir / f"model-{stopped}")
    assert _listed(logdir) == [f"model-{STEPS_PER_EPOCH}", f"model-{stopped}"]   # the epoch's and the stop's
    assert max(_steps(out)) == stopped                     # no step was trained past the checkpoint
    assert f"stopped by SIGTERM after step {stopped} of {LAST}, checkpoint {logdir / f'model-{stopped}'}" in out
    beat = read_heartbeat(str(logdir))                     # written at epoch 1's end at the latest
    assert STEPS_PER_EPOCH <= beat["step"] <= stopped and beat["epoch"] == epoch_of(beat["step"], STEPS_PER_EPOCH)
    assert started <= beat["time"] <= time.time()

    # The next run: from the stop's step to the end of the same schedule, with a checkpoint every
    # 0.6 s of training (0.01 minutes) besides the epoch's.
    again = subprocess.run(_train(logdir, dataset, "TRAIN.CHECKPOINT_MINUTES=0.01"), cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert f"resuming from {logdir / f'model-{stopped}'} at step {stopped}" in out
    steps = _steps(out)
    assert steps[0] == stopped + 1 and steps[-1] == LAST
    # epoch 2 ends where it would have without the stop: at step 40, the schedule's last
    assert f"Epoch 2 (global_step {LAST}) finished" in out
    timed = [int(s) for s in re.findall(r"\bcheckpoint at step (\d+): 0.01 minutes since the last$", out, re.M)]
    assert timed and all(stopped < s <= LAST for s in timed), out[-3000:]
    assert latest_checkpoint(str(logdir)) == str(logdir / f"model-{LAST}")
    # one retention list across both runs: the newest 3 (this run took over the first run's list),
    # and no checkpoint left on disk unlisted
    listed = _listed(logdir)
    assert len(listed) == 3 and listed[-1] == f"model-{LAST}"
    assert sorted(p.name[:-len(".index")] for p in logdir.glob("model-*.index")) == sorted(listed)
    assert read_heartbeat(str(logdir))["step"] == LAST and read_heartbeat(str(logdir))["epoch"] == 2


# SIGTERM during the start-up (here: delivered right after the handler exists, before main() runs):
# the ranks agree at the start-up verdict and exit at once, with nothing to save.
_SIGTERM_FIRST = """
import os, signal, sys
from training import stopping, train
stopping.install_handler()
os.kill(os.getpid(), signal.SIGTERM)
sys.exit(train.main(sys.argv[1:]))
"""


def test_sigterm_during_the_start_up_ends_the_run_before_training(dataset, tmp_path):
    logdir = tmp_path / "log"
    args = train_args(logdir, dataset, 2, "DATA.VAL=()")
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_FIRST, *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == STOPPED_EXIT_STATUS, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stopped by SIGTERM before training started: nothing trained in this run, nothing to save" in proc.stdout
    assert latest_checkpoint(str(logdir)) is None and not re.search(r"\bstep \d+/\d+ ", proc.stdout)


def test_a_rank_signalled_while_a_step_runs_says_so_when_another_ranks_request_stops_it(capsys):
    """The race behind both ranks' "SIGTERM received" lines: rank 1's signal lands after its step
    began (after StopOnRequest's before_run), and rank 0's request, summed in that same step, stops
    rank 1 after it; rank 1 gets no later before_run, so it says it at the stop."""
    import signal
    from types import SimpleNamespace

    from tensorpack.train.base import StopTraining

    from training import stopping
    from training.callbacks import StopOnRequest
    from training.compat import tf, tf1

    with tf.Graph().as_default():
        callback = StopOnRequest(checkpoints=None, logdir="unused: only rank 0 saves", rank=1, steps_per_epoch=20)
        callback.trainer = SimpleNamespace(global_step=23)
        callback._mine = tf1.placeholder_with_default(0, shape=[])
        callback._anyone = tf.identity(callback._mine)
        previous = signal.getsignal(stopping.STOP_SIGNAL)
        stopping._requested_at = None
        try:
            stopping.install_handler()
            args = callback._before_run(None)
            assert args.feed_dict[callback._mine] == 0
            os.kill(os.getpid(), stopping.STOP_SIGNAL)              # while the step runs
            callback._after_run(None, SimpleNamespace(results=1))   # rank 0's request, in the same step
            with pytest.raises(StopTraining):
                callback._trigger_step()
        finally:
            signal.signal(stopping.STOP_SIGNAL, previous)
            stopping._requested_at = None
    assert callback.stopped == 23
    assert "[rank 1] SIGTERM received: stopping after this step, with a checkpoint" in capsys.readouterr().out
