"""Shell scripts the instances run at boot: cluster_node_bootstrap.sh (the EC2 cluster nodes' user
data, after their cluster.env) and notebook_on_start.sh (SageMaker notebook lifecycle) are read
into the templates at synth; cluster_node.sh (the cluster nodes' boot steps) is an S3 asset that
the bootstrap downloads, checks against its SHA-256 and runs."""
from __future__ import annotations

import hashlib
from pathlib import Path

USERDATA_DIR = Path(__file__).resolve().parent
CLUSTER_NODE_SCRIPT = USERDATA_DIR / "cluster_node.sh"
CLUSTER_NODE_BOOTSTRAP = USERDATA_DIR / "cluster_node_bootstrap.sh"
NOTEBOOK_ON_START_SCRIPT = USERDATA_DIR / "notebook_on_start.sh"


def script_body(path: Path) -> str:
    """A script's text without its shebang line: the user data it is appended to has its own."""
    text = path.read_text()
    return text.split("\n", 1)[1] if text.startswith("#!") else text


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, as `sha256sum` prints it on the node."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
