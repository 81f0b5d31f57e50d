"""NetworkPolicy (issue 31), enforced by each node's agent in its nftables
table `ip portal_policy`, on two nodes of a LAN the test makes: a default
deny in namespace `a` cuts pods of `b` off (the connection times out, it is
not refused), on the same node and across nodes, directly and through a
Service, while the node still reaches them; a policy admitting namespace
`b` lets them in again; a running connection outlives an unrelated change
and even the removal of the policy that let it in (new ones are dropped);
an egress policy leaves a
pod only DNS (to the cluster DNS, picked as Kubernetes users pick CoreDNS's
pods) and then the servers' named port."""

import select
import subprocess
import time

import pytest
import yaml

from support.cluster_bed import NAMES, Bed
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

# The servers answer HTTP on 8080 ("http") and echo lines on 9000 ("echo").
SERVER = "nc -ll -p 9000 -e cat & exec /bin/serve"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("netpol")
    with Bed(tmp, count=2) as bed:
        bed.kubectl("create", "namespace", "a")
        bed.kubectl("create", "namespace", "b")
        bed.kubectl("label", "namespace", "b", "team=b")
        pods = []
        for i in (1, 2):
            pods.append(pod("a", f"server-{i}", bed.image, NAMES[i], {"app": "server"}, ["sh", "-c", SERVER],
                            ports=[{"name": "http", "containerPort": 8080}, {"name": "echo", "containerPort": 9000}]))
            pods.append(pod("b", f"client-{i}", bed.image, NAMES[i], {"app": "client"}, ["sleep", "3600"]))
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server", "namespace": "a"},
                   "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]}}
        apply(bed, tmp, "pods", [*pods, service])
        for ns, name in [("a", "server-1"), ("a", "server-2"), ("b", "client-1"), ("b", "client-2")]:
            wait_for(lambda ns=ns, name=name: ready(bed, ns, name), f"{ns}/{name} ready", timeout=120)
        bed.tmp_dir = tmp
        try:
            yield bed
        finally:
            bed.kubectl("delete", "namespace", "a", "b", "--wait=true", "--timeout=90s", check=False)


def pod(namespace, name, image, node, labels, command, ports=()):
    container = {"name": "main", "image": image, "command": command, "ports": list(ports)}
    if ports:
        # The node probes its pods: policies never stop that.
        container["readinessProbe"] = {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [container]}}


def apply(bed, tmp, name, objects):
    path = tmp / f"{name}-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    bed.kubectl("apply", "-f", str(path))


def ready(bed, namespace, name):
    pod = bed.core.read_namespaced_pod(name, namespace)
    statuses = pod.status.container_statuses or []
    return pod.status.phase == "Running" and statuses and all(s.ready for s in statuses)


def ip_of(bed, namespace, name):
    return bed.core.read_namespaced_pod(name, namespace).status.pod_ip


def fetch(bed, client, url):
    """`wget` from pod b/`client`: the body, or "timeout" / "refused" / the error."""
    # busybox's own `wget -T` crashes (Debian's 1.35): `timeout` stops it.
    result = bed.kubectl("exec", "-n", "b", client, "--", "timeout", "3", "wget", "-qO-", url, check=False)
    if result.returncode == 0:
        return result.stdout.strip()
    if "exit code 143" in result.stderr or "exit code 124" in result.stderr:
        return "timeout"
    if "refused" in result.stderr:
        return "refused"
    return result.stderr.strip()


def table(bed, node):
    return bed.lan.run(node, "nft", "list", "table", "ip", "portal_policy", check=False).stdout


def wait_enforced(bed, text, nodes=(1, 2), present=True):
    """Until every node's policy table says `text` (or no longer does)."""
    for node in nodes:
        wait_for(lambda node=node: (text in table(bed, node)) == present,
                 f"node-{node}'s policy table {'with' if present else 'without'} {text!r}", timeout=30)


def policy(name, namespace, spec):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_default_deny_then_a_namespace_selector(bed):
    servers = {i: ip_of(bed, "a", f"server-{i}") for i in (1, 2)}
    service = bed.core.read_namespaced_service("server", "a").spec.cluster_ip
    # Before any policy every pod reaches every other.
    for client in ("client-1", "client-2"):
        for i in (1, 2):
            assert fetch(bed, client, f"http://{servers[i]}:8080/name.txt") == f"server-{i}"

    apply(bed, bed.tmp_dir, "deny", [policy("deny-all", "a", {"podSelector": {}, "policyTypes": ["Ingress"]})])
    wait_enforced(bed, '"a/server-1: ingress not allowed"', nodes=(1,))
    wait_enforced(bed, '"a/server-2: ingress not allowed"', nodes=(2,))
    listed = bed.kubectl("get", "networkpolicy", "-n", "a").stdout
    assert listed.split("\n")[0].split() == ["NAME", "POD-SELECTOR", "AGE"] and "deny-all" in listed, listed
    # Same node, across nodes, and through the Service: dropped, so the
    # connection times out rather than being refused.
    assert fetch(bed, "client-1", f"http://{servers[1]}:8080/name.txt") == "timeout"
    assert fetch(bed, "client-2", f"http://{servers[1]}:8080/name.txt") == "timeout"
    assert fetch(bed, "client-1", f"http://{servers[2]}:8080/name.txt") == "timeout"
    assert fetch(bed, "client-2", f"http://{service}/name.txt") == "timeout"
    # The node itself still reaches its pods (so its probes pass).
    for i in (1, 2):
        from_node = bed.lan.run(i, "wget", "-qO-", "-T", "3", f"http://{servers[i]}:8080/name.txt", check=False)
        assert from_node.stdout.strip() == f"server-{i}", from_node

    allow = policy("from-b", "a", {"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [
        {"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": "http"}, {"port": 9000}]}]})
    apply(bed, bed.tmp_dir, "allow", [allow])
    wait_enforced(bed, '"a/from-b"')
    for client in ("client-1", "client-2"):
        for i in (1, 2):
            assert fetch(bed, client, f"http://{servers[i]}:8080/name.txt") == f"server-{i}", (client, i)
        assert fetch(bed, client, f"http://{service}/name.txt") in ("server-1", "server-2")
    # Only the ports named: 8081 is still dropped.
    assert fetch(bed, "client-1", f"http://{servers[1]}:8081/") == "timeout"


def echoed(echo, line):
    """Sends `line` on the running `nc` and reads what comes back (None after 10 s)."""
    echo.stdin.write(line + "\n")
    echo.stdin.flush()
    ready, _, _ = select.select([echo.stdout], [], [], 10)
    return echo.stdout.readline().strip() if ready else None


def test_a_running_connection_outlives_policy_changes(bed):
    server = ip_of(bed, "a", "server-2")
    from_b = policy("from-b", "a", {"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [
        {"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": "http"}, {"port": 9000}]}]})
    apply(bed, bed.tmp_dir, "isolated", [policy("deny-all", "a", {"podSelector": {}, "policyTypes": ["Ingress"]}), from_b])
    wait_enforced(bed, '"a/from-b"')
    echo = subprocess.Popen(["kubectl", "--kubeconfig", str(bed.portal.kubeconfig), "exec", "-i", "-n", "b", "client-1",
                             "--", "nc", server, "9000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert echoed(echo, "before") == "before"
        # Another policy for the same pods: the table is written again.
        apply(bed, bed.tmp_dir, "unrelated", [policy("from-docs", "a", {
            "podSelector": {"matchLabels": {"app": "server"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]})])
        wait_enforced(bed, '"a/from-docs"')
        assert echoed(echo, "after") == "after"
        # Even the policy that let it in going: the connection is judged
        # once, when it opens; a new one is dropped.
        bed.kubectl("delete", "networkpolicy", "-n", "a", "from-b")
        wait_enforced(bed, '"a/from-b"', present=False)
        assert fetch(bed, "client-1", f"http://{server}:8080/name.txt") == "timeout"
        assert echoed(echo, "still") == "still"
    finally:
        echo.kill()
        echo.wait()


def test_egress_only_to_the_cluster_dns_then_a_named_port(bed):
    server = ip_of(bed, "a", "server-1")
    # Only egress is judged here: the servers take anyone.
    bed.kubectl("delete", "networkpolicy", "-n", "a", "--all")
    wait_enforced(bed, "jump in_", present=False)
    dns_only = policy("dns-only", "b", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"], "egress": [
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
         "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]})
    apply(bed, bed.tmp_dir, "egress", [dns_only])
    wait_enforced(bed, '"b/client-2: egress not allowed"', nodes=(2,))
    # client-2's node has no DNS of its own: its queries cross to node-1's.
    lookup = bed.kubectl("exec", "-n", "b", "client-2", "--", "nslookup", "server.a.svc.cluster.local", check=False)
    assert lookup.returncode == 0 and bed.core.read_namespaced_service("server", "a").spec.cluster_ip in lookup.stdout, lookup
    service = bed.core.read_namespaced_service("server", "a").spec.cluster_ip
    assert fetch(bed, "client-2", f"http://{server}:8080/name.txt") == "timeout"
    assert fetch(bed, "client-2", f"http://{service}/name.txt") == "timeout"

    # Named ports on egress name the destination pods' ports.
    to_http = policy("to-servers", "b", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"], "egress": [
        {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "server"}}}], "ports": [{"port": "http"}]}]})
    apply(bed, bed.tmp_dir, "egress-http", [to_http])
    wait_enforced(bed, '"b/to-servers"', nodes=(2,))
    assert fetch(bed, "client-2", f"http://{server}:8080/name.txt") == "server-1"
    assert fetch(bed, "client-2", "http://server.a.svc.cluster.local/name.txt") in ("server-1", "server-2")

    # Policies gone, isolation gone.
    bed.kubectl("delete", "networkpolicy", "-n", "b", "--all")
    wait_enforced(bed, "jump", present=False)
    # A port nothing listens on answers: refused, not dropped.
    assert fetch(bed, "client-2", f"http://{server}:8081/") == "refused"
