"""A node for the agent's tests: a node network namespace (nodes.Cluster
without a hand-made bridge), a registry on the node's loopback filled with
busybox images, and `portal server` with its node agent and kernel proxy.

Everything the agent makes is found by its tag (FNV-1a of its data dir and
node name, as the agent computes it) and removed on teardown, also after a
failure: shim and container processes, mounts under the data dir, pod
network namespaces and cgroups.
"""

import contextlib
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
import types

import kubernetes

from conftest import Portal
from support import nodes, registry
from support.waiting import wait_for

NS = "default"


def fnv1a(text):
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def agent_tag(data_dir, node_name):
    return f"{fnv1a(f'{os.path.realpath(data_dir)}|{node_name}'):08x}"


class AgentNode:
    """`with AgentNode(tmp) as node:` a node running pods."""

    def __init__(self, data_dir, node_name="node-1", extra_args=(), ip_netns_exec=False, data_dir_flag=True):
        self.data_dir = pathlib.Path(data_dir)
        # Started as the README says, `ip netns exec NODE portal server`
        # (a mount namespace of its own with a fresh /sys), rather than
        # from this process's network namespace.
        self.ip_netns_exec = ip_netns_exec
        # False: the data directory comes from a configuration file.
        self.data_dir_flag = data_dir_flag
        self.node_name = node_name
        self.extra_args = list(extra_args)
        self.cluster = nodes.Cluster(bridge=False)
        self.registry = None
        self.portal = None

    def __enter__(self):
        try:
            self.cluster.__enter__()
            # Inside the node namespace: the node's loopback (and its address,
            # for other test nodes).
            self.registry = registry.Registry(bind="0.0.0.0").__enter__()
            self.portal = self.server().start()
            self.core = self.portal.core()
            wait_for(self.node_ready, "the node to be Ready with a pod range")
        except BaseException as error:
            self.__exit__(type(error), error, None)
            raise
        return self

    def server_args(self):
        return [
            "--node-ip", nodes.NODE_IP,
            "--node-name", self.node_name,
            "--proxy-mode", "nftables",
            # Docker Hub's names (`busybox:1.36`) come from the test registry.
            "--registry-mirror", f"docker.io=http://{self.registry.host}",
            *self.extra_args,
        ]

    def restart(self, kill=True):
        if kill:
            self.portal.kill()
        else:
            self.portal.stop()
        self.portal = self.server().start()
        self.core = self.portal.core()

    def server(self):
        launcher = ["ip", "netns", "exec", self.cluster.node] if self.ip_netns_exec else []
        server = Portal(self.data_dir, self.server_args(), proxy=True, agent=True, api_bind="0.0.0.0:0", launcher=launcher,
                        data_dir_flag=self.data_dir_flag)
        server.owned_by_a_bed = True
        return server

    def node_ready(self):
        try:
            node = self.core.read_node(self.node_name)
        except kubernetes.client.rest.ApiException as error:
            if error.status == 404:
                return None  # the agent has not registered it yet
            raise
        conditions = (node.status and node.status.conditions) or []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        return node.spec.pod_cidr if ready else None

    @property
    def tag(self):
        return agent_tag(self.data_dir / "agent", self.node_name)

    def __exit__(self, *exc):
        try:
            if self.portal:
                self.portal.stop()
                if exc and exc[0] is not None:
                    print(self.portal.log()[-20000:])
        finally:
            cleanup(self.data_dir / "agent", self.tag)
            if self.registry:
                self.registry.__exit__(None, None, None)
            self.cluster.__exit__(None, None, None)

    # What the agent left on the machine (each should be empty after pods go).
    def leftovers(self):
        return leftovers(self.data_dir / "agent", self.tag)

    def kubectl(self, *args, check=True):
        result = subprocess.run(["kubectl", "--kubeconfig", self.portal.kubeconfig, *args], capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def pod(self, name):
        return self.core.read_namespaced_pod(name, NS)

    def wait_running(self, name, timeout=60):
        def ready():
            pod = self.pod(name)
            statuses = pod.status.container_statuses or []
            return pod if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses) else None
        return wait_for(ready, f"pod {name} Running and ready", timeout)

    def log(self, name, container=None, attempt=0):
        """The container's CRI log lines' contents (what `kubectl logs` will show)."""
        pod = self.pod(name)
        container = container or pod.spec.containers[0].name
        path = self.data_dir / "agent" / "logs" / f"{NS}_{name}_{pod.metadata.uid}" / container / f"{attempt}.log"
        if not path.exists():
            return ""
        return "".join(line.split(" ", 3)[3] if line.count(" ") >= 3 else "" for line in path.read_text().splitlines(keepends=True))

    def events(self, name):
        items = self.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        return [(e.type, e.reason, e.message) for e in items]


def programmed(cluster_ip):
    """Whether the proxy has put the Service's address in the kernel (as a
    Service with endpoints, or one it rejects). Tests wait for this before
    sending traffic: a SYN sent earlier leaves an un-NATed conntrack entry
    that a later connection from the same port would follow (as with
    kube-proxy)."""
    maps = subprocess.run(["nft", "list", "map", "ip", "portal", "cluster-ips"], capture_output=True, text=True).stdout
    rejected = subprocess.run(["nft", "list", "map", "ip", "portal", "no-endpoint-services"], capture_output=True, text=True).stdout
    return f"{cluster_ip} . " in maps + rejected


def wait_programmed(cluster_ip, with_endpoints=True):
    def ready():
        maps = subprocess.run(["nft", "list", "map", "ip", "portal", "cluster-ips"], capture_output=True, text=True).stdout
        return f"{cluster_ip} . " in maps if with_endpoints else programmed(cluster_ip)
    wait_for(ready, f"the proxy to program {cluster_ip}")


def dnat_targets():
    """The endpoint addresses the kernel DNATs Services to now."""
    table = subprocess.run(["nft", "list", "table", "ip", "portal"], capture_output=True, text=True).stdout
    return set(re.findall(r"dnat to (\d+\.\d+\.\d+\.\d+):\d+", table))


def wait_endpoints_programmed(ips):
    """Until the kernel sends Service traffic to these pods (programming
    takes up to a sync period after the pods turn ready)."""
    wait_for(lambda: set(ips) <= dnat_targets(), f"the proxy to program {sorted(ips)}")


_marks = itertools.count(1)


def wait_proxy_caught_up(core):
    """Until the proxy has programmed a Service and EndpointSlice made now:
    it has then seen every EndpointSlice change made before (its watch
    delivers them in order) and synced after them. For a test that asserts
    what the proxy must not do about an earlier change."""
    n = next(_marks)
    name, ip = f"caught-up-{n}", f"192.0.2.{n}"
    discovery = kubernetes.client.DiscoveryV1Api(core.api_client)
    core.create_namespaced_service(NS, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
    try:
        discovery.create_namespaced_endpoint_slice(NS, {
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        })
        wait_for(lambda: ip in dnat_targets(), f"the proxy to program {name}, made after the change")
    finally:
        core.delete_namespaced_service(name, NS)
        try:
            discovery.delete_namespaced_endpoint_slice(name, NS)
        except kubernetes.client.rest.ApiException as error:
            if error.status != 404:
                raise


def processes_of(agent_dir):
    """(pid, cmdline) of shims and containers under this agent's data dir."""
    found = []
    marker = str(os.path.realpath(agent_dir))
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and " shim " in f" {cmdline} ":
            found.append((int(entry.name), cmdline))
    return found


def container_pids(agent_dir):
    """Init pids of running containers (from the shims' state)."""
    pids = {}
    for state in pathlib.Path(agent_dir, "runtime", "containers").glob("*/state"):
        pid_file = state / "pid"
        if pid_file.exists() and not (state / "exit").exists():
            pids[state.parent.name] = int(pid_file.read_text())
    return pids


def running_containers_of(agent_dir, pod_uid):
    """Ids of the pod's containers still running (from the runtime's records)."""
    running = []
    for directory in pathlib.Path(agent_dir, "runtime", "containers").glob("*"):
        try:
            meta = json.loads((directory / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("pod_uid") == pod_uid and (directory / "state" / "pid").exists() and not (directory / "state" / "exit").exists():
            running.append(directory.name)
    return running


def mounts_under(agent_dir):
    marker = str(os.path.realpath(agent_dir))
    return [line.split()[4] for line in open("/proc/self/mountinfo") if marker in line.split()[4]]


def netns_of(tag):
    return sorted(p.name for p in pathlib.Path("/run/netns").glob(f"portal-{tag}-*"))


def cgroups_of(tag):
    """Pod and container cgroups (directories) under the agent's."""
    return sorted(str(p) for p in pathlib.Path("/sys/fs/cgroup").glob(f"*/portal/{tag}/*") if p.is_dir())


def pod_links():
    """Node-side pod veths (`pv…`) in the current network namespace."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.split(":")[1].strip().startswith("pv"))


@contextlib.contextmanager
def bare_node(agent_dir, node_name):
    """A node namespace (entered) and a registry in it, for tests that run
    `portal server` and `portal agent` themselves (and stop them before
    this exits); everything the agent made is removed afterwards, also
    after a failure."""
    cluster = nodes.Cluster(bridge=False).__enter__()
    bed = types.SimpleNamespace(registry=None, tag=agent_tag(agent_dir, node_name))
    try:
        bed.registry = registry.Registry(bind="0.0.0.0").__enter__()
        yield bed
    finally:
        cleanup(agent_dir, bed.tag)
        if bed.registry:
            bed.registry.__exit__(None, None, None)
        cluster.__exit__(None, None, None)


def leftovers(agent_dir, tag):
    return {
        "processes": processes_of(agent_dir),
        "mounts": mounts_under(agent_dir),
        "netns": netns_of(tag),
        "cgroups": cgroups_of(tag),
        "links": pod_links(),
        "sockets": sorted(os.listdir(f"/run/portal/{tag}")) if os.path.isdir(f"/run/portal/{tag}") else [],
    }


def alive(pid):
    """Whether `pid` runs (a zombie has released what it held)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def cleanup(agent_dir, tag):
    """Removes whatever the agent left: processes, mounts, netns, cgroups."""
    killed = list(container_pids(agent_dir).values()) + [pid for pid, _ in processes_of(agent_dir)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Their mounts and namespaces are released once they have died (a
    # teardown: it goes on after a bounded wait rather than fail).
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    for mount in sorted(mounts_under(agent_dir), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)
    for name in netns_of(tag):
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for hierarchy in pathlib.Path("/sys/fs/cgroup").iterdir():
        base = hierarchy / "portal" / tag
        if base.is_dir():
            for directory in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if directory.is_dir():
                    try:
                        directory.rmdir()
                    except OSError:
                        pass
            try:
                base.rmdir()
                (hierarchy / "portal").rmdir()
            except OSError:
                pass
    # The containers' attach and console sockets.
    shutil.rmtree(f"/run/portal/{tag}", ignore_errors=True)


def web_image(node, repository="web", tag="1"):
    """A busybox httpd image that serves its name and environment."""
    script = (
        b"#!/bin/sh\n"
        b"hostname > /var/www/name.txt\n"
        b"env > /var/www/env.txt\n"
        b"exec httpd -f -p 8080 -h /var/www\n"
    )
    registry.push_busybox(node.registry, repository, tag, cmd=["/bin/serve"], files={"bin/serve": script})
    return f"{node.registry.host}/{repository}:{tag}"


def busybox_image(node, repository="busybox", tag="1.36"):
    registry.push_busybox(node.registry, repository, tag)
    return f"{node.registry.host}/{repository}:{tag}"


def pod_manifest(name, image, command=None, labels=None, **spec):
    container = {"name": name.split("-")[0] if "-" in name else name, "image": image}
    if command is not None:
        container["command"] = command
    body = {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }
    return body


def jsonish(obj):
    return json.dumps(obj, default=str)
