"""training/gpu_metrics.py against a real H200's outputs (tests/recorded_machines/h200-1gpu, unedited),
the progress line's GPU and loss-scale parts against SageMaker's regexes, and the mixed-precision loss
scale and skipped steps of a real tensorpack loop against the loss-scale optimizer's own variable.

Expected values are read off the recordings by hand (and, across files, from the XML the CloudWatch
agent reads), not from the parser."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from training import callbacks, gpu_metrics, metrics

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded_machines" / "h200-1gpu"
FAKE_NVIDIA_SMI = REPO / "tests" / "training" / "fake_gpu" / "nvidia-smi"


def test_the_query_is_the_recorded_one():
    readme = (RECORDED / "README.md").read_text()
    assert f"`nvidia-smi --query-gpu={','.join(gpu_metrics.QUERY_FIELDS)} --format=csv`" in readme
    assert gpu_metrics.query_command() == ["nvidia-smi", f"--query-gpu={','.join(gpu_metrics.QUERY_FIELDS)}",
                                           "--format=csv,noheader,nounits"]


def test_idle_recording_with_header_and_units():
    rows = gpu_metrics.parse_query_gpu((RECORDED / "query-gpu-metrics-idle.csv").read_text())
    # 0, 00000000:00:06.0, NVIDIA H200, 0 %, 0 %, 0 MiB, 143771 MiB, 34, 88.00 W, 345 MHz, 0x0000000000000001
    assert rows == [{"index": 0, "pci.bus_id": "00000000:00:06.0", "name": "NVIDIA H200", "utilization.gpu": 0,
                     "utilization.memory": 0, "memory.used": 0, "memory.total": 143771, "temperature.gpu": 34,
                     "power.draw": 88.0, "clocks.sm": 345, "clocks_throttle_reasons.active": "0x0000000000000001"}]


def test_busy_recording_reads_the_same_in_both_formats():
    first, last = gpu_metrics.parse_query_gpu((RECORDED / "query-gpu-metrics-busy.csv").read_text())
    # --format=csv: 100 %, 25 %, 39287 MiB, ..., 54, 689.58 W; the nounits line a moment later: 55, 691.64
    for row, temperature, power in ((first, 54, 689.58), (last, 55, 691.64)):
        assert (row["utilization.gpu"], row["utilization.memory"], row["memory.used"], row["memory.total"]) == \
               (100, 25, 39287, 143771)
        assert (row["temperature.gpu"], row["power.draw"], row["clocks.sm"]) == (temperature, power, 1500)
        assert row["clocks_throttle_reasons.active"] == "0x0000000000000004"


def test_a_sample_of_the_recorded_gpu_agrees_with_the_xml_the_cloudwatch_agent_reads():
    sample = gpu_metrics.read_sample(0, program=str(FAKE_NVIDIA_SMI))
    gpu = ET.parse(RECORDED / "nvidia-smi-q-x-busy.xml").getroot().find("gpu")
    assert f"{sample.utilization:g} %" == gpu.find("utilization/gpu_util").text == "100 %"
    assert f"{sample.memory_used_mib:g} MiB" == gpu.find("fb_memory_usage/used").text == "39287 MiB"
    # the one process on it (query-compute-apps) holds a little less than the GPU's used memory
    apps = (RECORDED / "query-compute-apps-busy.csv").read_text().splitlines()
    assert apps[1].split(", ")[2] == "39278 MiB" and 39278 <= sample.memory_used_mib


@pytest.mark.parametrize("line, problem", [
    ("0, 00000000:00:06.0, NVIDIA H200, 100, 25", "printed 5 values for the 11 fields"),
])
def test_a_line_of_another_shape_is_an_error(line, problem):
    with pytest.raises(ValueError, match=problem):
        gpu_metrics.parse_query_gpu(line)


def test_no_nvidia_smi_or_no_such_gpu_says_why(tmp_path):
    with pytest.raises(RuntimeError, match="not on PATH"):
        gpu_metrics.read_sample(0, program=str(tmp_path / "nvidia-smi"))
    with pytest.raises(RuntimeError, match=r"lists no GPU with index 1"):
        gpu_metrics.read_sample(1, program=str(FAKE_NVIDIA_SMI))
    failing = tmp_path / "failing-nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the "
                       "NVIDIA driver.' >&2\nexit 9\n")
    failing.chmod(0o755)
    sampler = gpu_metrics.UtilizationSampler(0, program=str(failing)).start()
    assert "exited with status 9: NVIDIA-SMI has failed" in sampler.unavailable
    assert gpu_metrics.UtilizationWindow(sampler).take() is None


def test_a_failure_after_a_sample_loses_only_that_sample(tmp_path):
    calls = tmp_path / "calls"
    flaky = tmp_path / "flaky-nvidia-smi"   # the recording first, then a driver that does not answer
    flaky.write_text(f"#!/bin/sh\necho x >> {calls}\n[ $(wc -l < {calls}) -le 1 ] && exec {FAKE_NVIDIA_SMI} \"$@\"\n"
                     f"echo 'Unable to determine the device handle for GPU0000:00:06.0: Unknown Error' >&2\nexit 15\n")
    flaky.chmod(0o755)
    sampler = gpu_metrics.UtilizationSampler(0, program=str(flaky))
    window = gpu_metrics.UtilizationWindow(sampler)
    sampler.start()   # the recorded sample
    assert window.take() == 100.0
    assert window.take() is None and window.take() is None   # nothing since; the samples then fail
    assert (sampler.unavailable, sampler.failures) == (None, 2)


def test_sampler_means_the_recorded_utilisation():
    sampler = gpu_metrics.UtilizationSampler(0, seconds=0.05, program=str(FAKE_NVIDIA_SMI))
    window = gpu_metrics.UtilizationWindow(sampler)
    sampler.start()
    try:
        assert window.take() == 100.0
        assert window.take() == 100.0   # no sample in between: one is taken then and there
    finally:
        sampler.stop()
    assert sampler.unavailable is None


@pytest.mark.parametrize("visible, local_rank, index", [("", 3, 3), ("4,5,6,7", 1, 5),
                                                         ("GPU-8f1e2d3c-aaaa-bbbb-cccc-000000000000", 0, 0)])
def test_the_ranks_gpu_index(visible, local_rank, index):
    assert gpu_metrics.gpu_index(local_rank, {"CUDA_VISIBLE_DEVICES": visible}) == index


def test_progress_line_parts_read_by_sagemakers_regexes():
    line = ("step 1900/2000 epoch 8 | total_cost=0.3308 | lr=0.00200 | 19.03 images/s | elapsed 6m39s | ETA 0m21s"
            + callbacks.gpu_segment(87.46, 13_250_000_000) + callbacks.amp_segment(32768.0, 2))
    definitions = {d["Name"]: d["Regex"] for d in metrics.PROGRESS_METRIC_DEFINITIONS}
    captured = {name: re.fullmatch(regex, line).group(1) for name, regex in definitions.items()}
    assert captured == {metrics.IMAGES_PER_SECOND: "19.03", metrics.LEARNING_RATE: "0.00200",
                        metrics.GPU_UTILIZATION_MEAN: "87.5", metrics.GPU_PEAK_MEMORY_GIB: "12.34",
                        metrics.AMP_LOSS_SCALE: "32768", metrics.AMP_SKIPPED_STEPS: "2"}
    # a line without a GPU or mixed precision gives those metrics no value
    plain = line.split(" | gpu ")[0]
    for name in (metrics.GPU_UTILIZATION_MEAN, metrics.GPU_PEAK_MEMORY_GIB, metrics.AMP_LOSS_SCALE,
                 metrics.AMP_SKIPPED_STEPS):
        assert re.fullmatch(definitions[name], plain) is None
    assert callbacks.gpu_segment(None, None) == ""


# A real tensorpack loop (SimpleTrainer, graph mode) through training.gradients.build_optimizer with
# mixed precision, the trainer's ProgressLogger and CloudWatch monitor. The loss is w * x with x from
# the data: an infinite x makes that step's gradient infinite, which the loss scale skips.
_AMP_RUN = textwrap.dedent("""
    import json, os, sys
    import training.compat
    from training.compat import tf, tf1, use_graph_mode
    use_graph_mode()
    from tensorpack import DataFromList, ModelDesc, QueueInput, SimpleTrainer, TrainConfig, launch_train_with_config
    from tensorpack.callbacks import Callback
    from training import callbacks, cloudwatch_metrics, gpu_metrics, gradients, metrics

    logdir = sys.argv[1]
    class Toy(ModelDesc):
        def inputs(self):
            return [tf.TensorSpec((), tf.float32, "x")]
        def build_graph(self, x):
            w = tf1.get_variable("w", [], initializer=tf1.constant_initializer(2.0))
            total = tf.identity(w * x, name="total_cost")
            self.stats = {metrics.TOTAL_COST: total}
            return total
        def optimizer(self):
            lr = tf.identity(tf.constant(0.01), name=metrics.LEARNING_RATE)
            return gradients.build_optimizer(tf1.train.GradientDescentOptimizer(lr), mixed_precision=True)

    class ReadScale(Callback):
        def _after_train(self):
            # the loss-scale optimizer's own variable, after the last step
            by_name = {v.op.name: v for v in tf1.global_variables()}
            scale = self.trainer.sess.run(by_name["current_loss_scale"])
            print("VARIABLES " + json.dumps({"scale": float(scale), "w": float(self.trainer.sess.run(by_name["w"]))}),
                  flush=True)

    values = [[v] for v in (1.0, float("inf"), 1.0, 1.0)]
    model = Toy()
    # a rank other than 0, with the stand-in nvidia-smi and no GPU for TensorFlow
    other_rank = gpu_metrics.GpuMetrics(local_rank=0, memory_unavailable="TensorFlow sees no GPU",
                                        program=sys.argv[2])
    config = TrainConfig(model=model, data=QueueInput(DataFromList(values, shuffle=False)),
                         callbacks=[callbacks.ProgressLogger(lambda: model.stats, period=2, global_batch=1,
                                                             max_steps=4, steps_per_epoch=4), ReadScale(),
                                    callbacks.RankGpuLogger(other_rank, period=2, max_steps=4, rank=1)],
                         monitors=cloudwatch_metrics.monitors(lambda: model.stats, logdir=logdir, rank=0, ranks=1,
                                                              global_batch=1, max_steps=4, environ=os.environ),
                         steps_per_epoch=4, max_epoch=1)
    launch_train_with_config(config, SimpleTrainer())
""")


def test_loss_scale_and_skipped_steps_are_the_optimizers_and_other_ranks_log_their_gpu(tmp_path):
    from cloudwatch_emf import parse_emf_line
    from training.cloudwatch_metrics import DEPLOYMENT_ENV, EMF_FILE
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO),
           DEPLOYMENT_ENV: "team-a-EfsClusterStack"}
    proc = subprocess.run([sys.executable, "-c", _AMP_RUN, str(tmp_path), str(FAKE_NVIDIA_SMI)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("VARIABLES "))[10:])
    # TensorFlow's dynamic loss scale starts at 2**15 and halves on a step whose gradients are not finite
    assert final["scale"] == 2.0 ** 14
    # the skipped step left w alone: 3 steps of d(w x)/dw = 1 at learning rate 0.01
    assert final["w"] == pytest.approx(2.0 - 3 * 0.01)
    progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[-1] for line in progress] == ["loss scale 16384 skipped 1"] * 2
    assert not any(" | gpu " in line for line in progress)   # no GPU object given: no GPU part
    records = [parse_emf_line(line) for line in (tmp_path / EMF_FILE).read_text().splitlines()]
    last_progress = [r for r in records if metrics.STEP in r and metrics.PROGRESS in r][-1]
    assert (last_progress[metrics.AMP_LOSS_SCALE], last_progress[metrics.AMP_SKIPPED_STEPS]) == (final["scale"], 1)
    # rank 1's own GPU lines: the recorded utilisation, and nothing SageMaker's regexes would take for rank 0's
    rank_lines = [line for line in proc.stdout.splitlines() if line.startswith("rank 1 GPU")]
    assert rank_lines == [f"rank 1 GPU at step {s}: utilisation 100.0%, peak memory n/a" for s in (2, 4)]
    assert not any(re.match(d["Regex"], line) for d in metrics.METRIC_DEFINITIONS for line in rank_lines)


@pytest.mark.slow
@pytest.mark.parametrize("nvidia_smi", ["absent", "recorded H200"])
def test_the_trainer_reports_the_gpu_or_says_once_it_cannot(nvidia_smi, tiny_dataset, tmp_path, monkeypatch):
    """The trainer on this CPU: no GPU for TensorFlow; nvidia-smi either absent or the stand-in replaying
    the H200's busy GPU (100 % utilisation)."""
    import shutil

    from cloudwatch_emf import parse_emf_line
    from test_train_run import run_module, train_args
    from training import cloudwatch_metrics as cwm
    path = os.environ["PATH"] if nvidia_smi == "absent" else f"{FAKE_NVIDIA_SMI.parent}{os.pathsep}{os.environ['PATH']}"
    assert (shutil.which("nvidia-smi", path=path) is None) == (nvidia_smi == "absent")
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv(cwm.DEPLOYMENT_ENV, "team-a-EfsClusterStack")
    logdir = tmp_path / "run"
    proc = run_module("training.train", *train_args(logdir, tiny_dataset, 2, "DATA.VAL=[]"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if "GPU metrics unavailable" in line]
    progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    records = [parse_emf_line(line) for line in (logdir / cwm.EMF_FILE).read_text().splitlines()]
    steps = [r for r in records if metrics.PROGRESS in r]
    assert len(progress) == 4 and steps and records[-1][metrics.RUN_FINISHED] == 1
    assert len(said) == 1 and "peak memory: TensorFlow sees no GPU" in said[0]
    if nvidia_smi == "absent":
        assert "utilisation: nvidia-smi is not on PATH" in said[0]
        assert not any(" | gpu " in line for line in progress)
        assert not any(metrics.GPU_UTILIZATION_MEAN in r for r in records)
    else:
        assert "utilisation" not in said[0]
        # utilization.gpu of the recorded line, 100; no peak memory without a GPU for TensorFlow
        assert all(line.endswith(" | gpu 100.0% n/a GiB peak") for line in progress)
        assert all(r[metrics.GPU_UTILIZATION_MEAN] == 100 for r in steps)
    assert not any(metrics.GPU_PEAK_MEMORY_GIB in r or metrics.AMP_LOSS_SCALE in r for r in records)
