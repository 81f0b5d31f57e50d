#!/usr/bin/env python3
"""Node agent benchmark (issue 12): pod startup and agent memory, one run.

In a test-made node network namespace: a registry on its loopback with a
busybox image, `portal server --disable agent` and `portal agent` as its own
process (so its memory is its own). Measured, with the image present:
- single pods, one at a time: pod create request -> Ready seen through a watch;
- a burst: an RC scaled 0 -> N, scale request -> each pod Ready (watch);
- the agent's RSS idle and with M pods running.
Anchors in the same run, on the same unpacked image: a bare `runc run -d`
(the floor: no API, no network namespace) one at a time and N at once, and
`podman run -d` where podman runs here.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/agent.py [--singles 20] [--burst 50] [--pods 100]
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from support import agent_bed  # noqa: E402
from common import percentile  # noqa: E402
from support import nodes  # noqa: E402
from support import registry  # noqa: E402
from conftest import BINARY, Portal  # noqa: E402

NS = "default"


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class ReadyWatch:
    """Watches pods and records when each first turned Ready."""

    def __init__(self, kubeconfig):
        self.ready = {}
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            ["kubectl", "--kubeconfig", kubeconfig, "get", "pods", "-w", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self.process.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            pod = event.get("object", {})
            conditions = pod.get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                with self.lock:
                    self.ready.setdefault(pod["metadata"]["name"], time.monotonic())

    def wait(self, names, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(n in self.ready for n in names):
                    return [self.ready[n] for n in names]
            time.sleep(0.005)
        raise SystemExit(f"pods not ready in time: {[n for n in names if n not in self.ready]}")

    def close(self):
        self.process.kill()


def pod_body(name, image):
    return {
        "metadata": {"name": name, "labels": {"bench": "single"}},
        "spec": {"containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}], "terminationGracePeriodSeconds": 0},
    }


def wait_gone(core, selector, timeout=120):
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(NS, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise SystemExit("pods did not go")
        time.sleep(0.05)


def runc_anchor(rootfs, count, concurrent):
    """`runc run -d` of `sleep` on a copy-free bundle: seconds per start."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-runc-"))
    root = work / "root"
    try:
        bundle = work / "bundle"
        bundle.mkdir()
        subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["terminal"] = False
        spec["process"]["args"] = ["sleep", "3600"]
        spec["root"] = {"path": str(rootfs), "readonly": True}
        spec["linux"].pop("resources", None)
        (bundle / "config.json").write_text(json.dumps(spec))

        def start(i):
            began = time.monotonic()
            subprocess.run(["runc", "--root", str(root), "run", "-d", "--bundle", str(bundle), f"b{i}"], check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return time.monotonic() - began
        if concurrent:
            with concurrent_pool(count) as pool:
                times = list(pool.map(start, range(count)))
        else:
            times = [start(i) for i in range(count)]
        return times
    finally:
        listed = subprocess.run(["runc", "--root", str(root), "list", "-q"], capture_output=True, text=True).stdout.split()
        for cid in listed:
            subprocess.run(["runc", "--root", str(root), "delete", "-f", cid], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def concurrent_pool(count):
    return concurrent.futures.ThreadPoolExecutor(max_workers=count)


def podman_anchor(rootfs, count):
    """`podman run -d` of the same root filesystem (imported), if podman runs."""
    if not shutil.which("podman"):
        return None, "podman not installed"
    tar = pathlib.Path(tempfile.mkdtemp(prefix="bench-podman-")) / "rootfs.tar"
    try:
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        image = subprocess.run(["podman", "import", str(tar), "portal-bench/busybox:1"], capture_output=True, text=True)
        if image.returncode != 0:
            return None, f"podman import failed: {image.stderr.strip()[:120]}"
        times, ids = [], []
        for _ in range(count):
            began = time.monotonic()
            run = subprocess.run(["podman", "run", "-d", "--network", "none", "--ulimit", "nofile=10000:10000", "--ulimit", "nproc=10000:10000", "portal-bench/busybox:1", "sleep", "3600"], capture_output=True, text=True)
            if run.returncode != 0:
                return None, f"podman run failed: {run.stderr.strip()[:120]}"
            times.append(time.monotonic() - began)
            ids.append(run.stdout.strip())
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True)
        return times, None
    finally:
        subprocess.run(["podman", "rmi", "-f", "portal-bench/busybox:1"], capture_output=True)
        shutil.rmtree(tar.parent, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--singles", type=int, default=20)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    rows = []
    data = pathlib.Path(tempfile.mkdtemp(prefix="bench-agent-"))
    agent_dir = data / "agent-data"
    agent = None
    with nodes.Cluster(bridge=False), registry.Registry() as reg:
        registry.push_busybox(reg)
        image = f"{reg.host}/busybox:1.36"
        portal = Portal(data, ["--node-ip", nodes.NODE_IP, "--proxy-mode", "nftables"], proxy=True, agent=False).start()
        try:
            agent = subprocess.Popen([BINARY, "agent", "--kubeconfig", portal.kubeconfig, "--node-name", "bench-node", "--node-ip", nodes.NODE_IP, "--data-dir", str(agent_dir), "--metrics-bind", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=open(data / "agent.log", "wb"))
            core = portal.core()
            watch = ReadyWatch(portal.kubeconfig)
            # Registered and idle, nothing pulled yet.
            deadline = time.monotonic() + 30
            while not core.list_node(field_selector="metadata.name=bench-node").items or not core.read_node("bench-node").spec.pod_cidr:
                if time.monotonic() > deadline:
                    raise SystemExit("the agent did not register")
                time.sleep(0.1)
            time.sleep(3)
            start_rss = rss_mib(agent.pid)
            # Warm up: the image is pulled and unpacked once.
            core.create_namespaced_pod(NS, pod_body("warmup", image))
            watch.wait(["warmup"])
            core.delete_namespaced_pod("warmup", NS)
            wait_gone(core, "bench=single")
            time.sleep(2)
            idle_rss = rss_mib(agent.pid)

            singles = []
            for i in range(args.singles):
                name = f"single-{i}"
                began = time.monotonic()
                core.create_namespaced_pod(NS, pod_body(name, image))
                (ready,) = watch.wait([name])
                singles.append(ready - began)
                core.delete_namespaced_pod(name, NS)
                wait_gone(core, "bench=single")

            rc = {"metadata": {"name": "burst"}, "spec": {"replicas": 0, "selector": {"bench": "burst"}, "template": {"metadata": {"labels": {"bench": "burst"}}, "spec": pod_body("x", image)["spec"]}}}
            core.create_namespaced_replication_controller(NS, rc)
            began = time.monotonic()
            core.patch_namespaced_replication_controller_scale("burst", NS, {"spec": {"replicas": args.burst}})
            deadline = time.monotonic() + 60
            while len(names := [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="bench=burst").items]) < args.burst:
                if time.monotonic() > deadline:
                    raise SystemExit("the RC did not create its pods")
                time.sleep(0.02)
            burst = [t - began for t in watch.wait(names, timeout=300)]

            core.patch_namespaced_replication_controller_scale("burst", NS, {"spec": {"replicas": args.pods}})
            deadline = time.monotonic() + 60
            while len(names := [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="bench=burst").items]) < args.pods:
                if time.monotonic() > deadline:
                    raise SystemExit("the RC did not create its pods")
                time.sleep(0.05)
            watch.wait(names, timeout=600)
            time.sleep(3)
            loaded_rss = rss_mib(agent.pid)
            core.patch_namespaced_replication_controller_scale("burst", NS, {"spec": {"replicas": 0}})
            wait_gone(core, "bench=burst", timeout=300)
            watch.close()

            unpacked = next((agent_dir / "images" / "unpacked").iterdir()) / "rootfs"
            runc_single = runc_anchor(unpacked, args.singles, concurrent=False)
            runc_burst = runc_anchor(unpacked, args.burst, concurrent=True)
            podman, podman_note = podman_anchor(unpacked, args.singles)
        finally:
            if agent:
                agent.terminate()
                agent.wait(timeout=60)
            portal.stop()
            agent_bed.cleanup(agent_dir, agent_bed.agent_tag(agent_dir, "bench-node"))

    ms = lambda v: f"{v * 1000:.0f} ms"
    rows.append(("single pod start p50", ms(percentile(singles, 50)), ms(percentile(runc_single, 50)), f"{percentile(singles, 50) / percentile(runc_single, 50):.2f}× the floor"))
    rows.append(("single pod start p99", ms(percentile(singles, 99)), ms(percentile(runc_single, 99)), f"{percentile(singles, 99) / percentile(runc_single, 99):.2f}× the floor"))
    rows.append((f"burst of {args.burst} (RC 0→{args.burst}) p50", ms(percentile(burst, 50)), ms(percentile(runc_burst, 50)), "goal p99 < 500 ms"))
    rows.append((f"burst of {args.burst} p99", ms(percentile(burst, 99)), ms(percentile(runc_burst, 99)), "met" if percentile(burst, 99) < 0.5 else "not met"))
    if podman:
        rows.append(("podman run -d p50 / p99", f"{ms(percentile(podman, 50))} / {ms(percentile(podman, 99))}", "", f"agent p50 {percentile(podman, 50) / percentile(singles, 50):.1f}× faster"))
    else:
        rows.append(("podman run -d", podman_note, "", ""))
    rows.append(("agent RSS idle, before any pull", f"{start_rss:.0f} MiB", "", "goal < 30 MiB"))
    rows.append(("agent RSS idle, after one pull and pod", f"{idle_rss:.0f} MiB", "", ""))
    rows.append((f"agent RSS with {args.pods} pods", f"{loaded_rss:.0f} MiB", "", "goal < 60 MiB"))
    table = "| measure | Portal agent | bare runc (floor) | note |\n| --- | ---: | ---: | --- |\n"
    table += "".join(f"| {a} | {b} | {c} | {d} |\n" for a, b, c, d in rows)
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
