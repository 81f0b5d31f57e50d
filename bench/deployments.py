#!/usr/bin/env python3
"""Deployment benchmark (issue 27), one run, anchors side by side.

On a real node (a test-made node network namespace, a registry on its
loopback, `portal server` with the proxy and agent, the controllers as
their own `portal controllers` process):
- scale 0 → N: a Deployment against a ReplicationController of the same
  pods (today's RC path), scale request → every pod Ready (watch);
- a rolling update of N replicas to a new image with Kubernetes' defaults
  (25 % surge, 25 % unavailable), readiness probes and a short preStop,
  behind a Service under continuous client load through the kernel proxy:
  time from `set image` to the rollout complete, and failed requests.
Without a node: the controllers' memory with D Deployments of R replicas
(D × R pods, all Pending) against the same pods from D RCs.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/deployments.py [--replicas 100] [--deployments 1000] [--per 10]
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from kubernetes import client  # noqa: E402

from agent import ReadyWatch, rss_mib  # noqa: E402
from conftest import BINARY, Portal  # noqa: E402
from support import agent_bed, nodes, registry  # noqa: E402

NS = "default"


def template(app, image):
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "web",
                "image": image,
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1},
                "lifecycle": {"preStop": {"exec": {"command": ["sleep", "2"]}}},
            }],
        },
    }


def deployment(name, image, replicas, labels=None):
    body = template(name, image)
    if labels:
        body["metadata"]["labels"] = labels
    return {
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": body["metadata"]["labels"]}, "template": body},
    }


def wait(check, what, timeout):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def pod_names(core, selector):
    return [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=selector).items if p.metadata.deletion_timestamp is None]


def scaled_up(core, watch, selector, scale, count):
    """Seconds from the scale request to the last of `count` pods Ready."""
    began = time.monotonic()
    scale(count)
    names = wait(lambda: (n := pod_names(core, selector)) and len(n) >= count and n, f"{count} pods", 120)
    return max(watch.wait(names, timeout=600)) - began


def scaled_down(core, scale, selector):
    scale(0)
    wait(lambda: not core.list_namespaced_pod(NS, label_selector=selector).items, "the pods to go", 300)


class Load:
    """Sequential requests on a few threads until stopped; counts failures."""

    def __init__(self, url, threads=4):
        self.url = url
        self.ok = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self):
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    response.read()
                with self.lock:
                    self.ok += 1
            except Exception:  # noqa: BLE001 - every failure counts
                with self.lock:
                    self.failed += 1

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def rolled_out(apps, name, image):
    d = apps.read_namespaced_deployment(name, NS)
    s = d.status
    return (
        (s.observed_generation or 0) >= d.metadata.generation
        and d.spec.template.spec.containers[0].image == image
        and (s.updated_replicas or 0) == d.spec.replicas
        and (s.replicas or 0) == d.spec.replicas
        and (s.available_replicas or 0) == d.spec.replicas
    )


def on_a_node(args, data):
    """Scale 0 → N (Deployment and RC) and a rolling update under load."""
    controllers = None
    with nodes.Cluster(bridge=False), registry.Registry() as reg:
        images = {}
        for tag in ("1", "2"):
            script = b"#!/bin/sh\nhostname > /var/www/name.txt\nexec httpd -f -p 8080 -h /var/www\n"
            registry.push_busybox(reg, "web", tag, cmd=["/bin/serve"], files={"bin/serve": script})
            images[tag] = f"{reg.host}/web:{tag}"
        portal = Portal(data, ["--node-ip", nodes.NODE_IP, "--node-name", "bench-node", "--proxy-mode", "nftables",
                               "--disable", "controllers"], proxy=True, agent=True).start()
        try:
            controllers = subprocess.Popen([BINARY, "controllers", "--kubeconfig", portal.kubeconfig],
                                           stdout=subprocess.DEVNULL, stderr=open(data / "controllers.log", "wb"))
            core = portal.core()
            apps = client.AppsV1Api(portal.api_client())
            wait(lambda: (n := core.list_node().items) and n[0].spec.pod_cidr, "the node", 60)
            watch = ReadyWatch(portal.kubeconfig)
            # Warm up: the images are pulled once.
            apps.create_namespaced_deployment(NS, deployment("warm", images["1"], 1))
            watch.wait(wait(lambda: pod_names(core, "app=warm"), "warm-up pod", 60), timeout=120)
            apps.patch_namespaced_deployment("warm", NS, {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": images["2"]}]}}}})
            wait(lambda: rolled_out(apps, "warm", images["2"]), "warm-up rollout", 120)
            apps.delete_namespaced_deployment("warm", NS)
            wait(lambda: not core.list_namespaced_pod(NS, label_selector="app=warm").items, "warm-up gone", 120)

            rc = {"metadata": {"name": "rc"}, "spec": {"replicas": 0, "selector": {"app": "rc"}, "template": template("rc", images["1"])}}
            core.create_namespaced_replication_controller(NS, rc)
            apps.create_namespaced_deployment(NS, deployment("deploy", images["1"], 0))
            scale_rc = lambda n: core.patch_namespaced_replication_controller_scale("rc", NS, {"spec": {"replicas": n}})
            scale_deploy = lambda n: apps.patch_namespaced_deployment_scale("deploy", NS, {"spec": {"replicas": n}})
            # Two rounds in opposite orders, the node clean before each run
            # (a run right after another's teardown is slower); the mean.
            agent_dir = data / "agent"
            tag = agent_bed.agent_tag(agent_dir, "bench-node")
            scales = {"rc": scale_rc, "deploy": scale_deploy}
            runs = {"rc": [], "deploy": []}
            for kind in ("rc", "deploy", "deploy", "rc"):
                wait(lambda: not any(agent_bed.leftovers(agent_dir, tag).values()), "the node clean", 300)
                runs[kind].append(scaled_up(core, watch, f"app={kind}", scales[kind], args.replicas))
                scaled_down(core, scales[kind], f"app={kind}")
            rc_up = sum(runs["rc"]) / len(runs["rc"])
            deploy_up = sum(runs["deploy"]) / len(runs["deploy"])
            wait(lambda: not any(agent_bed.leftovers(agent_dir, tag).values()), "the node clean", 300)
            scaled_up(core, watch, "app=deploy", scale_deploy, args.replicas)

            # The rolling update: the scaled-up Deployment behind a Service.
            core.create_namespaced_service(NS, {"metadata": {"name": "deploy"}, "spec": {"selector": {"app": "deploy"}, "ports": [{"port": 80, "targetPort": 8080}]}})
            ip = core.read_namespaced_service("deploy", NS).spec.cluster_ip
            wait(lambda: agent_bed.programmed(ip), "the Service programmed", 60)
            wait(lambda: rolled_out(apps, "deploy", images["1"]), "the scale-up complete", 120)
            with Load(f"http://{ip}/name.txt") as load:
                wait(lambda: load.ok > 20, "the load to run", 30)
                began = time.monotonic()
                apps.patch_namespaced_deployment("deploy", NS, {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": images["2"]}]}}}})
                wait(lambda: rolled_out(apps, "deploy", images["2"]), "the rollout", 900)
                rollout = time.monotonic() - began
                time.sleep(1)
            scaled_down(core, scale_deploy, "app=deploy")
            watch.close()
        finally:
            if controllers:
                controllers.terminate()
                controllers.wait(timeout=60)
            portal.stop()
            agent_dir = data / "agent"
            agent_bed.cleanup(agent_dir, agent_bed.agent_tag(agent_dir, "bench-node"))
    return rc_up, deploy_up, rollout, load


def controllers_memory(args, data, kind):
    """RSS of `portal controllers` once `kind` objects keep every pod."""
    portal = Portal(data, ["--disable", "controllers"]).start()
    controllers = subprocess.Popen([BINARY, "controllers", "--kubeconfig", portal.kubeconfig],
                                   stdout=subprocess.DEVNULL, stderr=open(data / f"controllers-{kind}.log", "wb"))
    try:
        core = portal.core()
        apps = client.AppsV1Api(portal.api_client())
        time.sleep(3)
        idle = rss_mib(controllers.pid)
        spec = {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]}
        for i in range(args.deployments):
            labels = {"app": f"a{i}"}
            if kind == "Deployment":
                apps.create_namespaced_deployment(NS, {"metadata": {"name": f"a{i}"}, "spec": {"replicas": args.per, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": spec}}})
            else:
                core.create_namespaced_replication_controller(NS, {"metadata": {"name": f"a{i}"}, "spec": {"replicas": args.per, "selector": labels, "template": {"metadata": {"labels": labels}, "spec": spec}}})
        total = args.deployments * args.per
        def counted():
            time.sleep(1)
            owners = apps.list_namespaced_deployment(NS).items if kind == "Deployment" else core.list_namespaced_replication_controller(NS).items
            return sum((o.status.replicas or 0) if o.status else 0 for o in owners) >= total
        wait(counted, f"{total} pods counted", 900)
        time.sleep(5)
        return idle, rss_mib(controllers.pid)
    finally:
        controllers.terminate()
        controllers.wait(timeout=60)
        portal.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--per", type=int, default=10)
    args = parser.parse_args()
    base = pathlib.Path(tempfile.mkdtemp(prefix="bench-deployments-"))
    (base / "node").mkdir()
    rc_up, deploy_up, rollout, load = on_a_node(args, base / "node")
    memory = {}
    for kind in ("ReplicationController", "Deployment"):
        (base / kind).mkdir()
        memory[kind] = controllers_memory(args, base / kind, kind)

    n = args.replicas
    pods = args.deployments * args.per
    total = load.ok + load.failed
    rows = [
        (f"scale 0 → {n}, all Ready (mean of 2)", f"{deploy_up:.2f} s", f"{rc_up:.2f} s (RC)", f"{deploy_up / rc_up:.2f}×"),
        (f"rolling update of {n} (25 %/25 %), set image → complete", f"{rollout:.1f} s", "", ""),
        ("failed requests during it", f"{load.failed} of {total}", "", "goal 0"),
        ("controllers RSS idle", f"{memory['Deployment'][0]:.0f} MiB", f"{memory['ReplicationController'][0]:.0f} MiB", ""),
        (f"controllers RSS, {args.deployments} × {args.per} ({pods} pods)", f"{memory['Deployment'][1]:.0f} MiB",
         f"{memory['ReplicationController'][1]:.0f} MiB (RCs)", f"{memory['Deployment'][1] / memory['ReplicationController'][1]:.2f}×"),
    ]
    table = "| measure | Deployments | anchor (same run) | ratio |\n| --- | ---: | ---: | ---: |\n"
    table += "".join(f"| {a} | {b} | {c} | {d} |\n" for a, b, c, d in rows)
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
