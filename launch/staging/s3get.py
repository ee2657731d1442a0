"""Whole-object S3 GETs at a fraction of botocore's client CPU, for copying COCO's 120,000 images.

A botocore call costs 2-3 ms of CPU (parameter validation, event hooks, signing, response parsing);
on a 2-vCPU notebook that, not S3 or EFS, limits an S3 -> EFS copy of small files. Here botocore
still signs each request (a presigned URL: the same credentials, endpoint, region and addressing
style as the client), and a plain urllib3 pool sends it: about 0.7 ms all told. Where a proxy
applies to the endpoint the caller keeps using botocore, which honours it.
"""
from __future__ import annotations

import os
import re
import urllib.parse
import urllib.request

import urllib3
from botocore.httpsession import get_cert_path

from launch.staging.diskspace import StagingError

PRESIGN_EXPIRY_S = 900   # signed right before each request; only a stalled retry could outlive it


def usable(client) -> bool:
    """Whether a plain pool reaches the client's endpoint as botocore would (no proxy in between)."""
    if client.meta.config.proxies:
        return False
    parts = urllib.parse.urlparse(client.meta.endpoint_url)
    proxies = urllib.request.getproxies()
    return parts.scheme not in proxies or bool(urllib.request.proxy_bypass(parts.hostname or ""))


class PresignedGetter:
    """``get(key)`` streams one whole object of ``bucket``; thread-safe, one pool per copy."""

    def __init__(self, client, bucket: str, *, max_connections: int):
        self.client, self.bucket = client, bucket
        self.pool = urllib3.PoolManager(
            maxsize=max_connections, ca_certs=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True),
            timeout=urllib3.Timeout(connect=10, read=60),
            # Throttling and server errors before the body, as botocore's standard retry mode does.
            retries=urllib3.Retry(total=5, backoff_factor=0.5, status_forcelist=(500, 502, 503, 504),
                                  allowed_methods=("GET",), raise_on_status=False, redirect=False))

    def get(self, key: str) -> urllib3.BaseHTTPResponse:
        """The response, body not yet read; ``.headers`` carries the object's ``x-amz-meta-*``."""
        url = self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": key},
                                                 ExpiresIn=PRESIGN_EXPIRY_S)
        resp = self.pool.request("GET", url, preload_content=False, redirect=False)
        if resp.status != 200:
            body = resp.read()
            resp.release_conn()
            code = re.search(rb"<Code>([^<]+)</Code>", body)
            raise StagingError(f"GET s3://{self.bucket}/{key} failed: HTTP {resp.status} "
                               f"{code[1].decode() if code else ''}".rstrip()
                               + "; check the credentials' s3:GetObject permission and rerun")
        return resp

    def close(self) -> None:
        self.pool.clear()
