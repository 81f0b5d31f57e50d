#!/usr/bin/env python3
"""Dual-stack data path (issue 31), one run, on two nodes of a LAN with
IPv4 and IPv6 the bench makes (the bed of tests/e2e/support/cluster_bed.py,
dual-stack pod and service ranges): new connections per second (connect,
one byte each way, close; one client) and the p99 of one such exchange,
from a pod on node-2 to a pod on
node-1, over IPv4 and IPv6, directly and through a RequireDualStack
Service's two cluster IPs, with host-gw routes and over the VXLAN overlay
(IPv6 inside the IPv4 underlay). The IPv4 paths are the anchors: the same
run, the same pods, only the family differs.

The tools run in the pods' own network namespaces (`ip netns exec
portal-<tag>-<uid>`). Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/dual_stack.py [--connections 3000] [--rounds 3] [--pod-network host-gw,vxlan]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from common import percentile, pod_netns  # noqa: E402
from support.cluster_bed import NAMES, Bed  # noqa: E402
from support.waiting import wait_for  # noqa: E402

DUAL = ["--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56",
        "--service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112"]

# One socket for both families (IPV6_V6ONLY off, Linux's default).
SERVE = """
import socket
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", 7000)); s.listen(512); print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.recv(1); c.sendall(b"y")
    except OSError:
        pass
    c.close()
"""

# Each exchange timed: connect, a byte each way (the answer), close.
CONNECT = """
import json, socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
start = time.perf_counter()
for _ in range(count):
    t = time.perf_counter()
    c = socket.create_connection((host, port), timeout=5)
    c.sendall(b"x"); c.recv(1); c.close()
    times.append(time.perf_counter() - t)
print(json.dumps({"rate": count / (time.perf_counter() - start), "times": times}))
"""


def exchanges(client_ns, host, port, connections):
    """{"rate": per second, "times": [seconds per exchange]}."""
    out = subprocess.run(["ip", "netns", "exec", client_ns, "python3", "-c", CONNECT, host, str(port), str(connections)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out)


def measure(network, args):
    """{(path, family): [rates]} on a fresh two-node bed with `network`."""
    with tempfile.TemporaryDirectory(prefix="portal-bench-dual-") as d, \
            Bed(pathlib.Path(d), count=2, ipv6=True, server_extra=DUAL, extra=["--pod-network", network]) as bed:
        core = bed.core
        for name, node, labels in (("server", 1, {"app": "server"}), ("client", 2, {"app": "client"})):
            core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": labels}, "spec": {
                "nodeName": NAMES[node], "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": bed.image, "command": ["sleep", "3600"]}]}})
        core.create_namespaced_service("default", {"metadata": {"name": "server"}, "spec": {
            "ipFamilyPolicy": "RequireDualStack", "selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 7000}]}})
        server = wait_for(lambda: (p := core.read_namespaced_pod("server", "default")).status.phase == "Running" and p, "server", 90)
        client = wait_for(lambda: (p := core.read_namespaced_pod("client", "default")).status.phase == "Running" and p, "client", 90)
        server_v4, server_v6 = [ip.ip for ip in server.status.pod_ips]
        cluster_v4, cluster_v6 = core.read_namespaced_service("server", "default").spec.cluster_ips
        server_ns, client_ns = pod_netns(bed, server, 1), pod_netns(bed, client, 2)
        listener = subprocess.Popen(["ip", "netns", "exec", server_ns, "python3", "-c", SERVE], stdout=subprocess.PIPE, text=True)
        try:
            listener.stdout.readline()
            paths = [("pod → pod", server_v4, server_v6, 7000), ("pod → cluster IP", cluster_v4, cluster_v6, 80)]
            # The Service's rules are in once a connection through each
            # cluster IP is answered; then a warm-up (neighbours, conntrack).
            for _, v4, v6, port in paths:
                for host in (v4, v6):
                    wait_for(lambda host=host, port=port: subprocess.run(
                        ["ip", "netns", "exec", client_ns, "python3", "-c", CONNECT, host, str(port), "1"],
                        capture_output=True, timeout=30).returncode == 0, f"{host} answering", timeout=60)
                    exchanges(client_ns, host, port, 200)
            # Families alternate within each round: drift hits both alike.
            results = {}
            for _ in range(args.rounds):
                for label, v4, v6, port in paths:
                    for family, host in (("IPv4", v4), ("IPv6", v6)):
                        results.setdefault((label, family), []).append(exchanges(client_ns, host, port, args.connections))
            return results
        finally:
            listener.kill()
            listener.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pod-network", default="host-gw,vxlan")
    args = parser.parse_args()
    lines = ["| across nodes | connections/s IPv4 (anchor) | IPv6 | IPv6 / IPv4 "
             "| exchange p99 IPv4 (anchor) | IPv6 | IPv6 / IPv4 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for network in args.pod_network.split(","):
        results = measure(network, args)
        for label in ("pod → pod", "pod → cluster IP"):
            # Rate: best of rounds; p99: over every exchange of all rounds.
            rate = {f: max(r["rate"] for r in results[(label, f)]) for f in ("IPv4", "IPv6")}
            p99 = {f: 1000 * percentile([t for r in results[(label, f)] for t in r["times"]], 99) for f in ("IPv4", "IPv6")}
            lines.append(f"| {label}, {network} | {rate['IPv4']:.0f} | {rate['IPv6']:.0f} | {rate['IPv6'] / rate['IPv4']:.2f}× "
                         f"| {p99['IPv4']:.2f} ms | {p99['IPv6']:.2f} ms | {p99['IPv6'] / p99['IPv4']:.2f}× |")
    table = "\n".join(lines) + "\n"
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
