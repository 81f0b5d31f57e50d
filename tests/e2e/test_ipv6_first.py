"""An IPv6-first cluster (issue 31): the service and pod ranges list IPv6
first, so IPv6 is the cluster's primary family. The kubernetes and
kube-dns Services get IPv6 cluster IPs (the API server advertises the
node's IPv6 address, the cluster DNS answers on it), pods' first address
is IPv6 and their nameserver the IPv6 kube-dns address, and a Service that
names no family is single-stack IPv6 and works from a pod on either node,
by name and by address."""

import pytest

from support.cluster_bed import NAMES, Bed, placed_pod
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

IPV6_FIRST = [
    "--cluster-cidr", "fd00:10:244::/56,10.244.0.0/16",
    "--service-cluster-ip-range", "fd00:10:96::/112,10.96.0.0/16",
]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v6first")
    # The API server listens on both families: its Service endpoint is IPv6.
    with Bed(tmp, count=2, ipv6=True, server_extra=IPV6_FIRST, api_bind="[::]:0") as bed:
        items = [placed_pod(f"server-{i}", bed.image, NAMES[i], {"app": "server"}, ["/bin/serve"]) for i in (1, 2)]
        items.append(placed_pod("client", bed.image, NAMES[2], {"app": "client"}, ["sleep", "3600"]))
        items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                      "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        bed.create(items)
        for name in ("server-1", "server-2", "client"):
            wait_for(lambda name=name: bed.pod_ready(name), f"{name} ready", timeout=120)
        yield bed


def in_client(bed, *command):
    result = bed.kubectl("exec", "client", "--", *command, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def test_the_cluster_services_are_ipv6(bed):
    kubernetes = bed.core.read_namespaced_service("kubernetes", "default").spec
    assert kubernetes.cluster_ip == "fd00:10:96::1" and kubernetes.ip_families == ["IPv6"], kubernetes
    # Its endpoint is the API server's advertised (IPv6) address.
    endpoints = bed.core.read_namespaced_endpoints("kubernetes", "default")
    assert [a.ip for a in endpoints.subsets[0].addresses] == [bed.lan.address6(1)], endpoints
    dns = bed.core.read_namespaced_service("kube-dns", "kube-system").spec
    assert dns.cluster_ip == "fd00:10:96::a" and dns.ip_families == ["IPv6"], dns
    dns_endpoints = bed.core.read_namespaced_endpoints("kube-dns", "kube-system")
    assert [a.ip for a in dns_endpoints.subsets[0].addresses] == [bed.lan.address6(1)], dns_endpoints


def test_nodes_and_pods_list_ipv6_first(bed):
    for name in (NAMES[1], NAMES[2]):
        ranges = bed.core.read_node(name).spec.pod_cidrs
        assert ranges[0].startswith("fd00:10:244:") and ranges[1].startswith("10.244."), ranges
    status = bed.core.read_namespaced_pod("client", "default").status
    ips = [ip.ip for ip in status.pod_ips]
    assert ":" in status.pod_ip and ips[0] == status.pod_ip and "." in ips[1], ips
    resolv = in_client(bed, "cat", "/etc/resolv.conf")
    assert "nameserver fd00:10:96::a" in resolv, resolv


def test_a_service_of_no_family_is_ipv6_and_answers(bed):
    spec = bed.core.read_namespaced_service("web", "default").spec
    assert spec.ip_family_policy == "SingleStack" and spec.ip_families == ["IPv6"], spec
    assert spec.cluster_ips == [spec.cluster_ip] and spec.cluster_ip.startswith("fd00:10:96::"), spec
    slices = bed.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o",
                         "jsonpath={.items[*].addressType}").stdout.split()
    assert slices == ["IPv6"], slices
    # By address, then by name through the IPv6 cluster DNS (on the other
    # node: the client runs on node 2, the DNS on node 1).
    answer = wait_for(lambda: in_client(bed, "timeout", "5", "wget", "-qO-", f"http://[{spec.cluster_ip}]/name.txt"),
                      "the Service's IPv6 cluster IP answering", timeout=30)
    assert answer in ("server-1", "server-2"), answer
    seen = {in_client(bed, "timeout", "5", "wget", "-qO-", "http://web/name.txt") for _ in range(16)}
    assert seen == {"server-1", "server-2"}, seen
    lookup = in_client(bed, "nslookup", "-type=AAAA", "web.default.svc.cluster.local")
    assert spec.cluster_ip in lookup, lookup


def test_pods_reach_the_api_server_at_its_ipv6_service_address(bed):
    """`KUBERNETES_SERVICE_HOST` is the IPv6 cluster IP, and a connection
    to it reaches the API server (TLS on the other side: a TCP connect)."""
    env = in_client(bed, "env")
    assert "KUBERNETES_SERVICE_HOST=fd00:10:96::1" in env, env
    assert in_client(bed, "sh", "-c", "timeout 5 nc fd00:10:96::1 443 </dev/null && echo connected") == "connected"
