#!/usr/bin/env python3
"""Several nodes (issue 17), one run, on the three-node bed of
tests/e2e/test_cluster.py (node namespaces on a LAN the bench makes):

- pod-to-pod TCP across nodes, a pod on node-1 to a pod on node-2:
  throughput (iperf3, one stream) and round-trip latency (1-byte
  request/response on one connection, p50/p99), with host-gw routes and
  with the VXLAN overlay, against the floor: two namespaces joined by a
  direct veth;
- losing a node: kill -9 of node-2's `portal node` and its link cut, to
  the Service (6 pods, 2 per node) serving only live endpoints, as a
  client on node-3 sees it (requests every 50 ms, 250 ms timeout), over
  several runs, with a 4 s node-monitor grace period.

The tools run in the pods' own network namespaces (`ip netns exec
portal-<tag>-<uid>`), so the path is the pods': veth, node, route or
overlay, node, veth. Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/cluster.py [--seconds 5] [--pings 5000] [--losses 5]
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from common import percentile, pod_netns  # noqa: E402
from support.nodes import sh  # noqa: E402
from support.cluster_bed import NAMES, Bed  # noqa: E402
from support.agent_bed import NS  # noqa: E402
from support.waiting import wait_for  # noqa: E402
from test_cluster import web_rc  # noqa: E402

PING = """
import socket, sys, time, json
mode, host, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7000)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
else:
    c = socket.create_connection((host, 7000)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(count):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); times.append(time.perf_counter() - t)
    print(json.dumps(times))
"""


def measure(server_ns, client_ns, server_ip, seconds, pings):
    """(Gbit/s, RTT p50 µs, RTT p99 µs) from client_ns to server_ns."""
    server = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5201"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ip", "netns", "exec", client_ns, "iperf3", "-c", server_ip, "-p", "5201", "-t", str(seconds), "-J"],
                             capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
        gbits = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        server.kill()
        server.wait()
    pong = subprocess.Popen(["ip", "netns", "exec", server_ns, "python3", "-c", PING, "serve", "-", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        pong.stdout.readline()
        out = subprocess.run(["ip", "netns", "exec", client_ns, "python3", "-c", PING, "ping", server_ip, str(pings)],
                             capture_output=True, text=True, check=True, timeout=120).stdout
        rtts = [t * 1e6 for t in json.loads(out)]
    finally:
        pong.kill()
        pong.wait()
    return gbits, percentile(rtts, 50), percentile(rtts, 99)


def floor(seconds, pings):
    """Two namespaces joined by one veth: nothing between them."""
    tag = f"pb{os.getpid()}"
    a, b = f"{tag}-a", f"{tag}-b"
    try:
        for ns in (a, b):
            sh("ip", "netns", "add", ns)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
        for ns, ip in ((a, "10.99.0.1"), (b, "10.99.0.2")):
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/30", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        return measure(b, a, "10.99.0.2", seconds, pings)
    finally:
        for ns in (a, b):
            sh("ip", "netns", "del", ns, check=False)


def across_nodes(tmp, extra, seconds, pings):
    with Bed(tmp, extra=extra) as bed:
        core = bed.core
        try:
            for i in (1, 2):
                core.create_namespaced_pod(NS, {"metadata": {"name": f"p{i}"}, "spec": {
                    "nodeName": NAMES[i], "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "p", "image": bed.image}]}})
            pods = {i: wait_for(lambda i=i: (p := core.read_namespaced_pod(f"p{i}", NS)).status.phase == "Running" and p, f"p{i}", 90) for i in (1, 2)}
            return measure(pod_netns(bed, pods[1], 1), pod_netns(bed, pods[2], 2), pods[1].status.pod_ip, seconds, pings)
        finally:
            core.delete_collection_namespaced_pod(NS)
            wait_for(lambda: not core.list_namespaced_pod(NS).items, "pods gone", 60)


PROBE = """
import json, sys, time, urllib.request
url, seconds = sys.argv[1], float(sys.argv[2])
start = time.monotonic(); out = []
print("go", flush=True)
while time.monotonic() - start < seconds:
    t = time.monotonic()
    try:
        urllib.request.urlopen(url, timeout=0.25).read(); out.append((t, True))
    except Exception:
        out.append((t, False))
    time.sleep(0.05)
print(json.dumps(out))
"""


def node_losses(tmp, runs):
    """Seconds from losing node-2 to the last failed request, per run."""
    results = []
    with Bed(tmp) as bed:
        core = bed.core
        rc = web_rc(bed)
        # Long tolerations: the lost node's pods stay (and come back with it).
        for t in rc["spec"]["template"]["spec"]["tolerations"]:
            t["tolerationSeconds"] = 3600
        core.create_namespaced_replication_controller(NS, rc)
        core.create_namespaced_service(NS, {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        try:
            wait_for(lambda: bed.running("app=web", 6), "6 web pods", 120)
            cluster_ip = core.read_namespaced_service("web", NS).spec.cluster_ip
            for _ in range(runs):
                wait_for(lambda: bed.ready("node-2") and len([e for s in core.list_namespaced_endpoints(NS, field_selector="metadata.name=web").items
                                                              for s in s.subsets or [] for e in s.addresses or []]) == 6, "6 ready endpoints", 90)
                time.sleep(2)  # every node's proxy has them
                probe = subprocess.Popen(["ip", "netns", "exec", bed.lan.netns(3), "python3", "-c", PROBE, f"http://{cluster_ip}/name.txt", "15"],
                                         stdout=subprocess.PIPE, text=True)
                probe.stdout.readline()
                time.sleep(1)
                lost = time.monotonic()
                bed.workers[2].kill()
                bed.lan.cut(2)
                samples = json.loads(probe.communicate(timeout=60)[0])
                failures = [t for t, ok in samples if not ok]
                results.append(max(failures) - lost if failures else float("nan"))
                bed.workers[2].wait()
                bed.lan.mend(2)
                bed.start_worker(2)
        finally:
            core.delete_namespaced_replication_controller("web", NS)
            core.delete_collection_namespaced_pod(NS)
            wait_for(lambda: not core.list_namespaced_pod(NS).items, "pods gone", 90)
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--pings", type=int, default=5000)
    parser.add_argument("--losses", type=int, default=5)
    args = parser.parse_args()
    rows = [("direct veth between two namespaces (floor)", floor(args.seconds, args.pings))]
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("host-gw", []), ("VXLAN", ["--pod-network", "vxlan"])):
            work = pathlib.Path(tmp) / name
            work.mkdir()
            rows.append((f"pod to pod across nodes, {name}", across_nodes(work, extra, args.seconds, args.pings)))
        work = pathlib.Path(tmp) / "loss"
        work.mkdir()
        losses = node_losses(work, args.losses)
    base = rows[0][1]
    lines = [
        "| path | TCP throughput | × floor | RTT p50 | RTT p99 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, (gbits, p50, p99) in rows:
        lines.append(f"| {name} | {gbits:.2f} Gbit/s | {gbits / base[0]:.2f} | {p50:.0f} µs | {p99:.0f} µs |")
    lines.append("")
    lines.append("| losing a node (grace 4 s) | p50 | min | max | runs |")
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    lines.append(f"| kill -9 + link cut → Service serves only live endpoints (client on another node) | {statistics.median(losses):.1f} s | {min(losses):.1f} s | {max(losses):.1f} s | {len(losses)} |")
    table = "\n".join(lines) + "\n"
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
