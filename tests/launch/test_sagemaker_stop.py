"""A SageMaker job stopped mid-run (StopTrainingJob, MaxRuntimeInSeconds, a spot interruption: SIGTERM
to the container's entry, SIGKILL 120 s later), run as in test_sagemaker_entry.py: the entry on a
fabricated /opt/ml tree, two ranks under horovodrun on this CPU host (which starts them with mpirun:
this Horovod is built with MPI, as the image's is).

The entry passes the signal to both ranks, they stop after the same step, rank 0 saves it; the
entry exports that checkpoint, writes the reason to /opt/ml/output/failure and exits 75, with no
rank left for the entry to kill at its deadline. The job started again continues from that step to
the end of the schedule.
"""
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace as dataclasses_replace

import pytest

from event_order import out_of_order, rank_output
from test_sagemaker_entry import REPO, fabricate, run_entry, tiny_hyperparameters
from training.data import synthetic
from training.stopping import STOPPED_EXIT_STATUS

RANKS = 2
STEPS_PER_EPOCH = 40          # a step takes a fraction of a second: the stop lands inside epoch 2
LAST = 2 * STEPS_PER_EPOCH
SIGNAL_AT = 45
SAGEMAKER_GRACE_S = 120


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("coco")
    synthetic.main(["--output", str(out), "--train", "4", "--val", "2", "--size", "96"])
    return out


@pytest.mark.slow
def test_a_stopped_job_saves_exports_and_reports_and_the_restarted_job_continues(tmp_path, dataset):
    hyperparameters = {**tiny_hyperparameters(), "sagemaker_mpi_num_of_processes_per_host": str(RANKS),
                       "config:TRAIN.IMAGES_PER_EPOCH": str(RANKS * 2 * STEPS_PER_EPOCH),
                       "config:TRAIN.LR_EPOCH_SCHEDULE": "[(1, 0.5), (2, None)]", "config:DATA.VAL": "()",
                       "config:PREPROC.TRAIN_SHORT_EDGE_SIZE": "[96, 96]", "config:PREPROC.TEST_SHORT_EDGE_SIZE": "96",
                       "config:PREPROC.MAX_SIZE": "96"}
    base = fabricate(tmp_path / "ml", hyperparameters=hyperparameters, channels={"train": dataset, "log": None})
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(base), "TRAINING_JOB_NAME": "entry-test-job",
           "PYTHONPATH": str(REPO), "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    entry = subprocess.Popen([sys.executable, "-m", "launch.sagemaker.entry", "train"], cwd=base, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, signalled = [], None
    try:
        for line in entry.stdout:
            lines.append(line)
            if signalled is None and re.search(rf"\bstep {SIGNAL_AT}/{LAST} ", line):
                entry.send_signal(signal.SIGTERM)      # as SageMaker signals the container's PID 1
                signalled = time.monotonic()
        entry.wait(timeout=SAGEMAKER_GRACE_S)
    finally:
        if entry.poll() is None:
            entry.kill()
    out = "".join(lines)
    assert signalled is not None, out[-3000:]
    took = time.monotonic() - signalled
    assert entry.returncode == STOPPED_EXIT_STATUS, out[-3000:]
    # A backstop against a hang only: the events below show what the stop waited for.
    assert took < SAGEMAKER_GRACE_S, f"{took:.1f} s from SIGTERM to the entry's exit"
    # The ranks ended by themselves: none was still running at the entry's deadline to kill them.
    assert not re.search(r"\[entry\] training rank\(s\) .* still running .* after SIGTERM: killed", out), out[-3000:]

    logdir = base / "input" / "data" / "log" / "entry-test-job"
    failure = (base / "output" / "failure").read_text()
    m = re.fullmatch(r"stopped by SIGTERM after a checkpoint at step (\d+) \(epoch 2; model-\1 in (\S+)\): start "
                     r"the job again with the same run name to continue from it; model-\1 is exported to the model "
                     r"directory", failure)
    assert m, failure
    stopped = int(m.group(1))
    assert m.group(2) == str(logdir) and SIGNAL_AT < stopped < LAST
    assert not (base / "output" / "success").exists()
    model = sorted(p.name for p in (base / "model").iterdir())
    assert f"model-{stopped}.index" in model and "config.json" in model and "checkpoint" in model
    # the entry signalled both ranks itself, not their launchers (mpirun kills its ranks a second after
    # its own SIGTERM, horovodrun 5 s after)
    forwarded = re.search(r"\[entry\] SIGTERM: asked training rank\(s\) \[(\d+), (\d+)\] on this host", out)
    assert forwarded, out[-3000:]
    for rank in range(RANKS):
        assert f"[rank {rank}] SIGTERM received: stopping after this step, with a checkpoint" in out
    assert f"stopped by SIGTERM after step {stopped} of {LAST}" in out
    steps = [int(s) for s in re.findall(rf"\bstep (\d+)/{LAST} ", out)]
    assert max(steps) == stopped
    # Rank 0: the request, no step after the one under way, its checkpoint, the stop line. Then the
    # entry, once training has exited: the export, the failure file's reason.
    rank0 = rank_output(out, 0)
    after_signal = rank0.split("[rank 0] SIGTERM received", 1)[-1]
    assert {int(s) for s in re.findall(rf"\bstep (\d+)/{LAST} ", after_signal)} <= {stopped}, after_signal[-3000:]
    problem = out_of_order(rank0, [r"\[rank 0\] SIGTERM received: stopping after this step",
                                   rf"Model saved to .*/model-{stopped}\.",
                                   rf"stopped by SIGTERM after step {stopped} of {LAST}, checkpoint "])
    assert problem is None, problem
    problem = out_of_order(out, [rf"<stdout>:stopped by SIGTERM after step {stopped} of {LAST}",
                                 rf"^\[entry\] model in {re.escape(str(base / 'model'))}: .*model-{stopped}\.index",
                                 rf"^\[entry\] STOPPED: stopped by SIGTERM after a checkpoint at step {stopped} "])
    assert problem is None, problem

    # SageMaker starts the job again (a spot restart, or the user with the same run name)
    (base / "output" / "failure").unlink()
    again = run_entry(base)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming from {logdir / f'model-{stopped}'} at step {stopped}" in again.stdout
    steps = [int(s) for s in re.findall(rf"\bstep (\d+)/{LAST} ", again.stdout)]
    assert steps[0] == stopped + 1 and steps[-1] == LAST
    assert (base / "output" / "success").exists() and not (base / "output" / "failure").exists()
    assert f"model-{LAST}.index" in {p.name for p in (base / "model").iterdir()}


def _job(logdir):
    from launch.sagemaker import entry
    return entry.Job(train_dir="/d", logdir=str(logdir), overrides=[], model_dir="/m", hosts=["algo-1"],
                     current_host="algo-1", processes_per_host=1, network_interface="eth0",
                     instance_type="ml.c5.xlarge")


def _checkpoint(logdir, step):
    """A real TensorFlow checkpoint at ``step`` in ``logdir`` (as tensorpack's ModelSaver writes it)."""
    from training.compat import tf, tf1
    graph = tf.Graph()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        gs = tf1.train.get_or_create_global_step()
        sess.run(tf1.global_variables_initializer())
        sess.run(gs.assign(step))
        tf1.train.Saver().save(sess, str(logdir / "model"), global_step=step)


def test_the_reason_of_a_stop_names_the_checkpoint_to_continue_from(tmp_path):
    from launch.sagemaker.entry import stop_reason
    from training.run_status import write_stop_record

    job, started = _job(tmp_path), time.time() - 60
    again = "start the job again with the same run name to continue from it"
    # not stopped, or stopped after training had finished anyway: no stop
    assert stop_reason(job, signalled=False, ended_early=True, since=started) is None
    assert stop_reason(job, signalled=True, ended_early=False, since=started) is None
    # stopped before anything was saved (during the start-up)
    assert stop_reason(job, signalled=True, ended_early=True, since=started) == (
        "stopped by SIGTERM before training saved a checkpoint at a step boundary (it had not started, or did "
        f"not get there in time); the latest checkpoint: none yet: {again}")
    # another host got the signal: this attempt's record counts on every host, an older one does not
    write_stop_record(str(tmp_path), signal="SIGTERM", step=46, epoch=2, checkpoint="model-46")
    assert stop_reason(job, signalled=False, ended_early=True, since=started) == (
        f"stopped by SIGTERM after a checkpoint at step 46 (epoch 2; model-46 in {tmp_path}): {again}")
    assert stop_reason(job, signalled=False, ended_early=True, since=time.time() + 60) is None
    # the stop's save failed: the latest checkpoint is named instead
    _checkpoint(tmp_path, 40)
    write_stop_record(str(tmp_path), signal="SIGTERM", step=46, epoch=2, checkpoint=None)
    assert stop_reason(job, signalled=True, ended_early=True, since=started) == (
        "stopped by SIGTERM at step 46, but that step's checkpoint could not be written (see the log); the latest "
        f"checkpoint: model-40 (step 40): {again}")


def test_a_worker_gives_up_on_the_leader_before_sagemakers_sigkill(tmp_path):
    from launch.rank_signals import StopForwarder
    from launch.sagemaker import entry

    job = dataclasses_replace(_job(tmp_path / "input" / "data" / "log" / "run"), hosts=["algo-1", "algo-2"],
                              current_host="algo-2")
    stop = StopForwarder(kill_after=100)       # not installed: only its record of the request is read
    stop.requested_at = time.time() - (entry.STOP_GRACE_SECONDS - entry.FINISH_SECONDS / 2) - 1
    with pytest.raises(entry.JobError, match=r"^stopped by SIGTERM; the leader algo-1 did not report the job's "
                                             r"outcome in time$"):
        entry._wait_for_leader(job, tmp_path / "outcome.json", since=0.0, stop=stop)
