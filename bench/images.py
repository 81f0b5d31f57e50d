#!/usr/bin/env python3
"""Real images and live configuration (issue 28), one run.

In a test-made node network namespace, with a registry on its loopback:
- pull + unpack of a real two-layer Debian nginx image (~70 MB of gzip
  layers, support.debian_images) by the agent — the time its `Pulled`
  event reports, the store emptied before each run — against the floor in
  the same run: `skopeo copy` of the same image from the same registry
  into an OCI layout plus `umoci unpack` of it;
- a ConfigMap update -> the new value seen by a running pod through its
  volume: the time from the PATCH to the first log line (CRI timestamp) of
  a container printing the file every 50 ms.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/images.py [--pulls 5] [--updates 12]
"""

import argparse
import os
import random
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from support import debian_images  # noqa: E402
from common import percentile  # noqa: E402
from support.agent_bed import NS, AgentNode, busybox_image, pod_manifest  # noqa: E402
from support.waiting import wait_for  # noqa: E402


def empty_image_store(node):
    images = node.data_dir / "agent" / "images"
    for sub in ["blobs/sha256", "refs", "unpacked"]:
        for entry in (images / sub).iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def agent_pull(node, reference, run):
    name = f"pull-{run}"
    node.core.create_namespaced_pod(NS, pod_manifest(name, reference))
    event = wait_for(lambda: [e for e in node.events(name) if e[1] == "Pulled" and "Successfully" in e[2]],
                     "the Pulled event", timeout=300)
    seconds = float(re.search(r" in ([0-9.]+)s", event[0][2]).group(1))
    node.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: not node.core.list_namespaced_pod(NS, field_selector=f"metadata.name={name}").items,
             "the pod to go", timeout=60)
    return seconds


def floor_pull(reference):
    with tempfile.TemporaryDirectory(prefix="bench-umoci-") as tmp:
        began = time.monotonic()
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{reference}",
                        f"oci:{tmp}/oci:x"], check=True, capture_output=True, timeout=600)
        subprocess.run(["umoci", "unpack", "--image", f"{tmp}/oci:x", f"{tmp}/bundle"],
                       check=True, capture_output=True, timeout=600)
        return time.monotonic() - began


def cri_time(line):
    """Seconds since the epoch of a CRI log line's timestamp."""
    stamp = line.split(" ", 1)[0]
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    import calendar
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def config_updates(node, count):
    core = node.core
    core.create_namespaced_config_map(NS, {"metadata": {"name": "live"}, "data": {"v": "start"}})
    reader = {"name": "reader", "image": node.busybox,
              "command": ["sh", "-c", "while true; do cat /cfg/v; echo; sleep 0.05; done"],
              "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}
    core.create_namespaced_pod(NS, {"metadata": {"name": "reader"}, "spec": {
        "terminationGracePeriodSeconds": 1, "containers": [reader],
        "volumes": [{"name": "cfg", "configMap": {"name": "live"}}]}})
    node.wait_running("reader")
    pod = node.pod("reader")
    log = node.data_dir / "agent" / "logs" / f"{NS}_reader_{pod.metadata.uid}" / "reader" / "0.log"
    delays = []
    pacing = random.Random(28)
    for i in range(count):
        value = f"value-{i}"
        # At a random point of the agent's sync cycle, not in step with it.
        time.sleep(pacing.uniform(0, 10))
        patched = time.time()
        core.patch_namespaced_config_map("live", NS, {"data": {"v": value}})

        def seen():
            for line in log.read_text().splitlines():
                parts = line.split(" ", 3)
                if len(parts) == 4 and parts[3] == value:
                    return cri_time(line)
            return None
        delays.append(wait_for(seen, f"{value} in the pod", timeout=120, interval=0.05) - patched)
    core.delete_namespaced_pod("reader", NS, grace_period_seconds=0)
    return delays


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pulls", type=int, default=5)
    parser.add_argument("--updates", type=int, default=12)
    args = parser.parse_args()
    layout = debian_images.nginx_layout()
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        with AgentNode(pathlib.Path(tmp)) as node:
            node.busybox = busybox_image(node)
            reference = debian_images.push(layout, node.registry.host)
            ours, floor = [], []
            for run in range(args.pulls):
                empty_image_store(node)
                ours.append(agent_pull(node, reference, run))
                floor.append(floor_pull(reference))
            delays = config_updates(node, args.updates)
    size = sum(p.stat().st_size for p in (layout / "blobs").rglob("*") if p.is_file()) / 2**20
    ratio = statistics.median(ours) / statistics.median(floor)
    lines = [
        f"Debian nginx image, {size:.0f} MiB of blobs in 3 layers (minbase, nginx-light, a site layer), "
        f"from a docker-registry on the node's loopback; {args.pulls} pulls each, the agent's store emptied "
        "before each; medians.\n",
        "| measure | Portal agent | skopeo copy + umoci unpack (floor) | ratio |",
        "|---|---|---|---|",
        f"| pull + unpack, p50 | {statistics.median(ours):.2f} s | {statistics.median(floor):.2f} s | {ratio:.2f}× |",
        f"| pull + unpack, best | {min(ours):.2f} s | {min(floor):.2f} s | {min(ours) / min(floor):.2f}× |",
        "",
        f"ConfigMap update → new value read by a running pod through its volume, {args.updates} updates: "
        f"p50 {statistics.median(delays):.1f} s, p99 {percentile(delays, 99):.1f} s, max {max(delays):.1f} s "
        "(the agent rewrites configuration volumes at every pod sync, every 10 s; the kubelet's bound is its "
        "sync period plus its cache TTL, about a minute).\n",
    ]
    text = "\n".join(lines) + "\n"
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
