"""Parallel, resumable copies between a local tree and S3 (boto3's TransferManager: multipart,
many files at once), with one progress bar over all bytes.

Upload resume: every object carries its file's sha256 in its metadata (``x-amz-meta-sha256``); a file
whose object already has the same size and sha256 is skipped, so an interrupted upload picks up
where it stopped. (S3's ETag is no content hash for multipart uploads, hence our own.)
S3 -> EFS copy: files already there with the object's size are skipped; downloaded files are
checked against the recorded sha256; free space is checked before the first byte is written.
"""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.exceptions import ClientError, NoCredentialsError
from s3transfer.subscribers import BaseSubscriber
from tqdm import tqdm

from launch.staging.diskspace import StagingError, ensure_free_space
from launch.staging.download import file_digest

SHA256_KEY = "sha256"
MB = 1 << 20


@dataclasses.dataclass
class SyncReport:
    transferred: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    bytes_transferred: int = 0


class _Progress(BaseSubscriber):
    def __init__(self, bar: tqdm):
        self.bar = bar

    def on_progress(self, future, bytes_transferred, **kwargs):
        self.bar.update(bytes_transferred)


def _transfer_config(concurrency: int) -> TransferConfig:
    # 64 MiB parts: COCO's 18 GiB train2017.zip becomes ~300 parts, well under S3's 10,000 limit.
    return TransferConfig(multipart_threshold=64 * MB, multipart_chunksize=64 * MB,
                          max_concurrency=concurrency, use_threads=True)


def _check_bucket(client, bucket: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        raise StagingError("no AWS credentials found: configure them with `aws configure` or `aws sso login`, "
                           "or run on the notebook instance / master node, which have a role") from None
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise StagingError(f"bucket {bucket!r} does not exist: use the stack's BucketName output "
                               f"(or --stack to read it) or create the bucket") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise StagingError(f"access to bucket {bucket!r} denied: check the credentials' permissions") from None
        raise


def _key(prefix: str, rel: str) -> str:
    return f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel


def upload_tree(session: boto3.session.Session, local_dir: str | Path, bucket: str, prefix: str, *,
                concurrency: int = 16, progress: bool = True, client=None) -> SyncReport:
    """Upload every file under ``local_dir`` to ``s3://bucket/prefix/<relative path>``."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise StagingError(f"{local_dir} is not a directory: stage the data first (python -m launch.staging download)")
    client = client or session.client("s3")
    _check_bucket(client, bucket)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    report = SyncReport()

    def plan(path: Path):
        key = _key(prefix, path.relative_to(local_dir).as_posix())
        size, digest = path.stat().st_size, file_digest(path)
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            if head["ContentLength"] == size and head.get("Metadata", {}).get(SHA256_KEY) == digest:
                return key, path, size, digest, True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        return key, path, size, digest, False

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        plans = list(pool.map(plan, files))
    todo = [p for p in plans if not p[4]]
    report.skipped = [p[0] for p in plans if p[4]]
    with tqdm(total=sum(p[2] for p in todo), unit="B", unit_scale=True, desc=f"upload s3://{bucket}",
              disable=not progress) as bar, create_transfer_manager(client, _transfer_config(concurrency)) as tm:
        futures = [(key, size, tm.upload(str(path), bucket, key, extra_args={"Metadata": {SHA256_KEY: digest}},
                                         subscribers=[_Progress(bar)]))
                   for key, path, size, digest, _ in todo]
        for key, size, future in futures:
            future.result()
            report.transferred.append(key)
            report.bytes_transferred += size
    return report


def copy_to_local(session: boto3.session.Session, bucket: str, prefix: str, dest: str | Path, *,
                  concurrency: int = 32, progress: bool = True, client=None,
                  on_file_done: Callable[[str], None] | None = None) -> SyncReport:
    """Copy ``s3://bucket/prefix/`` into ``dest`` (e.g. /efs/data): the S3 -> EFS step."""
    dest = Path(dest)
    client = client or session.client("s3")
    _check_bucket(client, bucket)
    root = prefix.strip("/")
    objects = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/" if root else ""):
        objects += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not objects:
        raise StagingError(f"nothing under s3://{bucket}/{root}: upload the data first (python -m launch.staging upload)")
    report = SyncReport()
    todo = []
    for o in objects:
        rel = o["Key"][len(root) + 1:] if root else o["Key"]
        target = (dest / rel).resolve()
        if dest.resolve() not in target.parents:
            raise StagingError(f"object key {o['Key']!r} would be written outside {dest}; refusing")
        if target.is_file() and target.stat().st_size == o["Size"]:
            report.skipped.append(o["Key"])
        else:
            todo.append((o["Key"], target, o["Size"]))
    ensure_free_space(dest, sum(size for _, _, size in todo), what=f"copying s3://{bucket}/{root} to {dest}")

    def verify(key: str, target: Path):
        expected = client.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get(SHA256_KEY)
        if expected and file_digest(target) != expected:
            target.unlink()
            raise StagingError(f"{target} does not match the sha256 recorded for s3://{bucket}/{key}; "
                               f"deleted it, rerun to fetch it again")

    with tqdm(total=sum(s for _, _, s in todo), unit="B", unit_scale=True, desc=f"copy to {dest}",
              disable=not progress) as bar, create_transfer_manager(client, _transfer_config(concurrency)) as tm:
        futures = []
        for key, target, size in todo:
            target.parent.mkdir(parents=True, exist_ok=True)
            futures.append((key, target, size, tm.download(bucket, key, str(target), subscribers=[_Progress(bar)])))
        for key, target, size, future in futures:
            future.result()
            verify(key, target)
            report.transferred.append(key)
            report.bytes_transferred += size
            if on_file_done:
                on_file_done(key)
    return report


def default_concurrency() -> int:
    return max(8, min(64, 4 * (os.cpu_count() or 2)))
