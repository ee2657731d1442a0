"""notebooks/sagemaker_training.ipynb, executed cell by cell against moto and the local COCO site:
the walk-through stays in step with the functions it calls."""
import json
import os
from pathlib import Path

import boto3

from aws_fakes import STACK_OUTPUTS, deploy_stack
from infra import outputs

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "sagemaker_training.ipynb"


def _code_cells():
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return [("".join(c["source"]), c.get("metadata", {}).get("tags", [])) for c in cells]


def test_notebook_runs_end_to_end_against_moto(sagemaker_env, coco_site, tmp_path, monkeypatch, capsys):
    session = boto3.session.Session()
    deploy_stack(session)
    session.client("s3").create_bucket(Bucket=STACK_OUTPUTS[outputs.BUCKET_NAME])
    monkeypatch.chdir(NOTEBOOK.parent)
    namespace = {}
    for source, tags in _code_cells():
        # IPython magics and shell escapes are for the notebook instance only.
        source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
        exec(compile(source, str(NOTEBOOK), "exec"), namespace)
        if "parameters" in tags:  # what papermill would inject: local paths and the local COCO site
            namespace.update(STAGE_DIR=tmp_path / "stage", EFS_DIR=tmp_path / "efs",
                             ARTIFACTS=coco_site.artifacts, INSTANCE_COUNT=2)
    out = capsys.readouterr().out
    # AWS's EFS example's 22 (every loss and mAP) plus images/s and the learning rate, and the GPU's
    # utilisation and peak memory, the mixed-precision loss scale and skipped steps.
    assert "28 metric definitions" in out
    job_name = namespace["job_name"]
    jobs = session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == [job_name]
    efs_coco = tmp_path / "efs" / "data" / "coco"
    assert (efs_coco / "annotations" / "instances_train2017.json").exists()
    assert (efs_coco / "weights" / "ImageNet-R50-AlignPadding.npz").exists()
    assert (tmp_path / "efs" / "logs").is_dir()
    assert namespace["request"]["ResourceConfig"]["InstanceCount"] == 2
    assert os.environ.get("SAGEMAKER_VALIDATE_ROLE") == "false"
