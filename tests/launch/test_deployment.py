"""Which stacks a command given no --stack talks to (launch/deployment.py): CloudFormation names
`<id>` or `<name_prefix>-<id>` (infra/config.py's stack naming, as `cdk deploy` creates them), the
prefix taken from the machine the command runs on (a cluster node's cluster.env, the notebook's
stack file) or else from the settings file."""
import json

import pytest

from infra import outputs, settings
from launch import deployment
from launch.aws import LaunchError


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No cluster.env, no notebook stack file, an empty settings file: a workstation's checkout."""
    monkeypatch.setattr(settings, "DEFAULT_PATH", tmp_path / "settings.json")
    return {"cluster_env": str(tmp_path / "cluster.env"), "notebook_file": str(tmp_path / "stack")}


def test_without_a_prefix_anywhere_the_stacks_are_their_ids(nowhere):
    assert deployment.stack_name(outputs.SAGEMAKER_STACK, **nowhere) == "SageMakerStack"
    assert deployment.stack_name(outputs.SAGEMAKER_STACK, stack="mine", **nowhere) == "mine"


def test_a_workstation_takes_the_settings_files_prefix(nowhere, tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"name_prefix": "team-a"}))
    assert deployment.stack_name(outputs.EFS_CLUSTER_STACK, **nowhere) == "team-a-EfsClusterStack"
    assert deployment.stack_name(outputs.EFS_CLUSTER_STACK, prefix="", **nowhere) == "EfsClusterStack"
    assert deployment.stack_name(outputs.EFS_CLUSTER_STACK, prefix="b", **nowhere) == "b-EfsClusterStack"
    (tmp_path / "settings.json").write_text(json.dumps({"name_prefix": "-bad"}))
    with pytest.raises(LaunchError, match=r"name_prefix.*\(or pass --stack\)"):
        deployment.stack_name(outputs.EFS_CLUSTER_STACK, **nowhere)


def test_a_node_or_the_notebook_takes_its_own_stacks_prefix_over_the_settings_file(nowhere, tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"name_prefix": "elsewhere"}))
    (tmp_path / "stack").write_text("team-a-SageMakerStack\n")           # the notebook's on-start writes it
    assert deployment.stack_name(outputs.NETWORK_STORAGE_STACK, **nowhere) == "team-a-NetworkStorageStack"
    (tmp_path / "cluster.env").write_text("ROLE=master\nSTACK_NAME=prod-2-EfsClusterStack\n")
    assert deployment.stack_name(outputs.SAGEMAKER_STACK, **nowhere) == "prod-2-SageMakerStack"
    (tmp_path / "cluster.env").write_text("STACK_NAME=EfsClusterStack\n")
    assert deployment.stack_name(outputs.SAGEMAKER_STACK, **nowhere) == "SageMakerStack"


def test_a_stack_name_that_is_not_the_apps_is_named(nowhere, tmp_path):
    (tmp_path / "stack").write_text("my-notebooks\n")
    with pytest.raises(LaunchError, match=r"'my-notebooks' is not the name of one of this app's stacks.*--stack"):
        deployment.stack_name(outputs.SAGEMAKER_STACK, **nowhere)
