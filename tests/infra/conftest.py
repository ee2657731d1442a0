"""Session fixtures for the CDK app's tests. Synth through jsii is slow, so each configuration of
the app is synthesized once per session and shared by every test that reads its templates: once
for all xdist workers (tests/shared_artifacts.py), each worker reading the cloud assembly back."""
from __future__ import annotations

import hashlib
import json

import pytest

from cdk_synth import SSH_CONTEXT, VARIANT_CONTEXT, Synthesized, read_synthesized, synthesize


@pytest.fixture(scope="session")
def synth_of(tmp_path_factory):
    """``synth_of(overrides)``: :func:`cdk_synth.synthesize` with ``overrides`` as the -c flags, once per
    session for every test file that asks for the same overrides (``stacks`` is None: the app's
    objects stay in the process that synthesized). Read-only: a test that changes the cloud
    assembly synthesizes its own."""
    from shared_artifacts import session_root, shared_artifact
    read = {}

    def get(overrides: dict | None = None) -> Synthesized:
        key = hashlib.sha256(json.dumps(overrides or {}, sort_keys=True).encode()).hexdigest()[:16]
        if key not in read:
            outdir = shared_artifact(session_root(tmp_path_factory), f"cdk-{key}",
                                     lambda directory: synthesize(directory, overrides))
            read[key] = read_synthesized(outdir, overrides)
        return read[key]
    return get


@pytest.fixture(scope="session")
def default_synth(synth_of) -> Synthesized:
    """The app with cdk.json's defaults."""
    return synth_of({})


@pytest.fixture(scope="session")
def variant_synth(synth_of) -> Synthesized:
    """The app with every option switched on (VARIANT_CONTEXT)."""
    return synth_of(VARIANT_CONTEXT)


@pytest.fixture(scope="session")
def ssh_synth(synth_of) -> Synthesized:
    """The app with SSH to the master from a CIDR (SSH_CONTEXT)."""
    return synth_of(SSH_CONTEXT)
