"""S3 -> EFS staging throughput: `maskrcnn data to-efs` (launch/staging/s3sync.py)
side by side with `aws s3 sync` (awscli, pinned in constraints.txt) on the same data and server.

Both copy from a moto server on 127.0.0.1 into a fresh local directory (the EFS stand-in): a
COCO-like tree of many small files (files/s) and, separately, a few large files (MB/s). The runs
alternate between the tools so that load from other work hits both alike; the machine's load
average is recorded with the figures. On real EFS every file creation is a network round trip, so
per-file overhead weighs more there than on a local disk; S3 latency is higher than moto's too.

    python bench/staging_efs.py                       # 5,000 small files + 3 large, 2 runs each
    python bench/staging_efs.py --small 500 --large 1 --large-mb 32 --runs 1   # a quick look
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import REPO, RESULTS, load_test_helper

BUCKET = "bench-staging"
MB = 1 << 20


def make_tree(root: Path, *, small: int, small_kb: int, large: int, large_mb: int, seed: int = 0) -> None:
    """``small/`` holds ``small`` files of 0.25x-1.75x ``small_kb`` KiB in folders of 1,000 (like
    COCO's image folders, averaging ``small_kb``); ``large/`` holds ``large`` files of ``large_mb`` MiB."""
    rng = random.Random(seed)
    block = os.urandom(4 * MB)   # incompressible bytes; sliced so files differ
    for i in range(small):
        folder = root / "small" / f"part{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        size = int(small_kb * 1024 * rng.uniform(0.25, 1.75))
        offset = rng.randrange(0, len(block) - size)
        (folder / f"{i:012d}.jpg").write_bytes(block[offset:offset + size])
    (root / "large").mkdir(parents=True, exist_ok=True)
    for i in range(large):
        with open(root / "large" / f"archive{i}.bin", "wb") as f:
            for j in range(large_mb // 4):
                f.write(block[j % 7:] + block[:j % 7])
            f.write(block[:(large_mb % 4) * MB])


def tree_summary(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 in front of moto that holds each response's first byte back until
    ``latency_s`` after its request arrived: S3's time to first byte (moto answers in about a
    millisecond, the real service in tens of them). Runs on its own event loop thread."""

    def __init__(self, upstream_port: int, latency_s: float):
        self.upstream_port, self.latency_s = upstream_port, latency_s
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result()
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def _serve(self, client_r, client_w):
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        request_at = []   # when the request now waiting for its answer arrived

        async def requests():
            while data := await client_r.read(1 << 16):
                if not request_at:
                    request_at.append(self.loop.time())
                upstream_w.write(data)
                await upstream_w.drain()
            upstream_w.close()

        async def responses():
            while data := await upstream_r.read(1 << 16):
                if request_at:
                    wait = request_at.pop() + self.latency_s - self.loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(requests(), responses(), return_exceptions=True)
        for w in (client_w, upstream_w):
            w.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def copy_command(tool: str, prefix: str, dest: Path, concurrency: int) -> list[str]:
    """The command line a user runs; both tools start as fresh processes, so both pay start-up."""
    if tool == "launch.staging":
        return [sys.executable, "-m", "launch.staging", "to-efs", "--bucket", BUCKET, "--prefix", prefix,
                "--efs-dir", str(dest), "--concurrency", str(concurrency)]
    aws = Path(sys.executable).parent / "aws"
    if not aws.exists():
        raise SystemExit(f"{aws} not found: install the pinned awscli (make install, or "
                         f"pip install -c constraints.txt awscli)")
    return [str(aws), "s3", "sync", "--only-show-errors", f"s3://{BUCKET}/{prefix}", str(dest)]


def aws_config(path: Path, max_concurrent_requests: int) -> Path:
    path.write_text(f"[default]\nregion = us-east-1\ns3 =\n    max_concurrent_requests = {max_concurrent_requests}\n")
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_copy(cmd: list[str], env: dict, server_pid: int) -> tuple[float, float, float]:
    """Wall seconds, and CPU seconds of the tool and of the moto server: CPU per file is the figure
    that other load on the machine does not distort."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = cpu_seconds(server_pid)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, client, cpu_seconds(server_pid) - server_before


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", type=int, default=5000, help="number of small files")
    p.add_argument("--small-kb", type=int, default=32, help="average small-file size in KiB")
    p.add_argument("--large", type=int, default=3, help="number of large files")
    p.add_argument("--large-mb", type=int, default=160, help="size of each large file in MiB (> 64: ranged parts)")
    p.add_argument("--latency-ms", type=float, nargs="+", default=[0, 25, 100],
                   help="S3 time to first byte to emulate for the small files (0: moto directly)")
    p.add_argument("--runs", type=int, default=1, help="runs per tool and case (alternating order)")
    p.add_argument("--concurrency", type=int, default=0, help="our requests in flight (default: the CLI's)")
    p.add_argument("--output", default=str(RESULTS / "staging_efs.json"))
    args = p.parse_args(argv)

    from launch.staging import s3sync
    concurrency = args.concurrency or s3sync.default_concurrency()
    work = Path(tempfile.mkdtemp(prefix="bench-staging-"))
    moto, endpoint = load_test_helper("aws_fakes").start_moto_server()
    base_env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                "AWS_CONFIG_FILE": str(aws_config(work / "aws-config-10", 10)),
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    os.environ.update({k: v for k, v in base_env.items() if k.startswith("AWS_")})
    # (tool, its label, aws s3 settings file): awscli at its default 10 requests, and at ours.
    tools = [("launch.staging", "launch.staging", None),
             ("aws", "aws s3 sync", base_env["AWS_CONFIG_FILE"]),
             ("aws", f"aws s3 sync, max_concurrent_requests={concurrency}",
              str(aws_config(work / "aws-config-ours", concurrency)))]
    cases = [("small", ms) for ms in args.latency_ms] + [("large", 0.0)]
    proxies = []
    try:
        import boto3
        src = work / "src"
        make_tree(src, small=args.small, small_kb=args.small_kb, large=args.large, large_mb=args.large_mb)
        session = boto3.session.Session()
        session.client("s3").create_bucket(Bucket=BUCKET)
        # Uploaded with our tool, so every object carries the sha256 our copy verifies.
        s3sync.upload_tree(session, src, BUCKET, "data", concurrency=concurrency, progress=False)
        load_before = os.getloadavg()
        results = []
        for name, latency_ms in cases:
            n_files, n_bytes = tree_summary(src / name)
            if not n_files:
                continue
            url = endpoint
            if latency_ms:
                proxies.append(LatencyProxy(int(endpoint.rsplit(":", 1)[1]), latency_ms / 1000))
                url = proxies[-1].url
            runs = {label: [] for _, label, _ in tools}
            cpu = {label: [] for _, label, _ in tools}
            for r in range(args.runs):
                for tool, label, config in (tools if r % 2 == 0 else tools[::-1]):
                    dest = work / "efs" / f"{name}-{r}"
                    env = {**base_env, "AWS_ENDPOINT_URL": url, **({"AWS_CONFIG_FILE": config} if config else {})}
                    seconds, client_cpu, server_cpu = timed_copy(copy_command(tool, f"data/{name}", dest, concurrency),
                                                                 env, moto.pid)
                    cpu[label].append((client_cpu, server_cpu))
                    got = tree_summary(dest)
                    if got != (n_files, n_bytes):
                        raise SystemExit(f"{label} copied {got} (files, bytes), expected {(n_files, n_bytes)}")
                    shutil.rmtree(dest)
                    runs[label].append(round(seconds, 2))
                    print(f"{name}, {latency_ms:g} ms: {label}: {seconds:.2f} s "
                          f"({n_files / seconds:.0f} files/s, {n_bytes / MB / seconds:.1f} MiB/s)", flush=True)
            case = {"files": name, "count": n_files, "MiB": round(n_bytes / MB, 1),
                    "emulated_s3_latency_ms": latency_ms, "tools": {}}
            for label, times in runs.items():
                best = min(times)
                client_cpu, server_cpu = (min(c[i] for c in cpu[label]) for i in (0, 1))
                case["tools"][label] = {"runs_s": times, "files_per_s": round(n_files / best, 1),
                                        "MiB_per_s": round(n_bytes / MB / best, 1),
                                        "tool_cpu_ms_per_file": round(1000 * client_cpu / n_files, 2),
                                        "moto_cpu_ms_per_file": round(1000 * server_cpu / n_files, 2)}
            ours, theirs = case["tools"]["launch.staging"], case["tools"]["aws s3 sync"]
            case["launch.staging_vs_aws_s3_sync"] = round(ours["files_per_s"] / theirs["files_per_s"], 2)
            results.append(case)
        load_after = os.getloadavg()
    finally:
        for proxy in proxies:
            proxy.close()
        moto.terminate()
        moto.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)

    import awscli
    import boto3
    import moto as moto_pkg
    result = {
        "benchmark": "S3 -> EFS-like directory: maskrcnn data to-efs vs aws s3 sync, moto on 127.0.0.1",
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1_5_15_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15_after": [round(x, 2) for x in load_after]},
        "versions": {"python": platform.python_version(), "boto3": boto3.__version__, "awscli": awscli.__version__,
                     "moto": moto_pkg.__version__},
        "config": {"small_files": args.small, "small_kib_average": args.small_kb, "large_files": args.large,
                   "large_mib": args.large_mb, "runs": args.runs, "launch.staging_concurrency": concurrency,
                   "destination": "local disk, a fresh directory per run",
                   "figures": "best of the runs; each run is the CLI started afresh",
                   "latency": "added by a proxy in front of moto before each response's first byte"},
        "results": results,
        "goal": "launch.staging at least 2x the files/s of aws s3 sync (default settings) on the small files",
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
