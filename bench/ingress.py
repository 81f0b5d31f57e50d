#!/usr/bin/env python3
"""Ingress benchmark (issue 32), one run, on loopback only: the same nginx
backend (`return 200`) behind Portal's built-in layer-7 proxy (an Ingress
with a host rule, the backend as a selector-less Service's hand-written
EndpointSlice), behind nginx as a reverse proxy and behind HAProxy in
`mode http`, each with the same host routing and kept backend connections,
and directly. wrk (64 connections, 2 threads, a `Host` header) against each
in turn, several rounds, medians. Then: an Ingress change (a new path) to
the first request it serves, p50/p99.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/ingress.py [--seconds S] [--rounds R] [--samples K]
"""

import argparse
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from conftest import Portal  # noqa: E402
from support.waiting import wait_for  # noqa: E402

HOST = "a.example.test"

BACKEND_CONF = """worker_processes 1;
daemon off;
pid {dir}/backend.pid;
error_log {dir}/backend.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir};
  server {{ listen 127.0.0.1:{port} reuseport backlog=4096; location / {{ return 200 "ok\\n"; }} }}
}}
"""

# Two workers as Portal has two runtime threads here; kept upstream
# connections as Portal's pool.
NGINX_CONF = """worker_processes 2;
daemon off;
pid {dir}/proxy.pid;
error_log {dir}/proxy.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir};
  proxy_temp_path {dir};
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    server_name {host};
    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
  server {{ listen 127.0.0.1:{port} default_server; return 404; }}
}}
"""

HAPROXY_CONF = """global
  maxconn 8192
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend bench
  bind 127.0.0.1:{port}
  acl routed hdr(host) -i {host}
  use_backend web if routed
backend web
  server b1 127.0.0.1:{backend}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wrk(port, seconds, connections=64):
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-H", f"Host: {HOST}", f"http://127.0.0.1:{port}/"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise SystemExit(f"port {port}: {non2xx.group(1)} failed responses:\n{out}")
    latency = {}
    for pct, value, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        latency[pct] = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return {"rps": rps, "p50": latency["50"], "p99": latency["99"]}


def kubectl(portal, *args, stdin=None):
    return subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, check=True, timeout=60).stdout


def ingress(paths):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "bench", "namespace": "default"},
            "spec": {"ingressClassName": "portal", "rules": [{"host": HOST, "http": {"paths": [
                {"path": p, "pathType": "Prefix", "backend": {"service": {"name": "backend", "port": {"number": 80}}}}
                for p in paths]}}]}}


def status(port, path):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": HOST})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    processes = []
    with tempfile.TemporaryDirectory(prefix="portal-bench-ingress-") as tmp:
        work = pathlib.Path(tmp)
        ports = {name: free_port() for name in ("backend", "nginx", "haproxy", "portal")}
        (work / "backend.conf").write_text(BACKEND_CONF.format(dir=work, port=ports["backend"]))
        (work / "nginx.conf").write_text(NGINX_CONF.format(dir=work, port=ports["nginx"], backend=ports["backend"], host=HOST))
        (work / "haproxy.cfg").write_text(HAPROXY_CONF.format(port=ports["haproxy"], backend=ports["backend"], host=HOST))
        portal = Portal(work / "portal", ["--ingress-bind", f"127.0.0.1:{ports['portal']}", "--disable", "controllers,dns"])
        (work / "portal").mkdir()
        try:
            for argv in (["nginx", "-c", str(work / "backend.conf"), "-p", str(work)],
                         ["nginx", "-c", str(work / "nginx.conf"), "-p", str(work)],
                         ["haproxy", "-db", "-f", str(work / "haproxy.cfg")]):
                processes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            portal.start()
            kubectl(portal, "apply", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "backend", "namespace": "default"},
                 "spec": {"ports": [{"name": "http", "port": 80}]}}))
            kubectl(portal, "apply", "-f", "-", stdin=json.dumps(
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "backend-manual", "namespace": "default", "labels": {"kubernetes.io/service-name": "backend"}},
                 "addressType": "IPv4", "ports": [{"name": "http", "port": ports["backend"], "protocol": "TCP"}],
                 "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}))
            wait_for(lambda: "portal" in kubectl(portal, "get", "ingressclass", "-o", "name"), "the portal IngressClass")
            kubectl(portal, "apply", "-f", "-", stdin=json.dumps(ingress(["/"])))
            for name in ("backend", "nginx", "haproxy", "portal"):
                wait_for(lambda n=name: status(ports[n], "/") == 200, f"{name} to answer", timeout=60)

            runs = {name: [] for name in ("direct", "nginx", "haproxy", "portal")}
            for _ in range(args.rounds):
                for name, port in (("direct", ports["backend"]), ("nginx", ports["nginx"]),
                                   ("haproxy", ports["haproxy"]), ("portal", ports["portal"])):
                    runs[name].append(wrk(port, args.seconds))
            median = {name: {key: sorted(r[key] for r in rs)[len(rs) // 2] for key in ("rps", "p50", "p99")}
                      for name, rs in runs.items()}

            changes = []
            paths = ["/"]
            for i in range(args.samples):
                paths.append(f"/change-{i}")
                body = json.dumps(ingress(paths))
                before = time.monotonic()
                kubectl(portal, "apply", "-f", "-", stdin=body)
                # Every Prefix path routes; the new one 404s until it is in.
                # (The apply itself is part of the time: a client's view.)
                wait_for(lambda p=paths[-1]: status(ports["portal"], p) == 200, "the new path", timeout=30, interval=0.001)
                changes.append((time.monotonic() - before) * 1000)
        finally:
            portal.stop()
            for process in processes:
                process.kill()
                process.wait()

    p, n, h, d = median["portal"], median["nginx"], median["haproxy"], median["direct"]
    lines = [
        "| measure | Portal | nginx | HAProxy | direct | Portal vs nginx | Portal vs HAProxy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| requests/s, 64 connections | {p['rps']:.0f} | {n['rps']:.0f} | {h['rps']:.0f} | {d['rps']:.0f} | {p['rps'] / n['rps']:.2f}× | {p['rps'] / h['rps']:.2f}× |",
        f"| latency p50 | {p['p50']:.2f} ms | {n['p50']:.2f} ms | {h['p50']:.2f} ms | {d['p50']:.2f} ms | {n['p50'] / p['p50']:.2f}× faster | {h['p50'] / p['p50']:.2f}× faster |",
        f"| latency p99 | {p['p99']:.2f} ms | {n['p99']:.2f} ms | {h['p99']:.2f} ms | {d['p99']:.2f} ms | {n['p99'] / p['p99']:.2f}× faster | {h['p99'] / p['p99']:.2f}× faster |",
        f"| Ingress change → served (kubectl apply included), p50 / p99 | {percentile(changes, 50):.0f} / {percentile(changes, 99):.0f} ms | | | | | |",
        "",
        f"wrk -t2 -c64, {args.seconds} s × {args.rounds} rounds each (medians), one nginx backend (`return 200`), all on "
        f"loopback on this machine's 2 cores with wrk; {args.samples} Ingress changes.",
        "",
    ]
    table = "\n".join(lines)
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
