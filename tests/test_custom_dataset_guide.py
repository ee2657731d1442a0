"""docs/custom-dataset.md, "On this machine", run as written: its bash blocks in order in one shell,
in an empty directory, with the installed `maskrcnn` command first on PATH. The generated dataset is
checked, a model is trained on it briefly, its detections drawn, the model evaluated, exported,
served on 127.0.0.1:8080 and asked for one image's detections with curl, and the server stopped.
The checks here are what the guide says the user will see; each command's own behaviour is tested
with its module."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
from pycocotools import mask as mask_utils

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "custom-dataset.md"


def guide_commands() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## On this machine"):text.index("## On AWS")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) >= 5, "the guide's local journey is its bash blocks"
    return "\n".join(blocks)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_the_guide_runs_from_a_dataset_on_disk_to_a_served_model(tmp_path):
    assert not _port_open(8080), "port 8080 is taken: the guide's server needs it"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    script = "set -euo pipefail\n" + guide_commands()
    shell = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = shell.communicate(timeout=900)
    finally:
        if shell.poll() is None or _port_open(8080):
            os.killpg(shell.pid, signal.SIGKILL)
    assert shell.returncode == 0, out[-5000:]

    # check-data: both splits usable, the samples drawn
    assert out.count("0 error(s), 0 warning(s): usable") == 2, out[-5000:]
    samples = sorted((tmp_path / "data/parts/samples").glob("*.png"))
    assert len(samples) == 4
    # the finetune preset sized the schedule to the 64 images (8 passes of 32 steps of 2) and the
    # run said so at the start, then how long the rest takes
    assert "plan: 512 images = 8.0 passes over 64 training images; 256 steps of 2 = 8 epochs of 32 steps" in out, out[-5000:]
    assert re.search(r"^plan: [\d,]+ images left take about [\d.]+ hours at [\d.]+ images/s", out, re.M), out[-5000:]
    # training evaluated the val split after each pass, with the AP of each of the dataset's classes
    history = json.loads((tmp_path / "runs/parts/eval_results.json").read_text())
    assert [e["global_step"] for e in history] == [32 * n for n in range(1, 9)]
    final = history[-1]
    assert set(final["per_class_AP"]["segm"]) == {"hexagon", "star", "cross"}
    # predict drew the first 4 val images, at their size
    drawn = sorted(p.name for p in (tmp_path / "runs/parts/drawn").iterdir())
    assert drawn == [f"{i:012d}.png" for i in range(1, 5)]
    assert cv2.imread(str(tmp_path / "runs/parts/drawn" / drawn[0])).shape == (128, 128, 3)
    # evaluate printed the table with the classes
    assert re.search(r"^\|? *star\b", out, re.M), out[-5000:]
    # the server answered the guide's request with the dataset's category ids, then stopped
    answer = json.loads((tmp_path / "runs/parts/detections.json").read_text())
    assert {"boxes", "classes", "class_names", "scores", "masks"} <= set(answer)
    assert set(answer["classes"]) <= {4, 5, 6}
    assert set(answer["class_names"]) <= {"hexagon", "star", "cross"}
    for rle in answer["masks"]:
        assert mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).shape == (128, 128)
    assert not _port_open(8080), "kill %1 stopped the server"
