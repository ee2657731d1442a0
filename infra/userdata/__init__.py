"""Shell scripts the instances run at boot, shipped as files and read into the templates at synth:
cluster_node.sh (EC2 cluster nodes) and notebook_on_start.sh (SageMaker notebook lifecycle)."""
from __future__ import annotations

from pathlib import Path

USERDATA_DIR = Path(__file__).resolve().parent
CLUSTER_NODE_SCRIPT = USERDATA_DIR / "cluster_node.sh"
NOTEBOOK_ON_START_SCRIPT = USERDATA_DIR / "notebook_on_start.sh"


def script_body(path: Path) -> str:
    """A script's text without its shebang line: the user data it is appended to has its own."""
    text = path.read_text()
    return text.split("\n", 1)[1] if text.startswith("#!") else text
