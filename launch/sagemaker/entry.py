"""The training image's SageMaker entry (``docker run IMAGE train``), following the training-container
contract: hyperparameters and hosts from /opt/ml/input/config, data from the ``train`` channel,
checkpoints and events in ``<log channel>/<run name>`` (or /opt/ml/checkpoints without a log
channel), the final model in /opt/ml/model, and on failure the reason in /opt/ml/output/failure and
a non-zero exit status, so SageMaker reports the job as failed. (A seed sample exited 0 after
failed training.)

Stopping: SageMaker sends SIGTERM to every container (StopTrainingJob, MaxRuntimeInSeconds, a spot
interruption) and SIGKILL 120 s later. This process is PID 1 and passes the signal on to the
training ranks of its host (launch/rank_signals.py); they stop after the same step and rank 0 saves
a checkpoint of it. The leader then exports that checkpoint to /opt/ml/model, writes "stopped by
SIGTERM after a checkpoint at step N ..." to /opt/ml/output/failure (the other hosts write the
leader's reason) and exits with status 75. Ranks still running 100 s after the signal are killed,
so that the export and the failure file are written before SageMaker's SIGKILL. The same job
started again (same run name) continues from the checkpoint.

Processes: one per GPU (one per host on CPU; ``sagemaker_mpi_num_of_processes_per_host`` overrides).
One host runs ``python -m training.train`` directly, or under ``horovodrun`` for several processes.
Several hosts: the leader (first of the sorted host names) starts mpirun over all hosts, the others
serve SSH, then exit with the job's outcome, which the leader writes on the shared log channel (so a
failed job fails on every host, with the leader's reason).

Why sagemaker-training (the maintained toolkit) and what is our own:
- ``environment.Environment`` parses hyperparameters.json, resourceconfig.json, inputdataconfig.json,
  channel directories, GPU count and the network interface; ``files`` writes failure/success files.
- ``mpi.MasterRunner``/``WorkerRunner`` do the multi-host wiring that failed in the SageMaker EFS example's container ("cannot
  connect to algo-1"): sshd, waiting for every host, mpirun over SageMaker's network interface with
  the hostname shim (not its ending: see ``_run_leader``). It runs an entry script from the
  code directory under ``python -m mpi4py`` (so an uncaught exception aborts every rank instead of
  hanging them); we write that three-line script, as the toolkit expects user code there.
- Our own: the SSH key that lets the hosts reach each other. The toolkit expects a key baked into the
  image; instead the leader creates one per job in the shared log channel (EFS), so no private key
  ships in the image.

Paths are the toolkit's: /opt/ml, or $SAGEMAKER_BASE_DIR (how the tests fabricate a tree).
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from launch.cluster.launch_command import horovod_env, mca_env
from launch.rank_signals import RANK_SCRIPT, StopForwarder
from training.stopping import STOPPED_EXIT_STATUS

RUN_NAME_ENV = "MASKRCNN_RUN_NAME"      # set by the launcher's --run-name
# Under mpirun, a Horovod built without MPI would run every rank as a job of its own, silently.
RANK_SCRIPT_TEXT = """import os, runpy, sys
import training.compat  # TensorFlow's settings, before anything imports it
import horovod.tensorflow as hvd
if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1 and not hvd.mpi_built():
    sys.exit("error: this Horovod is built without MPI, so mpirun's ranks cannot form one job")
runpy.run_module("training.train", run_name="__main__", alter_sys=True)
"""
# For the leader's mpirun: TCP keepalive on its connections to the other hosts' Open MPI daemons
# (10 s idle, then 3 probes 5 s apart), so a host that vanishes without a TCP reset (a dead instance)
# ends the job in about 25 s; Open MPI's default takes 8 minutes (300 s + 9 x 20 s).
MPIRUN_ENV = {"OMPI_MCA_oob_tcp_keepalive_time": "10", "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
              "OMPI_MCA_oob_tcp_keepalive_probes": "3"}
PROCESSES_PER_HOST_PARAM = "sagemaker_mpi_num_of_processes_per_host"
SSH_DIR = Path("/root/.ssh")
SSH_PORT = 22                           # the toolkit's sshd
KEY_WAIT_SECONDS = 15 * 60
JOBS_DIR = ".jobs"                      # <log channel>/.jobs/<job name>/: SSH key, then the leader's outcome
OUTCOME_FILE = "outcome.json"
LEADER_LOST_SECONDS = 5 * 60            # a worker gives up on a leader unreachable this long
POLL_SECONDS = 2
STOP_GRACE_SECONDS = 120                # SageMaker's SIGKILL follows its SIGTERM after this long
FINISH_SECONDS = 20                     # kept of those for the export and the failure file


class JobError(RuntimeError):
    """The job cannot run as configured; the message is the failure reason SageMaker shows."""


@dataclass
class Job:
    train_dir: str
    logdir: str
    model_dir: str
    overrides: list[str]
    hosts: list[str]
    current_host: str
    processes_per_host: int
    network_interface: str
    instance_type: str

    @property
    def leader(self) -> str:
        return sorted(self.hosts)[0]

    @property
    def is_leader(self) -> bool:
        return self.current_host == self.leader


def plan(env) -> Job:
    """Check the job's inputs and decide paths and process counts, before anything starts."""
    from training.config import ConfigError
    from training.hparams import FILE_HYPERPARAMETERS, resolve_data_file, to_overrides

    channels = env.channel_input_dirs
    if "train" not in channels:
        raise JobError(f"no 'train' channel (channels: {sorted(channels) or 'none'}): give the job a train "
                       f"channel with the COCO directory, e.g. the EFS path /data/coco")
    train_dir = channels["train"]
    if not os.path.isdir(train_dir):
        raise JobError(f"train channel directory {train_dir} does not exist")
    hps = dict(env.hyperparameters)
    for name in FILE_HYPERPARAMETERS:
        if name in hps and isinstance(hps[name], str):
            hps[name] = resolve_data_file(hps[name], train_dir)
    try:
        overrides = [f"DATA.BASEDIR={train_dir!r}", *to_overrides(hps)]
    except ConfigError as err:
        raise JobError(f"bad hyperparameters: {err}") from None
    check_split_files(overrides)

    run_name = os.environ.get(RUN_NAME_ENV) or os.environ.get("TRAINING_JOB_NAME") or "maskrcnn"
    if "log" in channels:
        logdir = os.path.join(channels["log"], run_name)
    else:
        # SageMaker syncs this directory with the job's S3 checkpoint location (spot restarts).
        from sagemaker_training import environment
        logdir = os.path.join(os.path.dirname(environment.model_dir), "checkpoints")
    per_host = env.additional_framework_parameters.get(PROCESSES_PER_HOST_PARAM)
    processes = int(per_host) if per_host else (int(env.num_gpus) or 1)
    return Job(train_dir=train_dir, logdir=logdir, model_dir=env.model_dir, overrides=overrides,
               hosts=list(env.hosts), current_host=env.current_host, processes_per_host=processes,
               network_interface=env.network_interface_name, instance_type=env.current_instance_type)


def check_split_files(overrides: list[str]) -> None:
    """Splits given as '<annotation file>:<image folder>' (relative to the train channel) must name
    an existing file and folder: said now, in the job's failure reason, not after the ranks start.
    Split names are left to the trainer, which lists every path it tried."""
    from training.config import new_config
    from training.data import splits

    cfg = new_config()
    cfg.update_args(overrides)
    for key in ("DATA.TRAIN", "DATA.VAL"):
        for entry in cfg.get(key):
            if splits.parse(entry) is None:
                continue
            try:
                splits.resolve(cfg.DATA.BASEDIR, entry)
            except splits.DatasetError as err:
                raise JobError(f"bad data ({key}): {err}") from None


def train_args(job: Job) -> list[str]:
    return ["--logdir", job.logdir, "--config", *job.overrides]


def _run_streaming(cmd: list[str]) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its output through (CloudWatch, metric regexes); keep the last lines."""
    tail = collections.deque(maxlen=30)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip())
    return proc.returncode, list(tail)


def run_single_host(job: Job) -> None:
    os.environ.update({**horovod_env(efa=False), **mca_env()})  # mca_env: when horovodrun uses mpirun
    train = [sys.executable, "-m", "training.train", *train_args(job)]
    if job.processes_per_host > 1:
        n = job.processes_per_host
        horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
        train = [horovodrun, "-np", str(n), "-H", f"localhost:{n}", *train]
    rc, tail = _run_streaming(train)
    if rc != 0:
        # SageMaker shows the first 1024 characters as FailureReason: the error line first.
        errors = [line for line in tail if "error" in line.lower()]
        headline = errors[-1] if errors else (tail[-1] if tail else "no output")
        raise JobError(f"training exited with status {rc}: {headline}\n\nlast output:\n" + "\n".join(tail))


def _job_dir(job: Job) -> Path:
    """This job's directory on the shared log channel (EFS): the SSH key while it runs, the leader's outcome."""
    return Path(job.logdir).parent / JOBS_DIR / (os.environ.get("TRAINING_JOB_NAME") or "job")


def _install_ssh_key(job: Job, shared: Path) -> None:
    """Install this job's SSH key for root: the leader creates it on the shared log channel, the
    other hosts wait for it. Host keys are generated here too (none ship in the image)."""
    key = shared / "id_rsa"
    if job.is_leader and not key.exists():
        shared.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = shared / "tmp_id_rsa"
        for p in (tmp, Path(str(tmp) + ".pub")):
            p.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", str(tmp)], check=True)
        os.replace(str(tmp) + ".pub", str(key) + ".pub")
        os.replace(tmp, key)   # last: its presence means the pair is complete
    deadline = time.time() + KEY_WAIT_SECONDS
    while not key.exists():
        if time.time() > deadline:
            raise JobError(f"the leader {job.leader} did not publish the job's SSH key in {shared}")
        time.sleep(2)
    SSH_DIR.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(key, SSH_DIR / "id_rsa")
    os.chmod(SSH_DIR / "id_rsa", 0o600)
    shutil.copyfile(str(key) + ".pub", SSH_DIR / "authorized_keys")
    # mpirun holds an SSH session to every other host for the whole job: keepalives end it (and so
    # the job) within ~30 s when a host vanishes without a TCP reset, instead of ranks waiting forever.
    (SSH_DIR / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                                    "  ServerAliveInterval 10\n  ServerAliveCountMax 3\n")
    subprocess.run(["ssh-keygen", "-A"], check=True)
    Path("/run/sshd").mkdir(exist_ok=True)


def rank_env(job: Job) -> dict[str, str]:
    """Exported to every rank by name (mpirun -x NAME): Horovod/NCCL settings and what the training
    code needs to import (remote ranks start from sshd's clean environment). NCCL's interface is
    SageMaker's: the toolkit's mpirun exports it first and these come after it on the command line.
    The Open MPI parameters (mca_env) go as variables too: each rank's MPI reads them at start."""
    return {**horovod_env(efa=False, socket_interface=job.network_interface), **mca_env(),
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TF_USE_LEGACY_KERAS": "1"}


def write_rank_script(code_dir: str) -> Path:
    """The script every rank runs, written on every host: mpirun starts ``python -m mpi4py
    maskrcnn_rank.py`` by relative path in the leader's working directory (the code directory) on each
    host, and nothing copies it there (written on the leader only, other hosts' ranks failed with
    "can't open file")."""
    Path(code_dir).mkdir(parents=True, exist_ok=True)
    script = Path(code_dir) / RANK_SCRIPT
    script.write_text(RANK_SCRIPT_TEXT)
    return script


# A rank's line as the toolkit prints it: "[1,mpirank:3,algo-2]<stderr>:error: no annotation file ...".
_RANK_LINE = re.compile(r"^\[[^\]]*\]<std(?:err|out)>:\s*(.*)$")
_ERROR_TEXT = re.compile(r"^(error\b|[\w.]*(Error|Exception)\b)", re.IGNORECASE)


class _RankOutput(io.TextIOBase):
    """Stands in for stdout while the toolkit prints the ranks' output: passes it on and keeps the
    first error lines of the ranks (the cause; later ones on other ranks are its consequences, such
    as "Horovod has been shut down") and the last lines."""

    def __init__(self, stream):
        self._stream, self._partial = stream, ""
        self.rank_errors: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=30)

    def write(self, text: str) -> int:
        self._stream.write(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.tail.append(line)
            match = _RANK_LINE.match(line)
            if match and _ERROR_TEXT.match(match.group(1)) and len(self.rank_errors) < 10:
                self.rank_errors.append(line)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def _cluster_failure(err: Exception, output: _RankOutput) -> str:
    """A failure reason for SageMaker, which shows its first 1024 characters: the first rank error
    line, then the ranks' other error lines and the last output; not the toolkit's mpirun command."""
    code = getattr(err, "return_code", None)
    status = f" (mpirun exit status {code})" if code is not None else ""
    headline = (output.rank_errors[0] if output.rank_errors
                else f"{type(err).__name__}: {getattr(err, 'output', '') or err}")
    return (f"training failed on the cluster{status}: {headline}\n\nrank errors:\n" + "\n".join(output.rank_errors)
            + "\n\nlast output:\n" + "\n".join(output.tail))


def _run_leader(runner, job: Job, env_vars: dict[str, str]) -> None:
    """``MasterRunner.run(wait=True)`` without its ending: that writes the toolkit's status file on the
    other hosts and then sleeps a fixed 30 s, for workers that wait with the toolkit (ours wait for the
    leader's outcome file instead), so every instance of every job stayed up, billed, 30 s longer.
    The same steps otherwise: sshd and the wait for every host, the mpirun command, the rank errors."""
    from sagemaker_training import environment, logging_config, process
    from sagemaker_training.smdataparallel import get_dataparallel_exception_classes

    runner._setup()
    command = runner._create_command()
    logging_config.log_script_invocation(command, env_vars)
    errors = {*process.get_debugger_exception_classes(), *process.get_tensorflow_exception_classes(),
              *get_dataparallel_exception_classes()}
    process.check_error(command, list(errors), job.processes_per_host, capture_error=True,
                        cwd=environment.code_dir)


def run_multi_host(job: Job, stop: StopForwarder | None = None) -> None:
    from sagemaker_training import environment, mpi

    if "/input/data/log/" not in job.logdir + "/":
        raise JobError("a multi-host job needs the 'log' channel (EFS, read-write): the hosts share the job's "
                       "SSH key, its outcome and the checkpoints there")
    started = time.time()
    shared = _job_dir(job)
    if job.is_leader:
        (shared / OUTCOME_FILE).unlink(missing_ok=True)   # a previous attempt's (a spot restart)
    _install_ssh_key(job, shared)
    env_vars = rank_env(job)
    os.environ.update(env_vars)
    write_rank_script(environment.code_dir)
    if job.is_leader:
        runner = mpi.MasterRunner(RANK_SCRIPT, train_args(job), env_vars, job.processes_per_host, job.leader,
                                  sorted(job.hosts), "", job.network_interface, instance_type=job.instance_type)
        os.environ.update(MPIRUN_ENV)
        output = _RankOutput(sys.stdout)
        try:
            with contextlib.redirect_stdout(output):
                _run_leader(runner, job, env_vars)
        except Exception as err:  # the toolkit raises ExecuteUserScriptError or a subclass named for the error
            raise JobError(_cluster_failure(err, output)) from None
        finally:
            for name in ("id_rsa", "id_rsa.pub"):   # every host has its copy by now
                (shared / name).unlink(missing_ok=True)
    else:
        # The toolkit's worker side: sshd, and /etc/environment for the ranks mpirun starts here. Not
        # its wait (wait=False): that ends alike whether the job succeeded or failed (the host then
        # exits 0), after polling the leader for minutes; the leader's outcome file says which, at once.
        mpi.WorkerRunner(RANK_SCRIPT, train_args(job), env_vars, job.processes_per_host, job.leader,
                         job.current_host).run(wait=False)
        _wait_for_leader(job, shared / OUTCOME_FILE, since=started, stop=stop)


def report_outcome(job: Job, *, ok: bool, reason: str = "") -> None:
    """The leader's last word to the other hosts of a multi-host job; they exit with it."""
    if len(job.hosts) < 2 or not job.is_leader or "/input/data/log/" not in job.logdir + "/":
        return
    target = _job_dir(job) / OUTCOME_FILE
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ok": ok, "reason": reason[:4000], "written_at": time.time()}))
        os.replace(tmp, target)
        print(f"[entry] the job's outcome ({'succeeded' if ok else 'failed'}) is in {target}: the other hosts exit "
              f"with it", flush=True)
    except OSError as err:   # keep the job's own failure; the other hosts then find the leader gone
        print(f"[entry] could not write the outcome for the other hosts to {target}: {err}", file=sys.stderr)


def _wait_for_leader(job: Job, outcome_file: Path, *, since: float, stop: StopForwarder | None = None) -> None:
    """Until the leader writes this attempt's outcome: return on success, raise its reason on failure.
    Also raise when the leader stays unreachable for LEADER_LOST_SECONDS (its host died), or has
    not reported by the time a stop must be finished (SageMaker's SIGKILL is near)."""
    last_seen = time.time()
    while True:
        if stop is not None and stop.requested_at is not None and \
                time.time() > stop.requested_at + STOP_GRACE_SECONDS - FINISH_SECONDS / 2:
            raise JobError(f"stopped by SIGTERM; the leader {job.leader} did not report the job's outcome in time")
        try:
            outcome = json.loads(outcome_file.read_text())
        except (OSError, ValueError):
            outcome = None
        if outcome is not None and outcome.get("written_at", 0) >= since:
            if outcome.get("ok"):
                print(f"[entry] the leader {job.leader} reports the job succeeded", flush=True)
                return
            raise JobError(f"the job failed (reported by the leader {job.leader}): {outcome.get('reason')}")
        try:
            socket.create_connection((job.leader, SSH_PORT), timeout=5).close()
            last_seen = time.time()
        except OSError:
            if time.time() - last_seen > LEADER_LOST_SECONDS:
                raise JobError(f"lost the leader {job.leader}: unreachable for {LEADER_LOST_SECONDS} s and "
                               f"no outcome in {outcome_file}") from None
        time.sleep(POLL_SECONDS)


def _export_after_stop(job: Job) -> str:
    """Export what exists after a stop (SageMaker uploads /opt/ml/model of stopped jobs too)."""
    try:
        exported = export_model(job.logdir, job.model_dir)
    except JobError:
        return "; nothing to export to the model directory (no checkpoint)"
    checkpoint = next((n[:-len(".index")] for n in exported if n.endswith(".index")), "?")
    print(f"[entry] model in {job.model_dir}: {', '.join(exported)}", flush=True)
    return f"; {checkpoint} is exported to the model directory"


def export_model(logdir: str, model_dir: str) -> list[str]:
    """Copy the latest checkpoint (and the run's config) into ``model_dir``, which SageMaker uploads."""
    from training.callbacks import CONFIG_FILE, latest_checkpoint

    ckpt = latest_checkpoint(logdir)
    if ckpt is None:
        raise JobError(f"training ended without a checkpoint in {logdir}")
    os.makedirs(model_dir, exist_ok=True)
    copied = []
    prefix = os.path.basename(ckpt)
    for name in sorted(os.listdir(os.path.dirname(ckpt))):
        if name.startswith(prefix + ".") or name == CONFIG_FILE:
            shutil.copy2(os.path.join(os.path.dirname(ckpt), name), os.path.join(model_dir, name))
            copied.append(name)
    Path(model_dir, "checkpoint").write_text(
        f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
    return copied + ["checkpoint"]


def stop_reason(job: Job, *, signalled: bool, ended_early: bool, since: float) -> str | None:
    """The failure reason of a stopped run: its stop record is from this attempt (``since``; any
    host may have received the signal), or this host received SIGTERM (``signalled``) and training
    did not finish (``ended_early``). None otherwise (a run that finished despite a late SIGTERM
    is a finished run)."""
    from training.run_status import read_stop_record

    record = read_stop_record(job.logdir, since=since)
    again = "start the job again with the same run name to continue from it"
    if record is not None and record.get("checkpoint"):
        return (f"stopped by {record.get('signal', 'SIGTERM')} after a checkpoint at step {record['step']} "
                f"(epoch {record.get('epoch')}; {record['checkpoint']} in {job.logdir}): {again}")
    if record is None and not (signalled and ended_early):
        return None
    from training.callbacks import resume_step   # imports TensorFlow: only when needed
    checkpoint, step = resume_step(job.logdir)
    latest = f"{os.path.basename(checkpoint)} (step {step})" if checkpoint else "none yet"
    if record is not None:
        what = f"at step {record['step']}, but that step's checkpoint could not be written (see the log)"
    else:
        what = "before training saved a checkpoint at a step boundary (it had not started, or did not get there in time)"
    return f"stopped by SIGTERM {what}; the latest checkpoint: {latest}: {again}"


def main(argv: list[str] | None = None) -> int:
    # First, so that no SIGTERM is lost: this process is the container's PID 1, and the kernel drops
    # signals to a PID 1 without a handler (launch/rank_signals.py).
    stop = StopForwarder(kill_after=STOP_GRACE_SECONDS - FINISH_SECONDS).install()
    from sagemaker_training import environment, files, logging_config

    status, job = 1, None
    try:
        env = environment.Environment()
        # As the toolkit's own entry does: its steps (the wait for every host's sshd, the mpirun
        # command, the status it writes) go to the job's log, at the job's
        # sagemaker_container_log_level (INFO unless set).
        logging_config.configure_logger(env.log_level)
        job = plan(env)
        stop.watch(job.logdir)
        print(f"[entry] host {job.current_host} of {sorted(job.hosts)}, {job.processes_per_host} process(es) "
              f"per host; data {job.train_dir}; logdir {job.logdir}", flush=True)
        started, failure = time.time(), None
        skipped = stop.requested_at is not None   # a stop before training started: start nothing
        try:
            if not skipped and len(job.hosts) > 1:
                run_multi_host(job, stop)
            elif not skipped:
                run_single_host(job)
        except JobError as err:
            failure = err
        stopped = stop_reason(job, signalled=stop.requested_at is not None,
                              ended_early=skipped or failure is not None, since=started)
        if stopped is not None:
            status = STOPPED_EXIT_STATUS
            raise JobError(stopped + (_export_after_stop(job) if job.is_leader else ""))
        if failure is not None:
            raise failure
        if job.is_leader:
            exported = export_model(job.logdir, job.model_dir)
            print(f"[entry] model in {job.model_dir}: {', '.join(exported)}", flush=True)
            report_outcome(job, ok=True)
        files.write_success_file()
        return 0
    except JobError as err:
        reason = str(err)
    except Exception:  # anything else is a bug or an environment problem: keep its traceback
        reason = "entry failed:\n" + traceback.format_exc()
    if job is not None:
        report_outcome(job, ok=False, reason=reason)
    os.makedirs(environment.output_dir, exist_ok=True)
    files.write_failure_file(reason[:10000])  # SageMaker shows the start of this file; keep it bounded
    print(f"[entry] {'STOPPED' if status == STOPPED_EXIT_STATUS else 'FAILED'}: {reason}", file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
