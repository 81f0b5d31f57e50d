#!/usr/bin/env python3
"""NetworkPolicy (issue 31), one run, on two nodes of a LAN the bench
makes (the bed of tests/e2e/support/cluster_bed.py):

- new-connection rate from a pod on node-2 to a pod on node-1 (connect,
  one byte each way, close; one client), with no NetworkPolicy, and with
  1,000 NetworkPolicies that all select the server pod (each admitting a
  /32 of TEST-NET space, the last one admitting the client's namespace):
  the worst case for the node's rules, which judge every new connection;
- policy change → enforced: from `kubectl apply` of a deny-all policy
  returning to the first refused new connection, and from its deletion to
  the first accepted one (a client on node-2 tries every 20 ms with a
  100 ms timeout), over several rounds.

The tools run in the pods' own network namespaces (`ip netns exec
portal-<tag>-<uid>`). Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/network_policy.py [--connections 3000] [--policies 1000] [--rounds 20]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import kubernetes
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from support.cluster_bed import NAMES, Bed  # noqa: E402
from support.waiting import wait_for  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from common import percentile, pod_netns  # noqa: E402

SERVE = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen(512); print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.recv(1); c.sendall(b"y")
    except OSError:
        pass
    c.close()
"""

CONNECT = """
import json, socket, sys, time
host, count = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
for _ in range(count):
    c = socket.create_connection((host, 7000), timeout=5)
    c.sendall(b"x"); c.recv(1); c.close()
print(json.dumps(count / (time.perf_counter() - start)))
"""

# Tries a connection every 20 ms until it is (or is not) accepted: prints
# when the first attempt with the wanted answer began (a dropped attempt
# is known only after its 100 ms timeout; the rules were in place when it
# began).
FLIP = """
import socket, sys, time
host, want = sys.argv[1], sys.argv[2] == "open"
print("go", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    began = time.monotonic()
    try:
        c = socket.create_connection((host, 7000), timeout=0.1); c.close(); ok = True
    except OSError:
        ok = False
    if ok == want:
        print(began, flush=True); break
    time.sleep(0.02)
"""


def kubectl_apply(bed, tmp, objects):
    path = tmp / f"apply-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    bed.kubectl("apply", "-f", str(path))


def policies(count):
    """`count` policies selecting the server; the last admits namespace b."""
    out = []
    for i in range(count - 1):
        out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": f"p{i:04d}", "namespace": "a"},
                    "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                             "ingress": [{"from": [{"ipBlock": {"cidr": f"198.51.{i // 250}.{i % 250}/32"}}],
                                          "ports": [{"port": 7000}]}]}})
    out.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "zz-from-b", "namespace": "a"},
                "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                         "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]}]}})
    return out


def rate(client_ns, server_ip, connections):
    out = subprocess.run(["ip", "netns", "exec", client_ns, "python3", "-c", CONNECT, server_ip, str(connections)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out)


def flip(bed, tmp, client_ns, server_ip, change, want):
    """Seconds from `change()` returning to the client seeing `want`."""
    prober = subprocess.Popen(["ip", "netns", "exec", client_ns, "python3", "-c", FLIP, server_ip, want],
                              stdout=subprocess.PIPE, text=True)
    try:
        prober.stdout.readline()
        change()
        changed = time.monotonic()
        seen = prober.stdout.readline().strip()
        if not seen:
            raise AssertionError(f"the client never saw the connection {want}")
        return float(seen) - changed
    finally:
        prober.kill()
        prober.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="portal-bench-netpol-") as d, Bed(pathlib.Path(d), count=2) as bed:
        tmp = pathlib.Path(d)
        core = bed.core
        bed.kubectl("create", "namespace", "a")
        bed.kubectl("create", "namespace", "b")
        try:
            for ns, name, node, labels in (("a", "server", 1, {"app": "server"}), ("b", "client", 2, {"app": "client"})):
                core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels}, "spec": {
                    "nodeName": NAMES[node], "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": bed.image, "command": ["sleep", "3600"]}]}})
            server = wait_for(lambda: (p := core.read_namespaced_pod("server", "a")).status.phase == "Running" and p, "server", 90)
            client = wait_for(lambda: (p := core.read_namespaced_pod("client", "b")).status.phase == "Running" and p, "client", 90)
            server_ns, client_ns, server_ip = pod_netns(bed, server, 1), pod_netns(bed, client, 2), server.status.pod_ip
            listener = subprocess.Popen(["ip", "netns", "exec", server_ns, "python3", "-c", SERVE], stdout=subprocess.PIPE, text=True)
            try:
                listener.stdout.readline()
                rate(client_ns, server_ip, 200)  # warm up (ARP, routes, conntrack)
                none = rate(client_ns, server_ip, args.connections)
                kubectl_apply(bed, tmp, policies(args.policies))
                wait_for(lambda: bed.lan.run(1, "nft", "list", "table", "ip", "portal_policy").stdout.count("a/p") >= args.policies - 1,
                         f"node-1's table with {args.policies} policies", timeout=120)
                rate(client_ns, server_ip, 200)
                many = rate(client_ns, server_ip, args.connections)
                # One request (kubectl deletes them one by one).
                kubernetes.client.NetworkingV1Api(bed.portal.api_client()).delete_collection_namespaced_network_policy("a")
                wait_for(lambda: "jump" not in bed.lan.run(1, "nft", "list", "table", "ip", "portal_policy").stdout, "policies gone")

                deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny", "namespace": "a"},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
                closing, opening = [], []
                for _ in range(args.rounds):
                    # Rounds apart, so each change is one after a quiet
                    # spell (a burst is batched: MIN_INTERVAL in the agent).
                    time.sleep(0.5)
                    closing.append(flip(bed, tmp, client_ns, server_ip, lambda: kubectl_apply(bed, tmp, [deny]), "closed"))
                    time.sleep(0.5)
                    opening.append(flip(bed, tmp, client_ns, server_ip,
                                        lambda: bed.kubectl("delete", "networkpolicy", "-n", "a", "deny"), "open"))
            finally:
                listener.kill()
                listener.wait()
        finally:
            bed.kubectl("delete", "namespace", "a", "b", "--wait=true", "--timeout=90s", check=False)
    ms = lambda s: f"{s * 1000:.0f} ms"
    table = (
        "| measure | no policy | with policies | ratio |\n| --- | --- | --- | --- |\n"
        f"| new connections/s, pod → pod across nodes, {args.policies} policies selecting the server | {none:.0f} | {many:.0f} | {many / none:.2f}× |\n"
        "\n| policy change → enforced (client's view: the start of the first attempt that saw it; attempts every 20 ms) | p50 | p99 |\n| --- | --- | --- |\n"
        f"| deny-all created → new connections dropped ({args.rounds} rounds) | {ms(percentile(closing, 50))} | {ms(percentile(closing, 99))} |\n"
        f"| deny-all deleted → new connections accepted ({args.rounds} rounds) | {ms(percentile(opening, 50))} | {ms(percentile(opening, 99))} |\n"
    )
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
