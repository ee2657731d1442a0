"""Fixtures shared by the launch tests: a local "COCO site" and the emulated Slurm cluster (the stack
stand-in is in tests/aws_fakes.py, sagemaker_env and emulated_hosts in tests/conftest.py)."""
import functools
import hashlib
import http.server
import tarfile
import threading
import zipfile
from collections import namedtuple

import pytest

from launch.staging import download as dl
from training.data import synthetic

from emulated_cluster import missing_slurm, start_slurm_cluster
from machine import require


@pytest.fixture(scope="module")
def coco_site(tmp_path_factory):
    """A synthetic COCO dataset packed like the COCO site's archives, served on 127.0.0.1."""
    root = tmp_path_factory.mktemp("site")
    data = root / "dataset"
    synthetic.main(["--output", str(data), "--train", "6", "--val", "3", "--size", "64"])
    www = root / "www"
    www.mkdir()
    for split in ("train2017", "val2017"):
        with zipfile.ZipFile(www / f"{split}.zip", "w") as z:
            for f in sorted((data / split).iterdir()):
                z.write(f, f"{split}/{f.name}")
    with tarfile.open(www / "annotations_trainval2017.tar.gz", "w:gz") as t:
        t.add(data / "annotations", "annotations")
    (www / "weights.npz").write_bytes(b"pretend weights " * 1000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def sha(name):
        return "sha256:" + hashlib.sha256((www / name).read_bytes()).hexdigest()

    artifacts = (
        dl.Artifact("train2017.zip", f"{base}/train2017.zip", sha("train2017.zip"), "coco"),
        dl.Artifact("val2017.zip", f"{base}/val2017.zip", sha("val2017.zip"), "coco"),
        dl.Artifact("annotations_trainval2017.tar.gz", f"{base}/annotations_trainval2017.tar.gz",
                    sha("annotations_trainval2017.tar.gz"), "coco"),
        dl.Artifact("ImageNet-R50-AlignPadding.npz", f"{base}/weights.npz", sha("weights.npz"), None,
                    target="coco/weights"),
    )
    yield namedtuple("Site", "base artifacts dataset")(base, artifacts, data)
    server.shutdown()




@pytest.fixture
def slurm_cluster(emulated_hosts, tmp_path):
    """Three emulated nodes running the cluster's Slurm, all idle (emulated_cluster.SlurmCluster)."""
    require(missing_slurm())
    return start_slurm_cluster(emulated_hosts, tmp_path)
