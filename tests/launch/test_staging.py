"""Data staging against a local HTTP server (the "COCO site") and moto S3 (the stack's bucket)."""
import hashlib
import http.server
import json
import os
import re
import shutil
import threading
import urllib.parse
from pathlib import Path

import boto3
import pytest

from launch.aws import LaunchError, make_session
from launch.staging import __main__ as cli
from launch.staging import download as dl
from launch.staging import s3get, s3sync
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


def _own_dataset(root: Path) -> Path:
    """A dataset outside the COCO layout, with a file at the path COCO's annotations have too."""
    (root / "labels").mkdir(parents=True)
    (root / "labels" / "train.json").write_text('{"images": [], "annotations": [], "categories": []}')
    (root / "photos").mkdir()
    (root / "photos" / "a.jpg").write_bytes(b"not COCO's picture")
    (root / "annotations").mkdir()
    (root / "annotations" / "instances_train2017.json").write_text('{"mine": true}')
    return root


def test_an_own_dataset_goes_to_its_own_prefix_and_efs_folder_beside_coco(aws_env, coco_site, tmp_path, capsys,
                                                                          monkeypatch):
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="stack-bucket")
    stage = tmp_path / "stage"
    shutil.copytree(coco_site.dataset, stage / "coco")
    assert cli.main(["upload", "--bucket", "stack-bucket", "--stage-dir", str(stage)]) == 0
    mine = _own_dataset(tmp_path / "parts-v2")
    assert cli.main(["upload", "--bucket", "stack-bucket", "--dataset-dir", str(mine)]) == 0   # named after it
    assert cli.main(["upload", "--bucket", "stack-bucket", "--dataset-dir", str(mine), "--name", "parts"]) == 0
    assert "uploaded 3 file(s)" in capsys.readouterr().out
    keys = {o["Key"] for o in session.client("s3").list_objects_v2(Bucket="stack-bucket")["Contents"]}
    for name in ("parts-v2", "parts"):
        assert {k for k in keys if k.startswith(f"data/{name}/")} == {
            f"data/{name}/labels/train.json", f"data/{name}/photos/a.jpg",
            f"data/{name}/annotations/instances_train2017.json"}
    # COCO's objects are untouched: the same bytes come back
    efs = tmp_path / "efs"
    assert cli.main(["to-efs", "--bucket", "stack-bucket", "--efs-dir", str(efs / "coco")]) == 0
    assert _tree(efs / "coco") == _tree(coco_site.dataset)
    monkeypatch.setattr(cli, "EFS_DATA_DIR", str(efs))   # the nodes' /efs/data, here
    assert cli.main(["to-efs", "--bucket", "stack-bucket", "--name", "parts"]) == 0
    assert _tree(efs / "parts") == _tree(mine)        # <EFS data folder>/<name> unless --efs-dir says otherwise


@pytest.mark.parametrize("argv, message", [
    (["upload", "--dataset-dir", "{mine}", "--name", "coco"], "the name 'coco' is COCO 2017's"),
    (["upload", "--dataset-dir", "{tmp}/coco"], "the name 'coco' is COCO 2017's"),
    (["upload", "--dataset-dir", "{mine}", "--name", "a/b"], "dataset name 'a/b': use letters, digits"),
    (["upload", "--dataset-dir", "{tmp}/none"], "is not a folder"),
    (["upload", "--dataset-dir", "{tmp}/empty"], "holds no .json annotation file"),
    (["to-efs", "--name", "x", "--prefix", "data/y"], "give one"),
])
def test_an_upload_that_would_mix_datasets_or_has_no_dataset_is_refused_before_any_request(
        tmp_path, capsys, argv, message):
    mine = _own_dataset(tmp_path / "mine")
    shutil.copytree(mine, tmp_path / "coco")
    (tmp_path / "empty" / "img").mkdir(parents=True)
    argv = [a.format(mine=mine, tmp=tmp_path) for a in argv]
    # no bucket, stack or credentials here: the refusal comes first
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1


# --- S3 -> EFS copy (requests per file, sha256 check), rerunning `download`, resumable downloads ---

def _small_tree(root: Path, n_dirs: int, per_dir: int) -> None:
    for d in range(n_dirs):
        (root / f"split{d}").mkdir(parents=True)
        for i in range(per_dir):
            (root / f"split{d}" / f"{i:06d}.jpg").write_bytes(f"image {d}/{i} ".encode() * (50 + i % 40))


def test_copy_to_efs_makes_one_get_per_file_and_each_directory_once(aws_env, tmp_path, monkeypatch):
    """The earlier copy did HEAD + GET + HEAD and a re-read per file, verified one at a time on
    the main thread, and a mkdir per file: each costs an EFS or S3 round trip, x 120,000 COCO images."""
    src = tmp_path / "src"
    _small_tree(src, n_dirs=3, per_dir=60)
    (src / "big.bin").write_bytes(bytes(range(256)) * (14 * 1024 + 7))   # 3.5 MiB: 4 parts of 1 MiB
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="staging-bucket")
    s3sync.upload_tree(session, src, "staging-bucket", "data/coco", concurrency=8, progress=False)
    calls = []   # every request botocore signs, sent by itself or as a presigned URL
    session.events.register("before-sign.s3", lambda request, **kw: calls.append(
        (request.method, urllib.parse.urlparse(request.url).path, str(request.headers.get("Range") or ""))))
    mkdirs = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: (mkdirs.append(str(path)), real_mkdir(path, *a, **k))[1])

    efs = tmp_path / "efs" / "coco"
    report = s3sync.copy_to_local(session, "staging-bucket", "data/coco", efs, concurrency=8, progress=False,
                                  part_size=1 << 20)
    assert _tree(efs) == _tree(src) and len(report.transferred) == 181
    gets = [c for c in calls if c[0] == "GET" and "/data/coco/" in c[1]]
    assert not [c for c in calls if c[0] == "HEAD" and "/data/coco/" in c[1]]   # no HEAD per object
    small = [c for c in gets if not c[1].endswith("big.bin")]
    assert len(small) == 180 and len({c[1] for c in small}) == 180              # one GET per small file
    big_ranges = sorted(c[2] for c in gets if c[1].endswith("big.bin"))
    assert len(big_ranges) == 4 and all("bytes=" in r for r in big_ranges)      # ranged parts in parallel
    assert len(mkdirs) <= 10   # about one per directory (efs, coco, 3 splits), not one per file (181)
    assert not list(efs.rglob("*.part"))


def test_copy_to_efs_deletes_a_file_that_does_not_match_its_recorded_sha256(aws_env, tmp_path):
    session = boto3.session.Session()
    client = session.client("s3")
    client.create_bucket(Bucket="staging-bucket")
    client.put_object(Bucket="staging-bucket", Key="data/a.json", Body=b"{}",
                      Metadata={s3sync.SHA256_KEY: "0" * 64})
    efs = tmp_path / "efs"
    with pytest.raises(StagingError, match=r"does not match the sha256 recorded for s3://staging-bucket/data/a.json"):
        s3sync.copy_to_local(session, "staging-bucket", "data", efs, progress=False)
    assert [p for p in efs.rglob("*") if p.is_file()] == []


def test_rerunning_download_after_extraction_needs_no_free_space(coco_site, tmp_path, monkeypatch):
    """On the notebook's 50 GiB volume the kept archives (19 GiB) and the extracted tree (20 GiB)
    leave less free space than a second extraction would need: a rerun must skip what is done."""
    stage = dl.stage_dataset(tmp_path / "stage", coco_site.artifacts, progress=False)
    image = next((stage / "coco" / "train2017").iterdir())
    mtime = image.stat().st_mtime_ns
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))  # the full volume
    dl.stage_dataset(stage, coco_site.artifacts, progress=False)
    assert image.stat().st_mtime_ns == mtime                       # not extracted again
    # An extraction that stopped half-way (a file missing, one cut short) is completed, and only
    # what is missing counts against the free space.
    image.unlink()
    other = sorted((stage / "coco" / "val2017").iterdir())[0]
    other.write_bytes(other.read_bytes()[:10])
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=2 * 1024 * 1024))
    dl.stage_dataset(stage, coco_site.artifacts, progress=False)
    assert _tree(stage / "coco") == {**_tree(coco_site.dataset),
                                     "weights/ImageNet-R50-AlignPadding.npz": b"pretend weights " * 1000}


class _FlakySite:
    """One file over real HTTP on 127.0.0.1 with Range/If-Range support; the first ``drops``
    responses stop after half their body and close the connection (a dropped download)."""

    def __init__(self, payload: bytes, drops: int):
        self.payload, self.drops, self.requests = payload, drops, []
        site = self
        etag = '"v1-%d"' % len(payload)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                wanted = self.headers.get("Range")
                start = 0
                if wanted and self.headers.get("If-Range", etag) == etag:
                    start = int(re.fullmatch(r"bytes=(\d+)-", wanted)[1])
                    if start >= len(site.payload):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(site.payload)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        site.requests.append((wanted, 0))
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(site.payload) - 1}/{len(site.payload)}")
                else:
                    self.send_response(200)
                body = site.payload[start:]
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", etag)
                self.end_headers()
                if len(site.requests) < site.drops:
                    body = body[:len(body) // 2]
                    self.close_connection = True
                self.wfile.write(body)
                site.requests.append((wanted, len(body)))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/weights.npz"


@pytest.fixture
def flaky_site():
    sites = []

    def make(payload: bytes, drops: int) -> _FlakySite:
        sites.append(_FlakySite(payload, drops))
        return sites[-1]
    yield make
    for s in sites:
        s.server.shutdown()
        s.server.server_close()


def test_dropped_download_resumes_with_a_range_request(flaky_site, tmp_path, monkeypatch):
    monkeypatch.setattr(dl, "RETRY_DELAY_S", 0.0)
    payload = os.urandom(8 << 20)
    site = flaky_site(payload, drops=1)
    artifact = dl.Artifact("w.npz", site.url, "sha256:" + hashlib.sha256(payload).hexdigest(), None)
    dl.stage_dataset(tmp_path, (artifact,), progress=False)
    assert (tmp_path / "coco" / "w.npz").read_bytes() == payload
    half = len(payload) // 2
    assert site.requests == [(None, half), (f"bytes={half}-", len(payload) - half)]  # nothing fetched twice


def test_interrupted_download_is_kept_and_a_rerun_resumes_it(flaky_site, tmp_path, monkeypatch):
    monkeypatch.setattr(dl, "RETRY_DELAY_S", 0.0)
    payload = os.urandom(8 << 20)
    site = flaky_site(payload, drops=dl.DOWNLOAD_ATTEMPTS)   # every attempt of the first run drops
    artifact = dl.Artifact("w.npz", site.url, None, None)
    with pytest.raises(StagingError, match=r"download of w.npz .* failed .* rerun to resume"):
        dl.stage_dataset(tmp_path, (artifact,), allow_unpinned=True, progress=False)
    kept = (tmp_path / "downloads" / "w.npz.part").stat().st_size
    assert kept == sum(sent for _, sent in site.requests) and 0 < kept < len(payload)
    # A truncated body is never taken for the whole file, pinned checksum or not.
    assert not (tmp_path / "downloads" / "w.npz").exists()
    dl.stage_dataset(tmp_path, (artifact,), allow_unpinned=True, progress=False)   # the rerun
    assert site.requests[-1] == (f"bytes={kept}-", len(payload) - kept)
    assert (tmp_path / "coco" / "w.npz").read_bytes() == payload
    assert hashlib.sha256(payload).hexdigest() in (tmp_path / "checksums.json").read_text()
    assert sorted(p.name for p in (tmp_path / "downloads").iterdir()) == ["w.npz"]


def test_a_kept_part_is_fetched_again_whole_from_a_server_without_range_support(coco_site, tmp_path):
    weights = coco_site.artifacts[3]   # the site is http.server's SimpleHTTPRequestHandler: no ranges
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / f"{weights.name}.part").write_bytes(b"pretend")
    (downloads / f"{weights.name}.part.json").write_text(json.dumps({"url": weights.url, "validator": None}))
    dl.stage_dataset(tmp_path, (weights,), progress=False)
    assert (tmp_path / "coco" / "weights" / weights.name).read_bytes() == b"pretend weights " * 1000
    assert sorted(p.name for p in downloads.iterdir()) == [weights.name]


def test_presigned_get_names_a_missing_object_and_keeps_to_botocore_behind_a_proxy(aws_env, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    client = boto3.session.Session().client("s3")
    client.create_bucket(Bucket="staging-bucket")
    getter = s3get.PresignedGetter(client, "staging-bucket", max_connections=2)
    with pytest.raises(StagingError, match=r"GET s3://staging-bucket/nope failed: HTTP 404 NoSuchKey"):
        getter.get("nope")
    assert s3get.usable(client)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")   # the endpoint is http://127.0.0.1
    monkeypatch.setenv("NO_PROXY", "")
    assert not s3get.usable(client)   # botocore honours the proxy; the plain pool would not
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert s3get.usable(client)


def test_without_stack_the_bucket_comes_from_the_first_stack_these_credentials_may_read(
        aws_env, coco_site, tmp_path, capsys, monkeypatch):
    """Each role may read only its own stack's outputs: on a cluster node SageMakerStack's are
    denied (a recorded AccessDenied), and the bucket comes from EfsClusterStack's."""
    from aws_fakes import deploy_stack
    from recorded_aws import Replay
    session = boto3.session.Session()
    session.client("s3").create_bucket(Bucket="stack-bucket")
    assert cli.main(["to-efs", "--efs-dir", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: no stack's bucket found (stack 'SageMakerStack' does not exist in us-east-1; stack 'EfsClusterStack' "
        "does not exist in us-east-1; stack 'NetworkStorageStack' does not exist in us-east-1): deploy the stacks, "
        "or pass --stack NAME (the stack's name as CloudFormation shows it, with its name_prefix) or --bucket")
    for stack in ("SageMakerStack", "EfsClusterStack"):
        deploy_stack(session, stack, {"BucketName": "stack-bucket"})
    replay = Replay({"DescribeStacks": {"SageMakerStack": "node-role-access-denied"}})
    replay.install(session)
    monkeypatch.setattr(cli, "make_session", lambda region=None: session)
    stage = tmp_path / "stage"
    shutil.copytree(coco_site.dataset, stage / "coco")
    assert cli.main(["upload", "--stage-dir", str(stage)]) == 0
    assert cli.main(["to-efs", "--efs-dir", str(tmp_path / "efs")]) == 0
    assert _tree(tmp_path / "efs") == _tree(coco_site.dataset)
    assert replay.answered == [("DescribeStacks", "SageMakerStack")] * 2


def test_on_the_notebook_of_a_deployment_with_a_name_prefix_the_bucket_is_its_own(aws_env, tmp_path, monkeypatch, capsys):
    """With a name prefix the stacks are <prefix>-<id> (infra/config.py); the notebook's on-start
    script records its stack's name, and `maskrcnn data` takes the prefix from it, not another
    deployment's unprefixed stack."""
    from aws_fakes import deploy_stack
    from launch import deployment
    session = boto3.session.Session()
    for bucket, stack in (("ours", "team-a-SageMakerStack"), ("theirs", "SageMakerStack")):
        session.client("s3").create_bucket(Bucket=bucket)
        deploy_stack(session, stack, {"BucketName": bucket})
    session.client("s3").put_object(Bucket="ours", Key="data/coco/x.json", Body=b"{}")
    monkeypatch.setattr(deployment, "NOTEBOOK_STACK_FILE", str(tmp_path / ".maskrcnn-stack"))
    (tmp_path / ".maskrcnn-stack").write_text("team-a-SageMakerStack\n")
    assert cli.main(["to-efs", "--efs-dir", str(tmp_path / "efs")]) == 0, capsys.readouterr().err
    assert (tmp_path / "efs" / "x.json").read_text() == "{}"


def test_weights_only_stages_the_weights_files_without_the_dataset(coco_site, tmp_path, capsys):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([a.__dict__ for a in coco_site.artifacts]))
    stage = tmp_path / "stage"
    assert cli.main(["download", "--stage-dir", str(stage), "--manifest", str(manifest), "--weights-only"]) == 0
    assert _tree(stage / "coco") == {"weights/ImageNet-R50-AlignPadding.npz": b"pretend weights " * 1000}
    assert sorted(p.name for p in (stage / "downloads").iterdir()) == ["ImageNet-R50-AlignPadding.npz"]
    assert f"staged under {stage / 'coco' / 'weights'}" in capsys.readouterr().out
    # the built-in list's weights are the two published files
    assert [a.name for a in dl.weights_only(dl.COCO_2017)] == ["ImageNet-R50-AlignPadding.npz",
                                                               "COCO-R50FPN-MaskRCNN-Standard.npz"]
    data_only = tmp_path / "data.json"
    data_only.write_text(json.dumps([a.__dict__ for a in coco_site.artifacts[:3]]))
    assert cli.main(["download", "--stage-dir", str(tmp_path / "s2"), "--manifest", str(data_only), "--weights-only"]) == 2
    assert "no weights file among the artifacts (train2017.zip, " in capsys.readouterr().err
    assert not (tmp_path / "s2").exists()
