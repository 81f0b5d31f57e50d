#!/usr/bin/env python3
"""Scheduler benchmark (issue 27), one run, anchors side by side.

`portal server` on loopback (no proxy, no agent) with M API-only nodes
(Ready, labelled with a hostname and one of four zones, allocatable 8 CPU,
32 GiB, 110 pods); a ReplicationController of N pods; the time from its
create to every pod bound, watched. Three cases, each on a fresh server:
- floor: the template names its node (`nodeName`), so nothing is
  scheduled: what creating N pods costs without the scheduler;
- plain: pods behind a Service, spread by default over the Service's and
  the RC's pods;
- rules: the same with preferred pod anti-affinity by hostname and a
  zone topology spread constraint (ScheduleAnyway) on every pod.
Each run is short (under the node monitor's grace period, so the nodes
without a kubelet stay Ready).

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/scheduler.py [--pods 2000] [--nodes 20]
"""

import argparse
import os
import pathlib
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from kubernetes import client, watch  # noqa: E402

from conftest import Portal  # noqa: E402

NS = "default"


def make_nodes(core, count):
    for i in range(count):
        name = f"node-{i}"
        core.create_node({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "topology.kubernetes.io/zone": f"z{i % 4}"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
        })


class Bound:
    """Counts pods bound to a node, from a watch."""

    def __init__(self, core):
        self.names = set()
        self.lock = threading.Lock()
        self.watch = watch.Watch()
        threading.Thread(target=self.run, args=(core,), daemon=True).start()

    def run(self, core):
        try:
            for event in self.watch.stream(core.list_namespaced_pod, NS, timeout_seconds=600):
                pod = event["object"]
                if pod.spec.node_name:
                    with self.lock:
                        self.names.add(pod.metadata.name)
        except Exception:  # noqa: BLE001 - the watch ends with the server
            pass

    def count(self):
        with self.lock:
            return len(self.names)


def case(base, name, args):
    data = base / name
    data.mkdir()
    portal = Portal(data).start()
    try:
        core = portal.core()
        wait_for(lambda: core.list_namespace().items, "the API", 30)
        make_nodes(core, args.nodes)
        core.create_namespaced_service(NS, {"metadata": {"name": "app"},
                                            "spec": {"selector": {"app": "app"}, "ports": [{"port": 80}]}})
        spec = {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]}
        if name == "floor":
            spec["nodeName"] = "node-0"
        if name == "rules":
            spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "app"}},
                                                   "topologyKey": "kubernetes.io/hostname"}}]}}
            spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                                  "whenUnsatisfiable": "ScheduleAnyway",
                                                  "labelSelector": {"matchLabels": {"app": "app"}}}]
        bound = Bound(core)
        time.sleep(1)  # the watch established
        started = time.monotonic()
        core.create_namespaced_replication_controller(NS, {"metadata": {"name": "app"}, "spec": {
            "replicas": args.pods, "selector": {"app": "app"},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": spec}}})
        wait_for(lambda: bound.count() >= args.pods, f"{args.pods} pods bound ({name})", 120)
        elapsed = time.monotonic() - started
        per_node = {}
        if name != "floor":
            for pod in core.list_namespaced_pod(NS).items:
                per_node[pod.spec.node_name] = per_node.get(pod.spec.node_name, 0) + 1
        bound.watch.stop()
        return elapsed, per_node
    finally:
        portal.stop()


def wait_for(check, what, timeout):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=20)
    args = parser.parse_args()
    base = pathlib.Path(tempfile.mkdtemp(prefix="bench-scheduler-"))
    floor, _ = case(base, "floor", args)
    plain, plain_nodes = case(base, "plain", args)
    rules, rules_nodes = case(base, "rules", args)
    n = args.pods

    def spread(per_node):
        return f"{min(per_node.values())}–{max(per_node.values())} per node" if per_node else ""
    rows = [
        (f"{n} pods on {args.nodes} nodes, RC create → all bound", f"{plain:.2f} s ({n / plain:.0f} pods/s)",
         f"{floor:.2f} s (nodeName set, nothing scheduled)", f"{plain / floor:.2f}×", spread(plain_nodes)),
        ("same, with pod anti-affinity and zone spread on every pod", f"{rules:.2f} s ({n / rules:.0f} pods/s)",
         f"{floor:.2f} s", f"{rules / floor:.2f}×", spread(rules_nodes)),
    ]
    table = "| measure | scheduled | anchor (same run) | ratio | placement |\n| --- | ---: | ---: | ---: | --- |\n"
    table += "".join(f"| {a} | {b} | {c} | {d} | {e} |\n" for a, b, c, d, e in rows)
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
