"""Session fixtures for the CDK app's tests. Synth through jsii is slow, so each configuration of
the app is synthesized once per session and shared by every test that reads its templates."""
from __future__ import annotations

import pytest

from cdk_synth import SSH_CONTEXT, VARIANT_CONTEXT, Synthesized, synthesize


@pytest.fixture(scope="session")
def default_synth(tmp_path_factory) -> Synthesized:
    """The app with cdk.json's defaults."""
    return synthesize(tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def variant_synth(tmp_path_factory) -> Synthesized:
    """The app with every option switched on (VARIANT_CONTEXT)."""
    return synthesize(tmp_path_factory.mktemp("cdk-variant"), VARIANT_CONTEXT)


@pytest.fixture(scope="session")
def ssh_synth(tmp_path_factory) -> Synthesized:
    """The app with SSH to the master from a CIDR (SSH_CONTEXT)."""
    return synthesize(tmp_path_factory.mktemp("cdk-ssh"), SSH_CONTEXT)
