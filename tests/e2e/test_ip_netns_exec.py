"""`ip netns exec NODE portal server …`, as the README suggests, runs pods
(issue 34). `ip netns exec` gives the server a mount namespace of its own
with a fresh /sys, where no cgroup hierarchy is mounted; the agent mounts
the machine's there (and only there) before its first container."""

import os

import pytest

from support.agent_bed import NS, AgentNode, busybox_image, pod_manifest
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


def cgroup_mounts(pid="self"):
    with open(f"/proc/{pid}/mountinfo") as f:
        return sorted(line.split()[4] for line in f if line.split(" - ")[1].split()[0] in ("cgroup", "cgroup2"))


def mount_namespace(pid="self"):
    return os.stat(f"/proc/{pid}/ns/mnt").st_ino


def test_a_server_started_by_ip_netns_exec_runs_pods(tmp_path):
    machine = cgroup_mounts()
    assert machine, "the machine itself has cgroup hierarchies"
    with AgentNode(tmp_path, ip_netns_exec=True) as node:
        server = node.portal.process.pid
        # Really started as a user would: its own mount namespace, in
        # which the agent mounted the machine's hierarchies.
        assert mount_namespace(server) != mount_namespace()
        assert "mounted the machine's cgroup hierarchies" in node.portal.log()
        assert cgroup_mounts(server) == machine
        image = busybox_image(node)
        node.core.create_namespaced_pod(NS, pod_manifest("probe", image, ["sh", "-c", "cat /proc/self/cgroup; sleep 3600"]))
        try:
            node.wait_running("probe")
            wait_for(lambda: f"portal/{node.tag}/" in node.log("probe"), "the pod's cgroup path in its log")
        finally:
            node.core.delete_namespaced_pod("probe", NS, grace_period_seconds=0)
        # Nothing of it reached the machine's own mount namespace.
        assert cgroup_mounts() == machine
