#!/usr/bin/env python
"""Load test of the shared retrieval server: C concurrent clients for T seconds against a real
``scripts/serve_retriever.py`` process on loopback, over the embedded corpus and queries.

    python scripts/bench_retriever.py                      # 32 clients, 20 s
    python scripts/bench_retriever.py --clients 64 --seconds 60 --queries-per-request 8

The server runs as it would in production: a subprocess with a bearer token and the default limits.
Each client keeps one keep-alive session (as ``HTTPRetriever`` does) and sends requests of a few
embedded queries each (``topk`` 3), back to back. The last stdout line is the parseable summary

    requests_per_s=… p50_ms=… p99_ms=… errors=… clients=… seconds=…

and the exit status is 1 if any request failed (non-200, timeout, connection error or a malformed
result). The clients share the machine with the server, so on a small machine the numbers are a
lower bound on what the server alone sustains.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402  (sets SCORE_LIGHTNING_CACHE and sys.path like the other benchmarks)

import numpy as np  # noqa: E402
import requests  # noqa: E402


@dataclass
class ClientStats:
    """What one client thread saw; merged after the run (no shared state while it runs)."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, token: str, log_path: Path, extra: list[str]) -> subprocess.Popen:
    """``serve_retriever.py`` on the cached corpus and index (built on first use, as the tests do)."""
    from score_lightning.data.corpus import default_corpus_path

    corpus = default_corpus_path(bc.CACHE / "corpus")
    argv = [sys.executable, str(bc.ROOT / "scripts" / "serve_retriever.py"), "--corpus", str(corpus),
            "--index-dir", str(bc.CACHE / "bm25"), "--host", "127.0.0.1", "--port", str(port), *extra]
    env = {**os.environ, "SCORE_RETRIEVER_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")  # noqa: SIM115 - kept open for the server's lifetime
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(bc.ROOT))


def wait_healthy(proc: subprocess.Popen, base: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(base + "/health", timeout=1).ok:
                return
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").splitlines()[-30:]
            sys.stderr.write("\n".join(tail) + "\n")
            raise SystemExit(f"retrieval server did not come up (rc={proc.poll()}); log: {log_path}")
        time.sleep(0.2)


def client(idx: int, url: str, token: str, pool: list[str], args: argparse.Namespace,
           start: threading.Barrier, stop_at: list[float], out: ClientStats) -> None:
    """Send requests back to back until the shared deadline; record latency or the error."""
    rng = random.Random(1000 + idx)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    start.wait()
    while time.monotonic() < stop_at[0]:
        queries = rng.sample(pool, args.queries_per_request)
        t0 = time.perf_counter()
        try:
            resp = session.post(url, json={"queries": queries, "topk": args.topk, "return_scores": True},
                                timeout=args.timeout_s)
            ok = resp.status_code == 200 and len(resp.json()["result"]) == len(queries)
            why = "" if ok else f"HTTP {resp.status_code}: {resp.text[:200]}"
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if ok:
            out.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        else:
            out.errors += 1
            out.first_error = out.first_error or why
    session.close()


def machine() -> str:
    """CPU count and model plus the load average at the start: other jobs share this machine."""
    model = "unknown CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"machine: {os.cpu_count()} CPUs ({model}); load average before the run: {load}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (threads)")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of the measured run")
    p.add_argument("--queries-per-request", type=int, default=4)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=10.0, help="per-request timeout (retriever.timeout_s default)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra serve_retriever.py argument, repeatable (e.g. --server-arg=--limit-concurrency=64)")
    args = p.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0:
        p.error("--clients must be >= 1 and --seconds > 0")

    from score_lightning.data.queries import load_queries

    pool = [q.prompt for q in load_queries(None)]
    if not 1 <= args.queries_per_request <= len(pool):
        p.error(f"--queries-per-request must be in 1..{len(pool)}")
    print(machine(), flush=True)
    token, port = secrets.token_urlsafe(24), free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"bench_retriever_{port}.log"
    proc = start_server(port, token, log_path, args.server_arg)
    try:
        wait_healthy(proc, base, log_path, timeout_s=300)
        stats = [ClientStats() for _ in range(args.clients)]
        start = threading.Barrier(args.clients + 1)
        stop_at = [float("inf")]
        threads = [threading.Thread(target=client, args=(i, base + "/retrieve", token, pool, args, start, stop_at, s),
                                    daemon=True) for i, s in enumerate(stats)]
        for t in threads:
            t.start()
        stop_at[0] = time.monotonic() + args.seconds  # set before the barrier releases the clients
        t0 = time.monotonic()
        start.wait()
        for t in threads:
            t.join(timeout=args.seconds + args.timeout_s + 30)
        elapsed = time.monotonic() - t0
        alive = proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    lat = np.array([x for s in stats for x in s.latencies_ms])
    errors = sum(s.errors for s in stats) + sum(t.is_alive() for t in threads) + (0 if alive else 1)
    p50, p99 = (np.percentile(lat, 50), np.percentile(lat, 99)) if lat.size else (float("nan"),) * 2
    first = next((s.first_error for s in stats if s.first_error), "")
    print(f"requests: {lat.size} ok, {errors} failed; {lat.size * args.queries_per_request / elapsed:.1f} queries/s "
          f"({args.queries_per_request} per request, topk {args.topk}); max {lat.max() if lat.size else 0:.1f} ms; "
          f"server log: {log_path}" + (f"; first error: {first}" if first else "") + ("" if alive else "; SERVER DIED"))
    print(f"requests_per_s={lat.size / elapsed:.1f} p50_ms={p50:.1f} p99_ms={p99:.1f} errors={errors} "
          f"clients={args.clients} seconds={args.seconds:g}", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
