#!/usr/bin/env python3
"""Service proxy benchmark (issue 6), one run, in network namespaces it
creates (tests/e2e/nodes.py: a node namespace with `portal server`, pods on
its bridge); nothing is routed or NATed in the machine's own namespace.

1. Userspace mode vs HAProxy (mode tcp) vs direct: wrk from a client pod to
   one nginx backend pod, through Portal's userspace listener (node port),
   through HAProxy on the node, and directly. Requests/s and p99.
2. Kernel mode: connection latency (wrk, a new connection per request)
   through a cluster IP vs direct, with 100 and with N Services programmed.
3. Programming latency at N Services / M endpoints: one endpoint changed in
   an EndpointSlice -> the rule in the kernel (seen by `nft monitor`), and
   the proxy's own network_programming_duration_seconds; full resync time
   and the proxy's RSS.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/proxy.py [--services N] [--endpoints M] [--seconds S] [--samples K]
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import kubernetes  # noqa: E402
from conftest import BINARY, Portal  # noqa: E402
from support.nodes import NODE_IP, Cluster, wait_for  # noqa: E402

NS = "bench"
# Processes to end however the run ends.
CLEANUP = []
BACKEND = "10.244.0.11"
CLIENT = "10.244.0.50"
HAPROXY_PORT = 18080
METRICS_PORT = 10249

NGINX_CONF = """worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir};
  server {{ listen 8080 reuseport backlog=4096; location / {{ return 200 "ok\\n"; }} }}
}}
"""

HAPROXY_CONF = """global
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend bench
  bind {node}:{port}
  default_backend web
backend web
  server b1 {backend}:8080
"""


def wrk(cluster, url, seconds, connections, threads=2, close=False):
    argv = ["ip", "netns", "exec", cluster.pods["client"][0], "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if close:
        argv += ["-H", "Connection: close"]
    out = subprocess.run(argv + [url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Socket errors: (.*)", out)
    latency = {}
    for pct, value, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        latency[pct] = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return {"rps": rps, "p50": latency.get("50"), "p99": latency.get("99"), "errors": errors.group(1) if errors else ""}


def connect_latency(cluster, host, port, rounds=5, count=3000):
    """Median over rounds of connect-time p50/p99 (ms) from the client pod."""
    runs = []
    for _ in range(rounds):
        argv = ["ip", "netns", "exec", cluster.pods["client"][0], "python3", str(ROOT / "tests" / "e2e" / "netns" / "connect_latency.py"), host, str(port), str(count)]
        result = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        if result["failures"]:
            raise SystemExit(f"connects to {host}:{port} failed: {result}")
        runs.append(result)
    median = lambda key: sorted(r[key] for r in runs)[len(runs) // 2]
    return {"p50": median("p50"), "p99": median("p99")}


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Api:
    """One API client per thread (the Python client's pool is per client)."""

    def __init__(self, kubeconfig):
        self.kubeconfig = kubeconfig
        self.local = threading.local()

    def core(self):
        if not hasattr(self.local, "core"):
            api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)
            self.local.core = kubernetes.client.CoreV1Api(api)
            self.local.discovery = kubernetes.client.DiscoveryV1Api(api)
        return self.local.core

    def discovery(self):
        self.core()
        return self.local.discovery


def endpoint_ip(n):
    """The n-th made-up endpoint address (never contacted)."""
    return f"10.{245 + n // 65536}.{(n // 256) % 256}.{n % 256}"


def slice_body(name, addresses, port=8080, trigger=None):
    meta = {"name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}}
    if trigger:
        meta["annotations"] = {"endpoints.kubernetes.io/last-change-trigger-time": trigger}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
    }


def make_service(api, name, addresses, port=8080, type_="ClusterIP"):
    """A Service without selector and its EndpointSlice (as a controller would write it)."""
    body = {"metadata": {"name": name}, "spec": {"type": type_, "ports": [{"name": "http", "port": 80, "targetPort": port}]}}
    service = api.core().create_namespaced_service(NS, body)
    api.discovery().create_namespaced_endpoint_slice(NS, slice_body(name, addresses, port))
    return service


def fill(api, first, last, per_service):
    def one(i):
        make_service(api, f"s{i}", [endpoint_ip(i * per_service + k) for k in range(per_service)])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(first, last)))


def programmed():
    out = subprocess.run(["nft", "list", "map", "ip", "portal", "cluster-ips"], capture_output=True, text=True).stdout
    return out.count(" : goto ")


def metrics_text():
    return urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()


def histogram_quantile(text, name, q):
    buckets = [(float(le), int(v)) for le, v in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\d+)', text, re.M) if le != "+Inf"]
    total = int(re.search(rf"^{name}_count (\d+)", text, re.M).group(1))
    for le, count in buckets:
        if total and count >= q * total:
            return le
    return float("inf")


def metric(text, name):
    match = re.search(rf"^{name} ([\d.e+-]+)", text, re.M)
    return float(match.group(1)) if match else float("nan")


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_proxy(kubeconfig, mode, log):
    process = subprocess.Popen(
        [BINARY, "proxy", "--kubeconfig", kubeconfig, "--mode", mode, "--node-ip", NODE_IP, "--metrics-bind", f"127.0.0.1:{METRICS_PORT}"],
        stdout=log,
        stderr=log,
        env={**os.environ, "RUST_LOG": os.environ.get("BENCH_PROXY_LOG", "warn")},
    )
    wait_for(lambda: _answers(), "the proxy's metrics", timeout=30)
    CLEANUP.append(process)
    return process


def _answers():
    try:
        metrics_text()
        return True
    except OSError:
        return False


def stop(process):
    process.terminate()
    process.wait(timeout=20)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=50_000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--only-userspace", action="store_true", help="only the userspace comparison (no table written)")
    args = parser.parse_args()
    per_service = max(1, args.endpoints // args.services)
    work = pathlib.Path(tempfile.mkdtemp(prefix="portal-bench-proxy-"))
    rows = []
    with Cluster() as cluster:
        cluster.add_pod("backend", BACKEND)
        cluster.add_pod("client", CLIENT)
        (work / "nginx.conf").write_text(NGINX_CONF.format(dir=work))
        nginx = subprocess.Popen(["ip", "netns", "exec", cluster.pods["backend"][0], "nginx", "-c", str(work / "nginx.conf"), "-p", str(work)])
        cluster.processes.append(nginx)
        (work / "data").mkdir()
        portal = Portal(work / "data", ["--disable", "controllers", "--node-ip", NODE_IP]).start()
        log = open(work / "proxy.log", "ab")
        try:
            api = Api(portal.kubeconfig)
            api.core().create_namespace({"metadata": {"name": NS}})
            wait_for(lambda: subprocess.run(["ip", "netns", "exec", cluster.pods["client"][0], "wrk", "-t1", "-c1", "-d1s", f"http://{BACKEND}:8080/"], capture_output=True).returncode == 0, "nginx")

            # 1. Userspace mode vs HAProxy vs direct.
            web = make_service(api, "web", [BACKEND], type_="NodePort")
            node_port = web.spec.ports[0].node_port
            proxy = start_proxy(portal.kubeconfig, "userspace", log)
            (work / "haproxy.cfg").write_text(HAPROXY_CONF.format(node=NODE_IP, port=HAPROXY_PORT, backend=BACKEND))
            haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(work / "haproxy.cfg")], stdout=subprocess.DEVNULL, stderr=log)
            cluster.processes.append(haproxy)
            for what, url in (("the userspace listener", f"http://{NODE_IP}:{node_port}/"), ("HAProxy", f"http://{NODE_IP}:{HAPROXY_PORT}/")):
                wait_for(lambda: subprocess.run(["ip", "netns", "exec", cluster.pods["client"][0], "wrk", "-t1", "-c1", "-d1s", url], capture_output=True).returncode == 0, what)
            load = {}
            for label, url, pid in (("direct", f"http://{BACKEND}:8080/", None), ("HAProxy", f"http://{NODE_IP}:{HAPROXY_PORT}/", haproxy.pid), ("Portal userspace", f"http://{NODE_IP}:{node_port}/", proxy.pid)):
                before = cpu_seconds(pid) if pid else 0.0
                perf = None
                if pid and os.environ.get("BENCH_PERF"):
                    # A CPU profile of the proxy under load (perf report -i PATH).
                    profiler = ["perf", "record", "-F", "999", "-g", "-o", f"{os.environ['BENCH_PERF']}.{pid}", "-p", str(pid), "--", "sleep", str(args.seconds)]
                    if os.environ.get("BENCH_STRACE"):
                        profiler = ["timeout", "-s", "INT", str(args.seconds), "strace", "-c", "-f", "-o", f"{os.environ['BENCH_PERF']}.{pid}.strace", "-p", str(pid)]
                    perf = subprocess.Popen(profiler, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                load[label] = wrk(cluster, url, args.seconds, connections=64)
                if perf:
                    perf.wait()
                if pid:
                    # Requests per CPU-second of the proxy: what it costs, on a machine whose two cores the load generator and the backend share.
                    load[label]["per_cpu"] = load[label]["rps"] * args.seconds / max(0.001, cpu_seconds(pid) - before)
                print(label, load[label], file=sys.stderr)
            haproxy.kill()
            stop(proxy)
            if args.only_userspace:
                return
            subprocess.run(["nft", "delete", "table", "ip", "portal"], check=False)
            ratio = load["Portal userspace"]["rps"] / load["HAProxy"]["rps"]
            rows.append(("Userspace: requests/s, wrk 2 threads 64 connections, keep-alive (Portal / HAProxy / direct)",
                         f"{load['Portal userspace']['rps']:,.0f} / {load['HAProxy']['rps']:,.0f} / {load['direct']['rps']:,.0f} (**{ratio:.2f}× HAProxy**)"))
            per_cpu = load["Portal userspace"]["per_cpu"] / load["HAProxy"]["per_cpu"]
            rows.append(("Userspace: requests per CPU-second of the proxy process (Portal / HAProxy)",
                         f"{load['Portal userspace']['per_cpu']:,.0f} / {load['HAProxy']['per_cpu']:,.0f} ({per_cpu:.2f}×)"))
            rows.append(("Userspace: p99 latency (Portal / HAProxy / direct)",
                         f"{load['Portal userspace']['p99']:.2f} / {load['HAProxy']['p99']:.2f} / {load['direct']['p99']:.2f} ms"))

            # 2. Kernel mode: latency with 100 Services, then with N.
            proxy = start_proxy(portal.kubeconfig, "nftables", log)
            fill(api, 0, 99, per_service)
            wait_for(lambda: programmed() >= 100, "100 Services programmed", timeout=60)
            time.sleep(5)  # let the fill's syncs settle
            vip = web.spec.cluster_ip
            latency = {100: connect_latency(cluster, vip, 80), "direct": connect_latency(cluster, BACKEND, 8080)}
            started = time.monotonic()
            fill(api, 99, args.services - 1, per_service)
            filled = time.monotonic() - started
            wait_for(lambda: programmed() >= args.services, f"{args.services} Services programmed", timeout=600)
            time.sleep(5)
            print(f"filled {args.services} Services in {filled:.0f} s", file=sys.stderr)
            latency[args.services] = connect_latency(cluster, vip, 80)
            latency["direct again"] = connect_latency(cluster, BACKEND, 8080)
            print(latency, file=sys.stderr)
            big, small = latency[args.services], latency[100]
            direct = min(latency["direct"]["p99"], latency["direct again"]["p99"])
            rows.append(("Kernel: TCP connect through the cluster IP p50 / p99, 100 Services", f"{small['p50']:.3f} / {small['p99']:.3f} ms"))
            rows.append((f"Kernel: TCP connect through the cluster IP p50 / p99, {args.services:,} Services",
                         f"{big['p50']:.3f} / {big['p99']:.3f} ms (**p99 {big['p99'] / small['p99']:.2f}× the 100-Service p99**)"))
            rows.append(("Kernel: TCP connect direct to the pod p50 / p99 (before / after the fill)",
                         f"{latency['direct']['p50']:.3f} / {latency['direct']['p99']:.3f} ms, {latency['direct again']['p50']:.3f} / {latency['direct again']['p99']:.3f} ms (**{args.services:,}-Service p99 {big['p99'] / direct:.2f}× direct**)"))

            # 3. Programming latency: one endpoint changed -> rule in the kernel.
            # Line-buffered: nft buffers its output when it goes to a pipe.
            monitor = subprocess.Popen(["stdbuf", "-oL", "nft", "monitor", "rules"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            cluster.processes.append(monitor)
            seen = queue.Queue()

            raw = []

            def watch():
                for line in monitor.stdout:
                    raw.append(line)
                    found = re.search(r"dnat to (10\.250\.\d+\.\d+):", line)
                    if found:
                        seen.put((found.group(1), time.monotonic()))

            threading.Thread(target=watch, daemon=True).start()
            # nft monitor reads the whole ruleset before it reports anything
            # (seconds at 10,000 Services): wait until it reports a probe.
            subprocess.run(["nft", "add", "table", "ip", "bench-probe"], check=True)
            subprocess.run(["nft", "add", "chain", "ip", "bench-probe", "c"], check=True)

            def probe():
                # Rarely: every change restarts the monitor's initial read.
                subprocess.run(["nft", "add", "rule", "ip", "bench-probe", "c", "counter"], check=True)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    if any("bench-probe" in line for line in raw):
                        return True
                    time.sleep(0.1)
                return False

            wait_for(probe, "nft monitor", timeout=300)
            subprocess.run(["nft", "delete", "table", "ip", "bench-probe"], check=True)
            outside = []
            text = metrics_text()
            partial_before = (metric(text, "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum"), metric(text, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count"))
            for k in range(args.samples):
                i = (k * 7919) % (args.services - 1)
                name = f"s{i}"
                new = f"10.250.{k // 256}.{k % 256}"
                addresses = [new] + [endpoint_ip(i * per_service + j) for j in range(1, per_service)]
                body = slice_body(name, addresses, trigger=datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"))
                current = api.discovery().read_namespaced_endpoint_slice(f"{name}-1", NS)
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                sent = time.monotonic()
                api.discovery().replace_namespaced_endpoint_slice(f"{name}-1", NS, body)
                while True:
                    try:
                        address, at = seen.get(timeout=30)
                    except queue.Empty:
                        chain = subprocess.run(["nft", "list", "chain", "ip", "portal", f"svc-{NS}/{name}/tcp/http"], capture_output=True, text=True)
                        raise SystemExit(f"{new} never reached the kernel; {name}'s chain: {chain.stdout}{chain.stderr}; monitor saw {raw[:5]}, exit {monitor.poll()}, {monitor.stderr.read() if monitor.poll() is not None else ''}")
                    if address == new:
                        outside.append(at - sent)
                        break
                # Past the min-sync-period (1 s), so each change is synced on its own.
                time.sleep(1.1)
            outside.sort()
            text = metrics_text()
            p = lambda q: outside[min(len(outside) - 1, int(q * len(outside)))] * 1000
            rows.append((f"Programming: endpoint change -> rule in the kernel (`nft monitor`), {args.services:,} Services / {args.services * per_service:,} endpoints, {len(outside)} samples, p50 / p99",
                         f"{p(0.5):.1f} / **{p(0.99):.1f} ms**"))
            rows.append(("Programming: `kubeproxy_network_programming_duration_seconds` p50 / p99 (bucket upper bounds)",
                         f"≤ {histogram_quantile(text, 'kubeproxy_network_programming_duration_seconds', 0.5) * 1000:.0f} / ≤ {histogram_quantile(text, 'kubeproxy_network_programming_duration_seconds', 0.99) * 1000:.0f} ms"))
            partial = (metric(text, "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum") - partial_before[0]) / max(1.0, metric(text, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count") - partial_before[1])
            rows.append(("Programming: partial sync during the samples, mean (`kubeproxy_sync_partial_proxy_rules_duration_seconds`)", f"{partial * 1000:.1f} ms"))
            # The monitor slows every commit down (the kernel reports each change to it).
            monitor.kill()
            monitor.wait()
            rows.append((f"`portal proxy` RSS at {args.services:,} Services (steady)", f"{rss_mib(proxy.pid):.0f} MiB"))

            # Full resync: a restarted proxy over the existing table.
            stop(proxy)
            started = time.monotonic()
            proxy = start_proxy(portal.kubeconfig, "nftables", log)
            wait_for(lambda: metric(metrics_text(), "kubeproxy_sync_full_proxy_rules_duration_seconds_count") >= 1, "the full resync", timeout=300)
            since_start = time.monotonic() - started
            full = metric(metrics_text(), "kubeproxy_sync_full_proxy_rules_duration_seconds_sum")
            rows.append((f"Full resync at {args.services:,} Services (one transaction) / restart to rules in place",
                         f"{full:.2f} s / {since_start:.2f} s"))
            rows.append(("`portal proxy` RSS right after the restart's full resync", f"{rss_mib(proxy.pid):.0f} MiB"))
            stop(proxy)
        finally:
            for process in CLEANUP:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            portal.stop()
            subprocess.run(["nft", "delete", "table", "ip", "portal"], check=False, capture_output=True)
    table = "| measure | result |\n| --- | --- |\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
