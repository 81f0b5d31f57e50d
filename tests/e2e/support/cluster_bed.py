"""A cluster of node namespaces on one LAN the test makes (issue 17):
`portal server` on node-1, `portal node` (agent + proxy) joined with the
node token on the others. Shared by the multi-node tests."""

import json
import subprocess

from conftest import BINARY, Portal
from support import agent_bed, registry
from support.agent_bed import NS
from support.lan import Lan
from support.waiting import wait_for

GRACE = "4s"
LEASE_SECONDS = "2"
TOLERATION = 6
NAMES = {i: f"node-{i}" for i in range(1, 10)}

SERVE = b"#!/bin/sh\nhostname > /www/name.txt\nexec httpd -f -p 8080 -h /www\n"
PEER = b"#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n%s\\n' \"$REMOTE_ADDR\"\n"


def placed_pod(name, image, node, labels, command):
    """A pod on `node` in namespace default, ready once it runs (an exec
    probe), that stops within a second."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "main", "image": image, "command": command,
                 "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}]}}


class Bed:
    def __init__(self, tmp, routed=False, extra=(), count=3, server_extra=(), ipv6=False, api_bind="0.0.0.0:0",
                 proxy_modes=None):
        self.tmp = tmp
        self.api_bind = api_bind
        # Worker index → its proxy mode (default nftables).
        self.proxy_modes = proxy_modes or {}
        self.count = count
        self.lan = Lan(count, routed=routed, ipv6=ipv6)
        self.extra = list(extra)
        # For `portal server` alone (cluster-wide flags).
        self.server_extra = list(server_extra)
        self.registry = None
        self.portal = None
        self.workers = {}

    def __enter__(self):
        try:
            self.lan.__enter__()
            self.registry = registry.Registry(bind="0.0.0.0").__enter__()
            registry.push_busybox(self.registry, "library/peer", "1", cmd=["/bin/serve"],
                                  files={"bin/serve": SERVE, "www/cgi-bin/peer": PEER})
            self.image = "peer:1"  # each node pulls it through its mirror
            (self.tmp / "n1").mkdir()
            self.portal = Portal(self.tmp / "n1", [
                "--node-ip", self.node_ip(1), "--node-name", NAMES[1], "--proxy-mode", "nftables",
                "--registry-mirror", f"docker.io=http://{self.registry.host}",
                "--node-monitor-grace-period", GRACE, "--node-lease-duration-seconds", LEASE_SECONDS,
                *self.extra, *self.server_extra,
            ], proxy=True, agent=True, api_bind=self.api_bind).start()
            self.core = self.portal.core()
            self.port = self.portal.server.rsplit(":", 1)[1]
            self.server = f"https://{self.lan.address(1)}:{self.port}"
            self.token_file = self.tmp / "n1" / "node-token"
            for i in range(2, self.count + 1):
                self.start_worker(i)
            for i in range(1, self.count + 1):
                wait_for(lambda i=i: self.ready(NAMES[i]), f"{NAMES[i]} Ready", timeout=90)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def worker_args(self, i, data_dir=None, token_file=None, name=None):
        registry_port = self.registry.host.rsplit(":", 1)[1]
        mirror = f"{self.lan.address(1)}:{registry_port}"
        return [
            BINARY, "node", "--server", self.server, "--token-file", str(token_file or self.token_file),
            "--node-name", name or NAMES[i], "--node-ip", self.node_ip(i),
            "--data-dir", str(data_dir or self.tmp / f"n{i}"), "--proxy-mode", self.proxy_modes.get(i, "nftables"),
            "--registry-mirror", f"docker.io=http://{mirror}", "--insecure-registry", mirror,
            "--node-lease-duration-seconds", LEASE_SECONDS, *self.extra,
        ]

    def node_ip(self, i):
        """`--node-ip`: both addresses on an IPv6 LAN."""
        return f"{self.lan.address(i)},{self.lan.address6(i)}" if self.lan.ipv6 else self.lan.address(i)

    def start_worker(self, i):
        self.workers[i] = self.lan.start(i, self.worker_args(i), self.tmp / f"node-{i}.log")

    def ready(self, name):
        try:
            node = self.core.read_node(name)
        except Exception:
            return False
        conditions = (node.status and node.status.conditions) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def agent_dir(self, i):
        return self.tmp / "n1" / "agent" if i == 1 else self.tmp / f"n{i}" / "agent"

    def kubectl(self, *args, kubeconfig=None, check=True):
        result = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig or self.portal.kubeconfig), *args],
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def create(self, items):
        """Creates the objects with `kubectl create` (one List)."""
        subprocess.run(["kubectl", "--kubeconfig", str(self.portal.kubeconfig), "create", "-f", "-"],
                       input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                       capture_output=True, text=True, timeout=60, check=True)

    def pod_ready(self, name, namespace="default"):
        status = self.core.read_namespaced_pod(name, namespace).status
        return status.phase == "Running" and all(c.ready for c in status.container_statuses or [])

    def pods(self, selector):
        return [p for p in self.core.list_namespaced_pod(NS, label_selector=selector).items if not p.metadata.deletion_timestamp]

    def running(self, selector, count):
        pods = self.pods(selector)
        ok = [p for p in pods if p.status.phase == "Running" and all(s.ready for s in p.status.container_statuses or [])]
        return ok if len(ok) == count == len(pods) else None

    def pod_output(self, name, timeout=90):
        wait_for(lambda: self.core.read_namespaced_pod(name, NS).status.phase in ("Succeeded", "Failed"), f"{name} to finish", timeout=timeout)
        # Through the API server to the agent of whichever node ran it.
        return self.kubectl("logs", name).stdout

    def __exit__(self, *exc):
        try:
            for i, process in self.workers.items():
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
            if self.portal:
                self.portal.stop()
        finally:
            for i in range(1, self.count + 1):
                agent_bed.cleanup(self.agent_dir(i), agent_bed.agent_tag(self.agent_dir(i), NAMES[i]))
            if self.registry:
                self.registry.__exit__(None, None, None)
            self.lan.__exit__(None, None, None)
