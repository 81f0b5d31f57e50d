"""The service proxy in userspace mode (issue 6, SPEC P3): listeners per
Service port on the node address (the kernel redirects cluster IPs to
them), round robin, ClientIP affinity, a retry on another endpoint when a
connect fails, TCP and UDP. Same namespaces as test_proxy.py: a node
running `portal server --proxy-mode userspace`, pods on its bridge."""

import hashlib
import os
import socket

import pytest

from conftest import Portal
from support.nodes import GATEWAY, NODE_IP, Cluster, make_service, register_pod, sh, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

NS = "default"
LIVE = {"web-a": "10.244.0.21", "web-b": "10.244.0.22"}
# Registered as ready, but nothing listens in its namespace: connects are refused.
DEAD = ("web-dead", "10.244.0.29")
CLIENT_IP = "10.244.0.60"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster() as cluster:
        for name, ip in LIVE.items():
            cluster.add_pod(name, ip)
            cluster.start_backend(name)
        cluster.add_pod(DEAD[0], DEAD[1])
        cluster.add_pod("client", CLIENT_IP)
        args = ["--proxy-mode", "userspace", "--node-ip", NODE_IP, "--min-sync-period", "200ms"]
        portal = Portal(tmp_path_factory.mktemp("userspace"), args, proxy=True).start()
        cluster.portal = portal
        core = portal.core()
        for name, ip in LIVE.items():
            register_pod(core, name, ip, {"app": "web", "alive": "yes"})
        register_pod(core, DEAD[0], DEAD[1], {"app": "web", "alive": "no"})
        try:
            yield cluster
        finally:
            portal.stop()


def serve(cluster, name, selector, **spec):
    """Creates a Service; returns it once its redirect is in the kernel."""
    core = cluster.portal.core()
    service = make_service(core, name, selector=selector, **spec)
    port = service.spec.ports[0]
    wanted = f"{service.spec.cluster_ip} . {port.protocol.lower()} . {port.port} : goto svc-"
    wait_for(lambda: wanted in sh("nft", "list", "map", "ip", "portal", "cluster-ips", check=False), f"the redirect of {name}")
    return core.read_namespaced_service(name, NS)


def test_round_robin_with_a_dead_backend_loses_no_request(cluster):
    service = serve(cluster, "web", {"app": "web"}, type="NodePort")
    # Every Service port's only "endpoint" in the kernel is the proxy's listener.
    assert f"dnat to {NODE_IP}:" in sh("nft", "list", "table", "ip", "portal")
    for pod, host, port in ((
        "client", service.spec.cluster_ip, 80), (None, service.spec.cluster_ip, 80), ("client", NODE_IP, service.spec.ports[0].node_port)):
        result = cluster.client(pod, host, port, count=300)
        assert result["failures"] == 0, (host, port, result)
        assert set(result["answers"]) == set(LIVE), (host, port, result)
        # Round robin: the dead backend's turns went to the next one.
        assert min(result["answers"].values()) >= 90, result
        # The proxy connects from the node.
        assert result["peers"] == [GATEWAY], result


def test_client_ip_affinity_pins_one_backend(cluster):
    service = serve(cluster, "sticky", {"app": "web", "alive": "yes"}, sessionAffinity="ClientIP")
    result = cluster.client("client", service.spec.cluster_ip, 80, count=100)
    assert result["failures"] == 0 and len(result["answers"]) == 1, result


def test_udp_sessions(cluster):
    ports = [{"name": "echo", "port": 53, "protocol": "UDP", "targetPort": "echo"}]
    service = serve(cluster, "echo", {"app": "web", "alive": "yes"}, ports=ports)
    answers = set()
    for _ in range(6):
        # One client socket is one session: one backend.
        result = cluster.client("client", service.spec.cluster_ip, 53, count=5, udp=True)
        assert result["failures"] == 0 and len(result["answers"]) == 1, result
        answers |= set(result["answers"])
    assert answers == set(LIVE)


def test_a_node_port_is_reused_after_its_service_is_recreated(cluster):
    """The listeners of a deleted Service are closed (UDP sessions too), so
    a new Service can take the same node ports at once."""
    core = cluster.portal.core()
    ports = [{"name": "http", "port": 80, "targetPort": "web", "nodePort": 30555},
             {"name": "echo", "port": 53, "protocol": "UDP", "targetPort": "echo", "nodePort": 30555}]
    for round_ in range(2):
        serve(cluster, "again", {"app": "web", "alive": "yes"}, type="NodePort", ports=ports)
        tcp = cluster.client("client", NODE_IP, 30555, count=10)
        udp = cluster.client("client", NODE_IP, 30555, count=3, udp=True)
        assert tcp["failures"] == 0 and udp["failures"] == 0, (round_, tcp, udp)
        core.delete_namespaced_service("again", NS)
        wait_for(lambda: "default/again/" not in sh("nft", "list", "table", "ip", "portal", check=False), "the Service's redirect to go")


def test_bulk_transfers_both_ways_arrive_intact(cluster):
    """Large transfers take the zero-copy (splice) path; the bytes must be
    exactly the backend's, both ways, and the end of stream passed on."""
    service = serve(cluster, "bulk", {"app": "web", "alive": "yes"})
    pattern = bytes(range(256)) * 4096
    with socket.create_connection((service.spec.cluster_ip, 80), timeout=10) as conn:
        reader = conn.makefile("rb")
        reader.readline()
        conn.sendall(b"big 8\n")
        received = reader.read()
    assert len(received) == 8 * len(pattern) and received == pattern * 8
    upload = os.urandom(4 << 20)
    with socket.create_connection((service.spec.cluster_ip, 80), timeout=10) as conn:
        reader = conn.makefile("rb")
        reader.readline()
        conn.sendall(b"sink %d\n" % len(upload) + upload)
        assert reader.readline().strip().decode() == hashlib.sha256(upload).hexdigest()
