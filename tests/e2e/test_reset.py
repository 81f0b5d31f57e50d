"""`portal reset` (issue 34): after `portal server` stopped (its containers
keep running, by design), one command removes every process, mount, pod
network namespace, cgroup, link, route and nftables table Portal made on
the node, and leaves a second node's alone. Run twice, it finds nothing."""

import subprocess

import pytest

from conftest import BINARY
from support import nodes
from support.agent_bed import NS, AgentNode, alive, busybox_image, container_pids, pod_manifest
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


def pod_with_volumes(name, image):
    """A pod with mounts of its own: a memory emptyDir and a projected volume."""
    pod = pod_manifest(name, image, ["sh", "-c", "sleep 3600"])
    pod["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {"medium": "Memory"}},
        {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
    ]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "info", "mountPath": "/info"},
    ]
    return pod


def reset(node, *extra):
    """`portal reset` in the node's network namespace, as a user runs it there."""
    return subprocess.run(
        ["nsenter", f"--net=/var/run/netns/{node.cluster.node}", BINARY, "reset", "--data-dir", str(node.data_dir), *extra],
        capture_output=True, text=True, timeout=120,
    )


def network_objects():
    """Portal's objects in the current (node) network namespace."""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "route", "show", "proto", "117"], capture_output=True, text=True).stdout
    return {
        "tables": sorted(line.split()[-1] for line in tables.splitlines() if line.split()[-1].startswith("portal")),
        "links": sorted(name for line in links.splitlines() if (name := line.split(":")[1].strip().split("@")[0]).startswith(("portal", "pv"))),
        "routes": routes.strip(),
    }


def test_reset_removes_one_nodes_leftovers_and_no_other(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "node").mkdir()
    with AgentNode(tmp_path / "other", node_name="other") as other:
        other.core.create_namespaced_pod(NS, pod_manifest("keep", busybox_image(other), ["sleep", "3600"]))
        other.wait_running("keep")
        # A second node in a namespace of its own (the test thread enters it).
        with AgentNode(tmp_path / "node") as node:
            image = busybox_image(node)
            names = [f"p{i}" for i in range(5)]
            for name in names:
                node.core.create_namespaced_pod(NS, pod_with_volumes(name, image))
            for name in names:
                node.wait_running(name)
            pids = list(container_pids(node.data_dir / "agent").values())
            assert len(pids) == 5
            node.portal.stop()
            # Stopping Portal leaves the pods running, by design.
            left = node.leftovers()
            assert all(alive(pid) for pid in pids)
            assert len(left["netns"]) == 5 and len(left["cgroups"]) >= 5 and left["mounts"] and left["links"], left
            assert network_objects()["tables"] and "portal0" in network_objects()["links"]

            first = reset(node)
            assert first.returncode == 0, first.stderr
            assert "5 containers" in first.stderr, first.stderr
            assert not any(alive(pid) for pid in pids)
            assert node.leftovers() == {"processes": [], "mounts": [], "netns": [], "cgroups": [], "links": [], "sockets": []}
            assert network_objects() == {"tables": [], "links": [], "routes": ""}

            again = reset(node)
            assert again.returncode == 0, again.stderr
            assert "0 containers" in again.stderr and "nftables" not in again.stderr, again.stderr

        # The other node's pod runs on, its cgroups, namespace and shim kept.
        kept = list(container_pids(other.data_dir / "agent").values())
        assert len(kept) == 1 and alive(kept[0])
        assert other.pod("keep").status.phase == "Running"
        left = other.leftovers()
        assert left["processes"] and left["netns"] and left["cgroups"], left


def test_reset_refuses_while_portal_runs(tmp_path):
    """However the server was started (here its data directory comes from a
    configuration file): its agent holds the directory's lock."""
    data = tmp_path / "server"
    data.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"data-dir: {data}\n")
    with AgentNode(data, extra_args=["--config", str(config)], data_dir_flag=False) as node:
        wait_for(lambda: "portal0" in network_objects()["links"] and network_objects()["tables"],
                 "the agent's bridge and the proxy's table")
        refused = reset(node)
        assert refused.returncode != 0
        assert "still runs on" in refused.stderr, refused.stderr
        # A mistyped directory is an error, and the namespace's network
        # stays (the server uses it).
        missing = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{node.cluster.node}", BINARY, "reset", "--data-dir", str(tmp_path / "nope")],
            capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0 and "nope" in missing.stderr, missing.stderr
        # Another, idle directory: its network objects are this server's.
        idle = tmp_path / "idle"
        idle.mkdir()
        other = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{node.cluster.node}", BINARY, "reset", "--data-dir", str(idle), "--node-name", "x"],
            capture_output=True, text=True, timeout=60)
        assert other.returncode != 0 and "runs in this network namespace" in other.stderr, other.stderr
        kept = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{node.cluster.node}", BINARY, "reset", "--data-dir", str(idle), "--node-name", "x", "--keep-network"],
            capture_output=True, text=True, timeout=60)
        assert kept.returncode == 0, kept.stderr
        assert "portal0" in network_objects()["links"] and network_objects()["tables"]
        assert node.node_ready()


def test_reset_with_remove_data_deletes_the_data_directory(tmp_path):
    data = tmp_path / "cluster"
    data.mkdir()
    with AgentNode(data) as node:
        wait_for(lambda: "portal0" in network_objects()["links"] and network_objects()["tables"],
                 "the agent's bridge and the proxy's table")
        node.portal.stop()
        removed = reset(node, "--remove-data")
        assert removed.returncode == 0, removed.stderr
        assert not data.exists()
        assert network_objects() == {"tables": [], "links": [], "routes": ""}
