"""Which HTTP server library to build elmo_tf.serve on: uvicorn (bare ASGI app) vs aiohttp, on a JSON echo.

    python benchmarks/serve_http_libs.py [--seconds=3] [--idle=5000]

Each library serves the same trivial handler in a child process: parse a predict-sized JSON request, answer
a ~8 KB JSON body (about a 1-sentence `default` response of the tiny test model). Measured: requests/s and
p50/p99 with 8 and 64 keep-alive clients, then 1 client while `--idle` extra connections are held open
(latency and the server's resident memory). Prints a table and writes benchmarks/results/serve_http_libs.json.
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import print_table, save  # noqa: E402
from benchmarks.serve_clients import Request, latency_ms, rss_mb, run_clients  # noqa: E402

RESPONSE = json.dumps({"predictions": [[round(0.001 * i, 6) for i in range(1000)]]})

UVICORN_APP = f"""
import json, sys, uvicorn
BODY = {RESPONSE!r}.encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    json.loads(body)
    await send({{"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]}})
    await send({{"type": "http.response.body", "body": BODY}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, backlog=8192)
"""

AIOHTTP_APP = f"""
import json, sys
from aiohttp import web
BODY = {RESPONSE!r}.encode()
async def handle(request):
    json.loads(await request.read())
    return web.Response(body=BODY, content_type="application/json")
app = web.Application()
app.router.add_route("*", "/{{tail:.*}}", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, backlog=8192)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(library: str, code: str, seconds: float, idle: int) -> list[dict]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"instances": ["The cat sat on the mat ."]}).encode()

        def request(client: int, k: int) -> Request:
            return Request("echo", body)

        run_clients(port, 2, 1.0, request)  # warm-up
        rows = []
        for clients in (8, 64):
            results, wall = run_clients(port, clients, seconds, request)
            rows.append({"library": library, "case": f"{clients} clients", "requests_per_s": len(results) / wall,
                         "errors": sum(not r.as_expected for r in results), **latency_ms(results),
                         "server_rss_mb": rss_mb(proc.pid)})
        base_rss = rss_mb(proc.pid)
        results, wall = run_clients(port, 1, seconds, request)
        rows.append({"library": library, "case": "1 client", "requests_per_s": len(results) / wall,
                     "errors": sum(not r.as_expected for r in results), **latency_ms(results), "server_rss_mb": base_rss})
        held = []
        for _ in range(idle):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        time.sleep(1.0)
        results, wall = run_clients(port, 1, seconds, request)
        rows.append({"library": library, "case": f"1 client + {idle} idle", "requests_per_s": len(results) / wall,
                     "errors": sum(not r.as_expected for r in results), **latency_ms(results),
                     "server_rss_mb": rss_mb(proc.pid)})
        for s in held:
            s.close()
        return rows
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--idle", type=int, default=5000)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, a.idle + 1024)), hard))  # children inherit it
    rows = measure("uvicorn", UVICORN_APP, a.seconds, a.idle) + measure("aiohttp", AIOHTTP_APP, a.seconds, a.idle)
    print(f"load average: {os.getloadavg()}")
    print_table(rows, ["library", "case", "requests_per_s", "p50_ms", "p99_ms", "errors", "server_rss_mb"])
    print("saved", save("serve_http_libs", {"seconds": a.seconds, "idle": a.idle, "rows": rows}))


if __name__ == "__main__":
    main()
