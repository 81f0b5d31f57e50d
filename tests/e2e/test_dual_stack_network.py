"""Dual-stack pods and Services on the wire (issue 31): two nodes on a LAN
with an IPv4 and an IPv6 address each, a cluster whose pod and service
ranges have both families. Every pod gets an address of each family;
pods reach each other over IPv6 across nodes (host-gw routes via the
nodes' IPv6 InternalIPs); a RequireDualStack Service's two cluster IPs
both reach every backend from a pod, its NodePort answers on both node
addresses from outside the nodes, and the cluster DNS gives A and AAAA.
A third node runs the userspace proxy: its listeners serve both
families too."""

import json
import subprocess

import pytest

from support.cluster_bed import NAMES, Bed, placed_pod
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

DUAL = [
    "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56",
    "--service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112",
]
# Bounded: enough tries that missing a backend by chance is ~1e-6.
TRIES = 24


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dualnet")
    with Bed(tmp, count=3, ipv6=True, server_extra=DUAL, proxy_modes={3: "userspace"}) as bed:
        items = [placed_pod(f"server-{i}", bed.image, NAMES[i], {"app": "server"}, ["/bin/serve"]) for i in (1, 2)]
        items.append(placed_pod("client", bed.image, NAMES[1], {"app": "client"}, ["sleep", "3600"]))
        items.append(placed_pod("client-3", bed.image, NAMES[3], {"app": "userspace-client"}, ["sleep", "3600"]))
        items.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                      "spec": {"type": "NodePort", "ipFamilyPolicy": "RequireDualStack", "selector": {"app": "server"},
                               "ports": [{"port": 80, "targetPort": 8080}]}})
        bed.create(items)
        for name in ("server-1", "server-2", "client", "client-3"):
            wait_for(lambda name=name: bed.pod_ready(name), f"{name} ready", timeout=120)
        yield bed


def pod_ips(bed, name):
    return [ip.ip for ip in bed.core.read_namespaced_pod(name, "default").status.pod_ips]


def fetch(bed, host, port=80, path="name.txt", pod="client"):
    """GET from the client pod; the body or None."""
    target = f"[{host}]" if ":" in host else host
    result = bed.kubectl("exec", pod, "--", "timeout", "5", "wget", "-qO-", f"http://{target}:{port}/{path}", check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def test_pods_and_nodes_have_both_families(bed):
    for i in (1, 2):
        node = bed.core.read_node(NAMES[i])
        v4_range, v6_range = node.spec.pod_cidrs
        assert v4_range.startswith("10.244.") and v4_range.endswith(".0/24") and node.spec.pod_cidr == v4_range
        assert v6_range.startswith("fd00:10:244:") and v6_range.endswith("::/64"), v6_range
        internal = [a.address for a in node.status.addresses if a.type == "InternalIP"]
        assert internal == [bed.lan.address(i), bed.lan.address6(i)], internal
    v4, v6 = pod_ips(bed, "server-2")
    assert v4.startswith("10.244.") and v6.startswith("fd00:10:244:"), (v4, v6)
    # The pod's IPv6 address sits at its IPv4 address's place in its node's range.
    assert v6.rsplit(":", 1)[1] == format(int(v4.rsplit(".", 1)[1]), "x")
    status = bed.core.read_namespaced_pod("server-2", "default").status
    assert [h.ip for h in status.host_ips] == [bed.lan.address(2), bed.lan.address6(2)]
    hosts = bed.kubectl("exec", "client", "--", "cat", "/etc/hosts").stdout
    client_v4, client_v6 = pod_ips(bed, "client")
    assert f"{client_v4}\tclient" in hosts and f"{client_v6}\tclient" in hosts, hosts


def test_pods_reach_each_other_over_ipv6_across_nodes(bed):
    _, v6 = pod_ips(bed, "server-2")
    assert fetch(bed, v6, 8080) == "server-2"
    # The server sees the client's own IPv6 address (routed, not NATed).
    _, client_v6 = pod_ips(bed, "client")
    # (busybox httpd writes an IPv6 REMOTE_ADDR in brackets.)
    assert fetch(bed, v6, 8080, "cgi-bin/peer") == f"[{client_v6}]"


def test_both_cluster_ips_reach_every_backend(bed):
    spec = bed.core.read_namespaced_service("web", "default").spec
    assert spec.ip_families == ["IPv4", "IPv6"] and len(spec.cluster_ips) == 2
    for ip in spec.cluster_ips:
        # Once the client's node has programmed it (it answers), count.
        seen = {wait_for(lambda ip=ip: fetch(bed, ip), f"{ip} answering", timeout=30)}
        for _ in range(TRIES):
            seen.add(fetch(bed, ip))
            if seen >= {"server-1", "server-2"}:
                break
        assert seen == {"server-1", "server-2"}, (ip, seen)


def test_the_userspace_proxy_serves_both_families(bed):
    """Node 3's proxy runs in userspace: an `ip` and an `ip6` table send
    both cluster IPs to its listeners on the node's two addresses, which
    reach every backend; its NodePort listens on both families."""
    spec = bed.core.read_namespaced_service("web", "default").spec
    for ip in spec.cluster_ips:
        seen = {wait_for(lambda ip=ip: fetch(bed, ip, pod="client-3"), f"{ip} answering on node 3", timeout=30)}
        for _ in range(TRIES):
            seen.add(fetch(bed, ip, pod="client-3"))
            if seen >= {"server-1", "server-2"}:
                break
        assert seen == {"server-1", "server-2"}, (ip, seen)
    # The listener connects from the node: the backend (on node 1 or 2)
    # sees node 3's IPv6 address.
    peer = fetch(bed, spec.cluster_ips[1], path="cgi-bin/peer", pod="client-3")
    assert peer == f"[{bed.lan.address6(3)}]", peer
    node_port = spec.ports[0].node_port
    get = lambda: bed.lan.run("lan", "curl", "-s", "--max-time", "5",
                              f"http://[{bed.lan.address6(3)}]:{node_port}/name.txt", check=False)
    result = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(get()), "node 3's IPv6 node port", timeout=30)
    assert result.stdout.strip() in ("server-1", "server-2"), result
    table = bed.lan.run(3, "nft", "list", "table", "ip6", "portal", check=False).stdout
    assert f"dnat to [{bed.lan.address6(3)}]:" in table or f"dnat ip6 to [{bed.lan.address6(3)}]:" in table, table


def test_a_single_stack_ipv6_service_works(bed):
    body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "six", "namespace": "default"},
            "spec": {"ipFamilies": ["IPv6"], "selector": {"app": "server"}, "sessionAffinity": "ClientIP",
                     "ports": [{"port": 8000, "targetPort": 8080}]}}
    bed.create([body])
    try:
        spec = bed.core.read_namespaced_service("six", "default").spec
        assert spec.ip_family_policy == "SingleStack" and spec.ip_families == ["IPv6"], spec
        (ip,) = spec.cluster_ips
        # The proxy programs it once it sees it: the first answer.
        first = wait_for(lambda: fetch(bed, ip, 8000), "the IPv6 Service answering", timeout=30)
        assert first in ("server-1", "server-2")
        # ClientIP affinity (the ip6 table's affinity sets): the same backend.
        assert {fetch(bed, ip, 8000) for _ in range(6)} == {first}
        slices = bed.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=six", "-o",
                             "jsonpath={.items[*].addressType}").stdout.split()
        assert slices == ["IPv6"], slices
    finally:
        bed.kubectl("delete", "service", "six", check=False)


def test_node_port_answers_on_both_node_addresses_from_outside(bed):
    node_port = bed.core.read_namespaced_service("web", "default").spec.ports[0].node_port
    for address in (bed.lan.address(2), f"[{bed.lan.address6(2)}]"):
        get = lambda address=address: bed.lan.run("lan", "curl", "-s", "--max-time", "5",
                                                  f"http://{address}:{node_port}/name.txt", check=False)
        result = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(get()), f"{address} answering", timeout=30)
        assert result.stdout.strip() in ("server-1", "server-2"), (address, result)


def test_dns_answers_a_and_aaaa_inside_a_pod(bed):
    spec = bed.core.read_namespaced_service("web", "default").spec
    out = bed.kubectl("exec", "client", "--", "nslookup", "-type=AAAA", "web.default.svc.cluster.local").stdout
    assert spec.cluster_ips[1] in out, out
    out = bed.kubectl("exec", "client", "--", "nslookup", "-type=A", "web.default.svc.cluster.local").stdout
    assert spec.cluster_ips[0] in out, out


def test_network_policy_isolates_over_ipv6_too(bed):
    """A default deny for the servers holds on both families (no way
    around it over IPv6); admitting the client's pods opens both."""
    v4, v6 = pod_ips(bed, "server-2")
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "servers", "namespace": "default"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]}}

    def apply(policy):
        subprocess.run(["kubectl", "--kubeconfig", str(bed.portal.kubeconfig), "apply", "-f", "-"],
                       input=json.dumps(policy), capture_output=True, text=True, timeout=60, check=True)

    apply(deny)
    try:
        # The agents apply it once they see it: the first refused fetch.
        wait_for(lambda: fetch(bed, v6, 8080) is None, "IPv6 to the server cut off", timeout=30)
        assert fetch(bed, v4, 8080) is None
        deny["spec"]["ingress"] = [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]
        apply(deny)
        assert wait_for(lambda: fetch(bed, v6, 8080), "IPv6 from the client admitted", timeout=30) == "server-2"
        assert fetch(bed, v4, 8080) == "server-2"
    finally:
        bed.kubectl("delete", "networkpolicy", "servers", check=False)
