"""Responses of AWS APIs that moto does not answer, written from the API references (none was
captured from AWS: README.md), replayed to botocore.

Each JSON file here holds one operation's responses, named, with the API reference they follow.
A :class:`Replay` maps requests (by the parameter that tells them apart: a quota code, a
reservation id, a group, a stack name) to response names, and answers them

- in-process: a ``before-send`` hook on a boto3 session, for exactly the mapped requests; every
  other request goes on to the moto server;
- out of process: an HTTP server on 127.0.0.1 for a service with an endpoint of its own (point
  ``AWS_ENDPOINT_URL_<SERVICE>`` at it), e.g. for ``maskrcnn preflight`` in a subprocess.

Either way the stored body goes through botocore's own parser for the service's protocol: EC2's
and CloudFormation's bodies are sent as their XML, Service Quotas' and Resource Groups' as JSON.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from xml.sax.saxutils import escape

from botocore.awsrequest import AWSResponse

from local_http import serving

HERE = Path(__file__).resolve().parent

def _product_query(params: Mapping) -> str:
    """A GetProducts request as a key: its service code and filters, e.g.
    ``AmazonSageMaker regionCode TERM_MATCH us-east-1, usagetype CONTAINS Train:ml.p4d.24xlarge``."""
    return f"{params.get('ServiceCode')} " + ", ".join(
        f"{f['Field']} {f['Type']} {f['Value']}" for f in params.get("Filters", []))


def training_hour_query(instance_type: str, region: str = "us-east-1") -> str:
    """The GetProducts key of a SageMaker on-demand training hour (as AWS bills it: the usage type
    <region prefix>-Train:<ml type>)."""
    return f"AmazonSageMaker regionCode TERM_MATCH {region}, usagetype CONTAINS Train:{instance_type}"


def linux_hour_query(instance_type: str, region: str) -> str:
    """The GetProducts key of an EC2 on-demand hour (usage type <region prefix>-BoxUsage:<type>) of
    Linux, shared tenancy, no preinstalled software, capacity used."""
    return (f"AmazonEC2 regionCode TERM_MATCH {region}, usagetype CONTAINS BoxUsage:{instance_type}, "
            "operatingSystem TERM_MATCH Linux, tenancy TERM_MATCH Shared, preInstalledSw TERM_MATCH NA, "
            "capacitystatus TERM_MATCH Used")


# operation -> (response file, the request parameter, or the function of the request, that picks the response)
OPERATIONS = {
    "GetServiceQuota": ("get_service_quota.json", "QuotaCode"),
    "GetAWSDefaultServiceQuota": ("get_aws_default_service_quota.json", "QuotaCode"),
    "ListGroupResources": ("list_group_resources.json", "Group"),
    "DescribeCapacityReservations": ("describe_capacity_reservations.json", "CapacityReservationId.1"),
    "DescribeStacks": ("describe_stacks.json", "StackName"),
    "GetProducts": ("get_products.json", _product_query),
}
# botocore's event names of the services (service id, hyphenated, lower case)
EVENT_SERVICE = {"service-quotas": "service-quotas", "resource-groups": "resource-groups",
                 "ec2": "ec2", "cloudformation": "cloudformation", "pricing": "pricing"}
# rest-json operations by request path
REST_PATHS = {"/list-group-resources": "ListGroupResources"}
XML_NAMESPACE = {"ec2": "http://ec2.amazonaws.com/doc/2016-11-15/",
                 "cloudformation": "http://cloudformation.amazonaws.com/doc/2010-05-15/"}


def recorded(operation: str) -> dict:
    return json.loads((HERE / OPERATIONS[operation][0]).read_text())


def _xml(name: str, value, list_item: str) -> str:
    if isinstance(value, dict):
        inner = "".join(_xml(k, v, list_item) for k, v in value.items())
    elif isinstance(value, list):
        inner = "".join(_xml(list_item, v, list_item) for v in value)
    elif isinstance(value, bool):
        inner = "true" if value else "false"
    else:
        inner = escape(str(value))
    return f"<{name}>{inner}</{name}>"


def wire(operation: str, name: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of stored response `name` as the service sends it."""
    doc = recorded(operation)
    response = doc["responses"][name]
    status, body = response["status"], response["body"]
    protocol = doc["protocol"]
    if protocol == "json":
        return status, {"Content-Type": "application/x-amz-json-1.1",
                        "x-amzn-RequestId": "5f0a7c2e-recorded"}, json.dumps(body).encode()
    if protocol == "rest-json":
        return status, {"Content-Type": "application/json",
                        "x-amzn-RequestId": "5f0a7c2e-recorded"}, json.dumps(body).encode()
    item = "item" if protocol == "ec2" else "member"
    if status >= 300:
        root = "Response" if protocol == "ec2" else "ErrorResponse"
        text = _xml(root, body, item)
    else:
        namespace = XML_NAMESPACE[doc["service"]]
        inner = "".join(_xml(k, v, item) for k, v in body.items())
        text = f'<{operation}Response xmlns="{namespace}">{inner}</{operation}Response>'
    return status, {"Content-Type": "text/xml"}, ('<?xml version="1.0" encoding="UTF-8"?>' + text).encode()


class _Raw:
    """The raw stream botocore reads an AWSResponse's content from."""

    def __init__(self, body: bytes):
        self._body = body

    def stream(self, **kwargs) -> Iterator[bytes]:
        yield self._body


class Replay:
    """``Replay({"GetServiceQuota": {"L-417A185B": "p-192"}})``: a GetServiceQuota request for
    quota L-417A185B is answered with stored response ``p-192``."""

    def __init__(self, mapping: Mapping[str, Mapping[str, str]]):
        for operation, names in mapping.items():
            known = recorded(operation)["responses"]
            missing = sorted(set(names.values()) - set(known))
            assert not missing, f"{OPERATIONS[operation][0]} has no response {missing}"
        self.mapping = {op: dict(names) for op, names in mapping.items()}
        self.answered: list[tuple[str, str]] = []   # (operation, key) in the order asked

    def lookup(self, operation: str, params: Mapping) -> tuple[int, dict, bytes] | None:
        picks = OPERATIONS[operation][1]
        key = picks(params) if callable(picks) else params.get(picks)
        name = self.mapping.get(operation, {}).get(key)
        if name is None:
            return None
        self.answered.append((operation, key))
        return wire(operation, name)

    # -- in-process --

    def install(self, session) -> None:
        """Answers the mapped requests of ``session``'s clients (boto3 or botocore session)."""
        events = getattr(session, "events", None) or session.get_component("event_emitter")
        for operation in self.mapping:
            service = recorded(operation)["service"]
            events.register(f"before-send.{EVENT_SERVICE[service]}.{operation}",
                            lambda request, _op=operation, **kw: self._answer(_op, request))

    def _answer(self, operation: str, request) -> AWSResponse | None:
        found = self.lookup(operation, _params(request.body, request.headers.get("Content-Type", b"")))
        if found is None:
            return None
        status, headers, body = found
        return AWSResponse(request.url, status, headers, _Raw(body))

    # -- out of process --

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """An HTTP server on 127.0.0.1 answering the mapped requests; yields its URL."""
        replay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.headers.get("X-Amz-Target", "")
                operation = (target.rsplit(".", 1)[-1] if target
                             else REST_PATHS.get(urllib.parse.urlsplit(self.path).path))
                found = (replay.lookup(operation, _params(body, self.headers.get("Content-Type", "")))
                         if operation in replay.mapping else None)
                if found is None:
                    found = (400, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(
                        {"__type": "NotRecorded", "message": f"no recorded response for {operation} "
                                                             f"{body[:200]!r}"}).encode())
                status, headers, payload = found
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        with serving(Handler) as url:
            yield url


def _params(body, content_type) -> dict:
    """A request's parameters: JSON protocols send a JSON object, query protocols a form."""
    if isinstance(body, bytes):
        body = body.decode()
    if isinstance(content_type, bytes):
        content_type = content_type.decode()
    body = body or ""
    if "json" in content_type or body.startswith("{"):
        return json.loads(body)
    return {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
