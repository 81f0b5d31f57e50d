"""The service proxy in kernel mode (issue 6, SPEC P1, P2, P4, S8–S12):
`portal server` runs in a node namespace the test creates, pods are network
namespaces on the node's bridge with real servers, registered as Pod objects
through the API; clients in a pod and on the node reach them through
Service addresses programmed in nftables."""

import re
import ssl
import socket
import subprocess
import time
import urllib.request

import pytest
from kubernetes import client

from conftest import BINARY, Portal
from support.metrics import proxy_syncs
from support.nodes import GATEWAY, NODE_IP, Cluster, answered, make_service, register_pod, result_of, set_ready, sh, wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

NS = "default"
BACKENDS = {"web-a": "10.244.0.11", "web-b": "10.244.0.12", "web-c": "10.244.0.13"}
CLIENT_IP = "10.244.0.50"
LB_POOL = "198.51.100.0/28"
EXTERNAL_IP = "192.0.2.10"


def server_args(mode):
    return ["--proxy-mode", mode, "--node-ip", NODE_IP, "--min-sync-period", "200ms", "--load-balancer-pool", LB_POOL]


def ready_endpoints(discovery, name):
    slices = discovery.list_namespaced_endpoint_slice(NS, label_selector=f"kubernetes.io/service-name={name}").items
    return {a for s in slices for e in s.endpoints or [] if (e.conditions.ready is not False) for a in e.addresses}


def table():
    return sh("nft", "list", "table", "ip", "portal", check=False)


def chain(name):
    return sh("nft", "list", "chain", "ip", "portal", f"svc-{NS}/{name}/tcp/http", check=False)


def wait_rules(*needles, absent=()):
    """Waits until Portal's table shows every needle and none of `absent`."""
    def check():
        text = table()
        return all(n in text for n in needles) and not any(a in text for a in absent)
    wait_for(check, f"rules with {needles} without {absent}")


def normalized(listing):
    """A listing without affinity timers, order-free (elements of a
    rebuilt map may be listed in another order)."""
    listing = re.sub(r"expires [0-9hms.]+", "", listing)
    return sorted(t.strip() for t in re.split(r"[,{}\n]", listing) if t.strip())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster() as cluster:
        for name, ip in BACKENDS.items():
            cluster.add_pod(name, ip)
            cluster.start_backend(name)
        cluster.add_pod("client", CLIENT_IP)
        portal = Portal(tmp_path_factory.mktemp("proxy"), server_args("nftables"), proxy=True).start()
        cluster.portal = portal
        core = portal.core()
        for name, ip in BACKENDS.items():
            register_pod(core, name, ip, {"app": "web"})
        try:
            yield cluster
        finally:
            portal.stop()


def serve(cluster, name, **spec):
    """Creates a Service of the three backends; returns it once the kernel has its rules."""
    core = cluster.portal.core()
    service = make_service(core, name, **spec)
    port = service.spec.ports[0]
    protocol = port.protocol.lower()
    wait_rules(f"{service.spec.cluster_ip} . {protocol} . {port.port} : goto svc-{NS}/{name}/")
    # All three backends in the Service's chain.
    text = lambda: sh("nft", "list", "chain", "ip", "portal", f"svc-{NS}/{name}/{protocol}/{port.name}", check=False)
    wait_for(lambda: all(f"dnat to {ip}:" in text() for ip in BACKENDS.values()), f"the backends of {name}")
    return core.read_namespaced_service(name, NS)


def test_cluster_ip_reaches_every_ready_backend_from_a_pod_and_the_node(cluster):
    service = serve(cluster, "web")
    vip = service.spec.cluster_ip
    from_pod = cluster.client("client", vip, 80, count=300)
    assert from_pod["failures"] == 0, from_pod
    assert set(from_pod["answers"]) == set(BACKENDS), from_pod
    # Random choice: every backend gets a fair share (expected 100 each).
    assert min(from_pod["answers"].values()) > 50, from_pod
    # The client's own address is kept for cluster-IP traffic (P2).
    assert from_pod["peers"] == [CLIENT_IP]
    from_node = cluster.client(None, vip, 80, count=300)
    assert from_node["failures"] == 0 and set(from_node["answers"]) == set(BACKENDS), from_node
    # The server's /healthz includes its proxy's health.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    assert urllib.request.urlopen(cluster.portal.server + "/healthz", context=context, timeout=5).status == 200


def test_client_ip_affinity_pins_one_backend(cluster):
    service = serve(cluster, "sticky", sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}})
    result = cluster.client("client", service.spec.cluster_ip, 80, count=100)
    assert result["failures"] == 0 and len(result["answers"]) == 1, result


def test_node_port_external_ip_and_load_balancer_address(cluster):
    serve(cluster, "public", type="LoadBalancer", externalIPs=[EXTERNAL_IP])
    core = cluster.portal.core()
    ingress = wait_for(lambda: (core.read_namespaced_service("public", NS).status.load_balancer.ingress or [None])[0], "a load-balancer address")
    service = core.read_namespaced_service("public", NS)
    wait_rules(f"{ingress.ip} . tcp . 80", f"{EXTERNAL_IP} . tcp . 80")
    node_port = service.spec.ports[0].node_port
    for host, port in ((NODE_IP, node_port), (EXTERNAL_IP, 80), (ingress.ip, 80)):
        result = cluster.client("client", host, port, count=60)
        assert result["failures"] == 0 and set(result["answers"]) == set(BACKENDS), (host, port, result)
        # Masqueraded: the endpoint may be on another node and must answer through this one.
        assert result["peers"] == [GATEWAY], (host, port, result)
    from_node = cluster.client(None, NODE_IP, node_port, count=30)
    assert from_node["failures"] == 0, from_node


def test_udp_service(cluster):
    service = serve(cluster, "echo", ports=[{"name": "echo", "port": 53, "protocol": "UDP", "targetPort": "echo"}])
    # A fresh socket per run of the client: one run is one flow (one backend).
    answers = set()
    # 3 x (2/3)^30 = 2e-5: the chance random choice misses a backend.
    for _ in range(30):
        result = cluster.client("client", service.spec.cluster_ip, 53, count=3, udp=True)
        assert result["failures"] == 0 and len(result["answers"]) == 1, result
        answers |= set(result["answers"])
        if answers == set(BACKENDS):
            break
    assert answers == set(BACKENDS)


def test_udp_flow_moves_when_its_endpoint_leaves(cluster):
    """UDP has no connection to end: the conntrack entry must be deleted or
    the flow keeps going to the removed endpoint (P2)."""
    ports = [{"name": "echo", "port": 53, "protocol": "UDP", "targetPort": "echo"}]
    vip = serve(cluster, "echo-flow", ports=ports).spec.cluster_ip
    core = cluster.portal.core()
    flow = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flow.settimeout(2)
    flow.sendto(b"ping", (vip, 53))
    first = flow.recvfrom(2048)[0].decode().split()[0]
    set_ready(core, first, BACKENDS[first], False)
    try:
        wait_for(lambda: f"dnat to {BACKENDS[first]}:" not in sh("nft", "list", "chain", "ip", "portal", f"svc-{NS}/echo-flow/udp/echo"), f"{first} out of the rules", timeout=5)
        # Same socket, same flow: answered by another backend once the
        # conntrack entry is deleted (right after the rules change). Without
        # the deletion every datagram keeps the entry alive and goes to `first`.
        def moved():
            flow.sendto(b"ping", (vip, 53))
            return flow.recvfrom(2048)[0].decode().split()[0] != first
        wait_for(moved, "the flow to move", timeout=3)
    finally:
        flow.close()
        set_ready(core, first, BACKENDS[first], True)
        wait_for(lambda: f"dnat to {BACKENDS[first]}:" in sh("nft", "list", "chain", "ip", "portal", f"svc-{NS}/echo-flow/udp/echo"), f"{first} back in the rules")


def test_service_without_endpoints_refuses_connections(cluster):
    core = cluster.portal.core()
    body = {"metadata": {"name": "empty"}, "spec": {"selector": {"app": "nothing"}, "ports": [{"port": 80}]}}
    vip = core.create_namespaced_service(NS, body).spec.cluster_ip
    wait_rules(f"{vip} . tcp . 80 : goto reject-no-endpoints")
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((vip, 80), timeout=5)
    assert time.monotonic() - started < 2


def test_a_pod_reaches_itself_through_its_service(cluster):
    """Hairpin: the backend pod connects to its own Service; DNAT sends the
    packet back where it came from, so it is masqueraded (else the reply
    would bypass the NAT)."""
    core = cluster.portal.core()
    cluster.add_pod("web-solo", "10.244.0.14")
    cluster.start_backend("web-solo")
    register_pod(core, "web-solo", "10.244.0.14", {"app": "solo"})
    body = {"metadata": {"name": "solo"}, "spec": {"selector": {"app": "solo"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}}
    vip = core.create_namespaced_service(NS, body).spec.cluster_ip
    wait_rules(f"{vip} . tcp . 80 : goto svc-")
    result = cluster.client("web-solo", vip, 80, count=20)
    assert result["failures"] == 0 and result["answers"] == {"web-solo": 20}, result
    # It saw the node's address, not its own.
    assert result["peers"] == [GATEWAY], result


def test_no_endpoints_is_refused_from_a_pod_too(cluster):
    core = cluster.portal.core()
    body = {"metadata": {"name": "empty-too"}, "spec": {"selector": {"app": "nothing"}, "ports": [{"port": 8080}]}}
    vip = core.create_namespaced_service(NS, body).spec.cluster_ip
    wait_rules(f"{vip} . tcp . 8080 : goto reject-no-endpoints")
    result = cluster.client("client", vip, 8080, count=3)
    assert result["failures"] == 3 and all("ConnectionRefused" in e for e in result["errors"]), result


def test_headless_service_is_not_proxied(cluster):
    core = cluster.portal.core()
    make_service(core, "headless", clusterIP="None")
    # A Service created after it is programmed, so the headless one was seen.
    later = make_service(core, "after-headless")
    wait_rules(f"{later.spec.cluster_ip} . tcp . 80")
    assert "default/headless/" not in table()


def test_unready_endpoint_gets_no_new_connections_after_one_sync(cluster):
    service = cluster.portal.core().read_namespaced_service("web", NS)
    core = cluster.portal.core()
    discovery = client.DiscoveryV1Api(cluster.portal.api_client())
    set_ready(core, "web-c", BACKENDS["web-c"], False)
    try:
        wait_for(lambda: ready_endpoints(discovery, "web") == {BACKENDS["web-a"], BACKENDS["web-b"]}, "web-c to leave")
        # One sync later (min-sync-period 200ms) the kernel has it.
        wait_for(lambda: BACKENDS["web-c"] not in chain("web"), "web-c out of the rules", timeout=3)
        result = cluster.client("client", service.spec.cluster_ip, 80, count=200)
        assert result["failures"] == 0 and set(result["answers"]) == {"web-a", "web-b"}, result
    finally:
        set_ready(core, "web-c", BACKENDS["web-c"], True)
        wait_for(lambda: BACKENDS["web-c"] in chain("web"), "web-c back in the rules")


def test_killed_proxy_keeps_traffic_and_restart_disturbs_nothing(cluster):
    vip = cluster.portal.core().read_namespaced_service("web", NS).spec.cluster_ip
    before = table()
    # A long-lived connection, and new connections all along (until the
    # test has seen them through the kill, the time without a proxy and
    # the restarted proxy's first sync).
    held = socket.create_connection((vip, 80), timeout=5)
    first = held.makefile().readline().split()[0]
    progress, stop = cluster.portal.data_dir / "load.progress", cluster.portal.data_dir / "load.stop"
    load = cluster.client("client", vip, 80, background=True, until=stop, progress=progress)
    try:
        wait_for(lambda: answered(progress) >= 20, "the load answered before the kill")
        cluster.portal.kill()
        # No proxy running now: new connections keep being answered.
        killed = answered(progress)
        wait_for(lambda: answered(progress) >= killed + 50, "the load answered with the proxy down")
        cluster.portal.start()
        wait_for(lambda: proxy_syncs(cluster.portal) >= 1, "the first sync after the restart")
        synced = answered(progress)
        wait_for(lambda: answered(progress) >= synced + 20, "the load answered after the restarted proxy's first sync")
    finally:
        stop.touch()
    result = result_of(load)
    assert result["failures"] == 0 and set(result["answers"]) == set(BACKENDS), result
    held.sendall(b"again\n")
    assert held.makefile().readline().split()[0] == first
    held.close()
    # Only the `kubernetes` Service moved: the restarted API server took another free port.
    same = lambda listing: [t for t in normalized(listing) if f"dnat to {NODE_IP}:" not in t]
    assert same(table()) == same(before)


def test_cleanup_removes_the_table_the_proxy_left(tmp_path):
    """The proxy's rules outlive it (traffic keeps flowing); `portal proxy
    --cleanup` removes them, and says so when there is nothing to remove."""
    with Cluster():
        portal = Portal(tmp_path, server_args("nftables"), proxy=True).start()
        try:
            core = portal.core()
            service = core.create_namespaced_service(NS, {"metadata": {"name": "left"}, "spec": {"ports": [{"port": 80}]}})
            wait_rules(service.spec.cluster_ip)
        finally:
            portal.stop()
        assert service.spec.cluster_ip in table(), "the rules stay when the proxy stops"
        first = subprocess.run([BINARY, "proxy", "--cleanup"], capture_output=True, text=True, timeout=30)
        assert first.returncode == 0, first.stderr
        assert table() == "", "the table is gone"
        again = subprocess.run([BINARY, "proxy", "--cleanup"], capture_output=True, text=True, timeout=30)
        assert again.returncode == 0 and "nothing to clean up" in again.stdout + again.stderr
