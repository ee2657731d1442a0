"""Data staging against a local HTTP server (the "COCO site") and moto S3 (the stack's bucket)."""
import shutil
import urllib.parse
from pathlib import Path

import boto3
import pytest

from launch.aws import LaunchError, make_session
from launch.staging import __main__ as cli
from launch.staging import download as dl
from launch.staging import s3sync
from launch.staging.diskspace import StagingError, ensure_free_space


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_download_verifies_and_extracts_into_coco_layout(coco_site, tmp_path):
    stage = dl.stage_dataset(tmp_path / "stage", coco_site.artifacts, progress=False)
    coco = stage / "coco"
    expected = _tree(coco_site.dataset)
    got = _tree(coco)
    assert {k: v for k, v in got.items() if not k.startswith("weights/")} == expected
    assert got["weights/ImageNet-R50-AlignPadding.npz"] == b"pretend weights " * 1000
    # A rerun re-verifies the kept downloads instead of fetching again.
    mtime = (stage / "downloads" / "train2017.zip").stat().st_mtime_ns
    dl.stage_dataset(stage, coco_site.artifacts, progress=False)
    assert (stage / "downloads" / "train2017.zip").stat().st_mtime_ns == mtime


def test_bad_checksum_and_unpinned_are_refused(coco_site, tmp_path):
    bad = dl.with_overrides(coco_site.artifacts[:1], {}, {"train2017.zip": "sha256:" + "0" * 64})
    with pytest.raises(StagingError, match="does not match its checksum"):
        dl.stage_dataset(tmp_path, bad, progress=False)
    assert not any((tmp_path / "downloads").iterdir())  # the corrupt copy is gone
    unpinned = (dl.Artifact("w.npz", f"{coco_site.base}/weights.npz", None, None),)
    with pytest.raises(StagingError, match="no checksum pinned for w.npz"):
        dl.stage_dataset(tmp_path, unpinned, progress=False)
    dl.stage_dataset(tmp_path, unpinned, allow_unpinned=True, progress=False)
    assert "w.npz" in (tmp_path / "checksums.json").read_text()
    with pytest.raises(StagingError, match="unknown artifact"):
        dl.with_overrides(coco_site.artifacts, {"nope.zip": "http://x"}, {})
    with pytest.raises(StagingError, match="md5:<hex> or sha256:<hex>"):
        dl.parse_checksum("crc32:1234")


def test_round_trip_through_s3_is_byte_identical(aws_env, coco_site, tmp_path):
    stage = dl.stage_dataset(tmp_path / "stage", coco_site.artifacts, progress=False)
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="staging-bucket")
    up = s3sync.upload_tree(session, stage / "coco", "staging-bucket", "data/coco", concurrency=4, progress=False)
    assert len(up.transferred) == len(_tree(stage / "coco")) and not up.skipped
    efs = tmp_path / "efs" / "data" / "coco"
    down = s3sync.copy_to_local(session, "staging-bucket", "data/coco", efs, concurrency=4, progress=False)
    assert _tree(efs) == _tree(stage / "coco")
    assert len(down.transferred) == len(up.transferred)
    # Both directions resume: nothing left to do on a rerun.
    assert s3sync.upload_tree(session, stage / "coco", "staging-bucket", "data/coco", progress=False).transferred == []
    assert s3sync.copy_to_local(session, "staging-bucket", "data/coco", efs, progress=False).transferred == []


def test_interrupted_upload_resumes_and_reuploads_changed_files(aws_env, coco_site, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(coco_site.dataset, src)
    n_files = len(_tree(src))
    session = boto3.session.Session()
    client = session.client("s3")
    client.create_bucket(Bucket="staging-bucket")
    k = 4
    puts = []

    def network_drops_after_k_files(request, **kwargs):  # an injected failure, as a dropped connection
        if request.method == "PUT":
            puts.append(request.url)
            if len(puts) > k:
                raise ConnectionAbortedError("simulated network failure")

    client.meta.events.register("before-send.s3.PutObject", network_drops_after_k_files)
    with pytest.raises(ConnectionAbortedError):
        s3sync.upload_tree(session, src, "staging-bucket", "data", concurrency=1, progress=False, client=client)
    client.meta.events.unregister("before-send.s3.PutObject", network_drops_after_k_files)
    assert client.list_objects_v2(Bucket="staging-bucket")["KeyCount"] == k

    # Which files made it is up to the transfer manager's scheduling; one of them changes locally.
    first_done = sorted(urllib.parse.urlparse(u).path.split("/staging-bucket/", 1)[1] for u in puts[:k])
    changed = first_done[0]
    (src / changed.removeprefix("data/")).write_bytes(b"changed since the first try")
    resumed = s3sync.upload_tree(session, src, "staging-bucket", "data", concurrency=1, progress=False, client=client)
    assert sorted(resumed.skipped) == first_done[1:]  # same size and sha256: skipped
    assert changed in resumed.transferred             # changed: uploaded again
    assert len(resumed.skipped) + len(resumed.transferred) == n_files
    back = tmp_path / "back"
    s3sync.copy_to_local(session, "staging-bucket", "data", back, progress=False)
    assert _tree(back) == _tree(src)


def test_missing_bucket_is_a_clear_error(aws_env, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StagingError, match="bucket 'no-such-bucket' does not exist"):
        s3sync.upload_tree(boto3.session.Session(), tmp_path, "no-such-bucket", "data", progress=False)
    with pytest.raises(StagingError, match="does not exist"):
        s3sync.copy_to_local(boto3.session.Session(), "no-such-bucket", "data", tmp_path / "out", progress=False)


def test_missing_credentials_tell_the_user_what_to_do(monkeypatch, tmp_path, capsys):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find here
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(LaunchError, match="no AWS credentials found: configure them with `aws configure`"):
        make_session()
    assert cli.main(["upload", "--bucket", "b", "--stage-dir", str(tmp_path)]) == 2
    assert "no AWS credentials found" in capsys.readouterr().err


def test_full_disk_is_refused_before_copying(aws_env, coco_site, tmp_path, monkeypatch):
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="staging-bucket")
    s3sync.upload_tree(session, coco_site.dataset, "staging-bucket", "data", progress=False)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))  # an almost full disk
    dest = tmp_path / "efs"
    with pytest.raises(StagingError, match=r"not enough free space for copying s3://staging-bucket/data.*needs"):
        s3sync.copy_to_local(session, "staging-bucket", "data", dest, progress=False)
    assert not dest.exists()  # nothing was written
    with pytest.raises(StagingError, match="not enough free space for downloading train2017.zip"):
        dl.stage_dataset(tmp_path / "stage", coco_site.artifacts, progress=False)


def test_free_space_check_uses_the_nearest_existing_parent(tmp_path):
    ensure_free_space(tmp_path / "not" / "yet", 1, what="x")
    with pytest.raises(StagingError, match="needs 1.0 TiB"):
        ensure_free_space(tmp_path, 1 << 40 if shutil.disk_usage(tmp_path).free < (1 << 40) else 1 << 62,
                          what="x")


def test_cli_reads_bucket_from_stack_outputs(aws_env, coco_site, tmp_path, capsys):
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="stack-bucket")
    session.client("cloudformation").create_stack(
        StackName="DataStack",
        TemplateBody='{"Resources": {"T": {"Type": "AWS::SNS::Topic"}},'
                     ' "Outputs": {"BucketName": {"Value": "stack-bucket"}}}')
    stage = tmp_path / "stage"
    shutil.copytree(coco_site.dataset, stage / "coco")
    assert cli.main(["upload", "--stack", "DataStack", "--stage-dir", str(stage)]) == 0
    assert "already there" in capsys.readouterr().out
    assert cli.main(["to-efs", "--stack", "DataStack", "--efs-dir", str(tmp_path / "efs")]) == 0
    assert _tree(tmp_path / "efs") == _tree(coco_site.dataset)
    assert cli.main(["to-efs", "--stack", "NoSuchStack", "--efs-dir", str(tmp_path / "x")]) == 2
    assert "stack 'NoSuchStack' does not exist" in capsys.readouterr().err
