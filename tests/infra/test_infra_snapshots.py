"""Snapshots of the three templates (syrupy). Asset hashes (64 hex characters: the training
image's tag, which changes with docker/, training/ and launch/) are normalised, so a snapshot
changes only when the infrastructure does. Update with `pytest tests/infra --snapshot-update`."""
from __future__ import annotations

import json
import re

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from infra import outputs

ASSET_HASH = re.compile(r"\b[0-9a-f]{64}\b")


def normalised(template: dict) -> dict:
    return json.loads(ASSET_HASH.sub("<asset-hash>", json.dumps(template)))


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", [outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK,
                                   outputs.SAGEMAKER_STACK])
def test_template_snapshot(default_synth, snapshot_json, stack):
    assert normalised(default_synth.templates[stack]) == snapshot_json


def test_asset_hashes_are_normalised(default_synth):
    text = json.dumps(normalised(default_synth.templates[outputs.EFS_CLUSTER_STACK]))
    assert "<asset-hash>" in text and not ASSET_HASH.search(text)
