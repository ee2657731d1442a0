"""Which deployment a command talks to: the CloudFormation names of its stacks.

A stack is named by its id (``SageMakerStack``) or, with the ``name_prefix`` setting, ``<name_prefix>-<id>``,
so that several deployments share an account. A command given no ``--stack`` takes the prefix of
the deployment it runs in:

- on a cluster node, from the cluster stack's name in cluster.env (the node contract);
- on the SageMaker notebook, from the notebook stack's name, which its on-start script writes to
  :data:`NOTEBOOK_STACK_FILE` at every start;
- elsewhere (a workstation), from the settings file (``maskrcnn settings``), as ``cdk deploy`` does.
"""
from __future__ import annotations

from pathlib import Path

from infra import outputs
from launch.aws import LaunchError
from launch.cluster.node_env import CLUSTER_ENV, read_cluster_env

# In the notebook's Jupyter root (its persistent volume), hidden; infra/userdata/notebook_on_start.sh.
NOTEBOOK_STACK_FILE = "/home/ec2-user/SageMaker/.maskrcnn-stack"
STACK_IDS = (outputs.NETWORK_STORAGE_STACK, outputs.EFS_CLUSTER_STACK, outputs.SAGEMAKER_STACK)


def _notebook_stack(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def home_stack(*, cluster_env: str | None = None, notebook_file: str | None = None) -> str | None:
    """The stack of the machine this runs on (a cluster node's or the notebook's), or None elsewhere."""
    try:
        node = read_cluster_env(cluster_env or CLUSTER_ENV).get("STACK_NAME")
    except LaunchError:      # not a cluster node
        node = None
    return node or _notebook_stack(notebook_file or NOTEBOOK_STACK_FILE)


def prefix_of(stack: str) -> str | None:
    """The name prefix of one of this app's stacks (``team-a-SageMakerStack`` -> ``team-a``), or None."""
    for stack_id in STACK_IDS:
        if stack == stack_id:
            return None
        if stack.endswith(f"-{stack_id}"):
            return stack[:-len(stack_id) - 1]
    raise LaunchError(f"{stack!r} is not the name of one of this app's stacks ({', '.join(STACK_IDS)}, "
                      f"each with an optional '<name_prefix>-' in front): pass --stack")


def name_prefix(**where) -> str | None:
    """The deployment's name prefix: the home stack's (:func:`home_stack`), else the settings file's."""
    home = home_stack(**where)
    if home:
        return prefix_of(home)
    from infra.config import ConfigError
    from infra.settings import load_config
    try:
        return load_config().name_prefix
    except ConfigError as err:
        raise LaunchError(f"{err} (or pass --stack)") from None


def stack_name(stack_id: str, *, stack: str | None = None, prefix: str | None = None, **where) -> str:
    """The CloudFormation name of the deployment's ``stack_id`` stack: ``stack`` when given, else
    ``stack_id`` with the name prefix (``prefix``, or :func:`name_prefix`) in front."""
    if stack:
        return stack
    if prefix is None:
        prefix = name_prefix(**where)
    return f"{prefix}-{stack_id}" if prefix else stack_id


def stack_help(stack_id: str) -> str:
    """``--stack``'s help for a command that reads the ``stack_id`` stack."""
    return (f"the stack's CloudFormation name (default: {stack_id}, with the name_prefix of the deployment "
            f"this runs in, or of the settings file, in front)")
