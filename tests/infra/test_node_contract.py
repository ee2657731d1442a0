"""The node contract (infra/node_contract.py) against every side that shares it: the user data the
synthesized stacks give their nodes (default, every option on, SSH), the boot script's own lines,
the container entry and the commands in the container (launch/). Reads the real files and
templates; the last test shows the readers find a drifted key or path."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra import node_contract as contract
from infra.userdata import CLUSTER_NODE_BOOTSTRAP, CLUSTER_NODE_SCRIPT

from cdk_synth import REPO_ROOT

CLUSTER = "EfsClusterStack"
CONTAINER_SIDE = [*sorted((REPO_ROOT / "launch").rglob("*.py")), REPO_ROOT / "docker" / "entrypoint.sh"]
BOOT_SIDE = [CLUSTER_NODE_SCRIPT, CLUSTER_NODE_BOOTSTRAP]


def cluster_env_written(user_data: str) -> set[str]:
    """Keys of the cluster.env heredoc in a node's user data."""
    block = user_data.split(f"cat > {contract.CLUSTER_ENV} <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    return {line.split("=", 1)[0] for line in block.splitlines()}


def cluster_env_appended(script: str) -> set[str]:
    """Keys a shell script appends to cluster.env (`echo "K=..." >> ...`, `printf 'K=%s\\n...' ... >> ...`)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    keys = set()
    for line in joined.splitlines():
        if line.rstrip().endswith(f">> {contract.CLUSTER_ENV}"):
            keys |= set(re.findall(r"(?:^|['\"\s]|\\n)([A-Z][A-Z0-9_]*)=", line))
    return keys


def cluster_env_read(source: str) -> set[str]:
    """Keys Python code reads from a cluster.env dict (`env.get("K")`, `env["K"]` not assigned)."""
    return {a or b for a, b in re.findall(r'\benv\.get\("([A-Z][A-Z0-9_]*)"|\benv\["([A-Z][A-Z0-9_]*)"\](?!\s*=[^=])',
                                          source)}


def cluster_dir_paths(text: str) -> set[str]:
    return set(re.findall(re.escape(contract.CLUSTER_DIR) + r"/[A-Za-z0-9_.-]*[A-Za-z0-9_]", text))


@pytest.mark.parametrize("synth_name", ["default_synth", "variant_synth", "ssh_synth"])
@pytest.mark.parametrize("prefix", ["ClusterMaster", "ClusterWorker"])
def test_the_stack_writes_every_contract_key_and_no_other(request, synth_name, prefix):
    from test_infra_stacks import user_data
    written = cluster_env_written(user_data(request.getfixturevalue(synth_name), CLUSTER, prefix))
    assert contract.STACK_KEYS <= written
    assert written - contract.STACK_KEYS <= contract.OPTIONAL_STACK_KEYS


def test_the_options_write_their_optional_keys(variant_synth, ssh_synth):
    from test_infra_stacks import user_data
    lustre = cluster_env_written(user_data(variant_synth, CLUSTER, "ClusterWorker"))
    assert {"FSX_MOUNT", "FSX_DNS_NAME", "FSX_MOUNT_NAME"} <= lustre
    assert "EIP_ALLOCATION_ID" in cluster_env_written(user_data(ssh_synth, CLUSTER, "ClusterMaster"))


def test_the_boot_script_appends_the_boot_keys():
    assert set().union(*(cluster_env_appended(p.read_text()) for p in BOOT_SIDE)) == contract.BOOT_KEYS


def test_the_commands_on_a_node_read_only_contract_keys():
    read = {key: path.relative_to(REPO_ROOT) for path in CONTAINER_SIDE if path.suffix == ".py"
            for key in cluster_env_read(path.read_text())}
    # env dicts of other origins that launch/ reads with the same spelling: the process environment
    # handed to mpirun and to the ranks
    outside = {key: path for key, path in read.items() if key not in contract.CLUSTER_ENV_KEYS
               and not key.startswith(("OMPI_", "NCCL_", "FI_", "HOROVOD_", "TF_"))}
    assert not outside, f"cluster.env keys the contract does not name: {outside}"
    assert {"EFS_MOUNT", "WORKER_ASG_NAME", "PRIVATE_IP", "SLOTS"} <= set(read)   # the reader finds them


def test_paths_under_the_cluster_dir_are_the_contract_s():
    for path in CONTAINER_SIDE:
        assert cluster_dir_paths(path.read_text()) <= set(contract.PATHS), path
    boot = set().union(*(cluster_dir_paths(p.read_text()) for p in BOOT_SIDE))
    # the boot script writes each file the container reads
    assert {contract.CLUSTER_ENV, contract.MUNGE_KEY, contract.HOSTFILE} <= boot
    entry = (REPO_ROOT / "docker" / "entrypoint.sh").read_text()
    assert f"CLUSTER_DIR=${{MASKRCNN_CLUSTER_DIR:-{contract.CLUSTER_DIR}}}" in entry
    assert f"-v {contract.CLUSTER_DIR}:{contract.CLUSTER_DIR}:ro" in CLUSTER_NODE_SCRIPT.read_text()
    assert f"--name {contract.CONTAINER} " in CLUSTER_NODE_SCRIPT.read_text()


def test_the_readers_find_drift():
    assert cluster_env_read('x = env.get("NEW_KEY")\nenv["OTHER"] = 1\ny = env["THIRD"]\n') == {"NEW_KEY", "THIRD"}
    assert cluster_env_appended(f'echo "NEW_KEY=$X" >> {contract.CLUSTER_ENV}\n'
                                f"printf 'A=%s\\nB=%s\\n' \\\n  1 2 >> {contract.CLUSTER_ENV}\n") == {"NEW_KEY", "A", "B"}
    assert cluster_dir_paths(f"open('{contract.CLUSTER_DIR}/secret.key')") == {f"{contract.CLUSTER_DIR}/secret.key"}
