"""Services mean what Kubernetes says (issue 4, SPEC S1-S13): validation
messages and field paths, cluster IP and node port allocation, the
`kubernetes` Service, load balancers."""

import ipaddress
import json
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from conftest import Portal
from support.kubectl import KUBECTLS, Kubectl


def svc(name, spec):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


def create(core, body, namespace="default"):
    return core.create_namespaced_service(namespace, body)


def causes(exc):
    body = json.loads(exc.body)
    return [f"{c['field']}: {c['message']}" for c in body["details"]["causes"]]


def rejected(core, body):
    with pytest.raises(ApiException) as exc:
        create(core, body)
    assert exc.value.status == 422, exc.value.body
    return causes(exc.value)


INVALID = [
    (svc("a", {"ports": [{"port": 0}]}), "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"),
    (svc("a", {"ports": [{"port": 80}, {"port": 81}]}), "spec.ports[0].name: Required value"),
    (svc("a", {"ports": [{"name": "x", "port": 80}, {"name": "x", "port": 81}]}), 'spec.ports[1].name: Duplicate value: "x"'),
    (svc("a", {"ports": [{"port": 80, "protocol": "ICMP"}]}), 'spec.ports[0].protocol: Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"'),
    (svc("a", {"ports": [{"port": 80, "targetPort": "Not_Valid"}]}), 'spec.ports[0].targetPort: Invalid value: "Not_Valid": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)'),
    (svc("a", {"type": "Nope", "ports": [{"port": 80}]}), 'spec.type: Unsupported value: "Nope": supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort"'),
    (svc("a", {"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 90000}}}),
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 90000: must be greater than 0 and less than 86400"),
    (svc("a", {"ports": [{"port": 80}], "externalIPs": ["not-an-ip"]}), 'spec.externalIPs[0]: Invalid value: "not-an-ip": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)'),
    (svc("a", {"ports": [{"port": 80}], "loadBalancerIP": "192.0.2.1"}), "spec.loadBalancerIP: Forbidden: may only be used when `type` is 'LoadBalancer'"),
    (svc("a", {"ports": [{"port": 80, "nodePort": 30001}]}), "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"),
    (svc("a", {"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}), "spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767"),
    (svc("a", {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}),
     'spec.clusterIPs: Invalid value: []string{"10.0.0.1"}: failed to allocate IP 10.0.0.1: the provided network does not match the current range'),
    (svc("a", {"clusterIP": "10.111.255.255", "ports": [{"port": 80}]}),
     'spec.clusterIPs: Invalid value: []string{"10.111.255.255"}: failed to allocate IP 10.111.255.255: the provided IP (10.111.255.255) is not in the valid range. The range of valid IPs is 10.96.0.0/12'),
    (svc("a", {"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}), "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services"),
    (svc("a", {"type": "ExternalName"}), "spec.externalName: Required value"),
]


@pytest.mark.parametrize("body,expected", INVALID, ids=[e.split(":")[0] for _, e in INVALID])
def test_validation_messages(portal, body, expected):
    assert expected in rejected(portal.core(), body)


@pytest.mark.parametrize("binary", KUBECTLS, ids=lambda p: "kubectl-1.20" if "1.20" in p else "kubectl")
def test_kubectl_prints_the_field_path(portal, tmp_path, binary):
    kubectl = Kubectl(binary, portal, tmp_path)
    result = kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 70000, targetPort: 8080}]}\n", check=False)
    assert result.returncode != 0
    assert 'The Service "x" is invalid: spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive' in result.stderr


def test_defaults(portal):
    created = create(portal.core(), svc("d", {"ports": [{"port": 80}], "sessionAffinity": "ClientIP"}))
    port = created.spec.ports[0]
    assert (port.protocol, port.target_port) == ("TCP", 80)
    assert created.spec.type == "ClusterIP"
    assert created.spec.session_affinity_config.client_ip.timeout_seconds == 10800
    assert created.spec.ip_families == ["IPv4"]


def test_kubernetes_service(portal):
    kube = portal.core().read_namespaced_service("kubernetes", "default")
    assert kube.spec.cluster_ip == "10.96.0.1"
    assert kube.spec.ports[0].port == 443 and kube.spec.ports[0].name == "https"
    assert kube.spec.ports[0].target_port == int(portal.server.rsplit(":", 1)[1])


def test_concurrent_creates_get_distinct_addresses(portal):
    core = portal.core()
    results, errors = [], []
    lock = threading.Lock()

    def worker(offset):
        api = portal.core()
        for i in range(offset, 300, 15):
            try:
                made = create(api, svc(f"c{i}", {"type": "NodePort", "ports": [{"port": 80}]}))
            except ApiException as e:  # collected, asserted below
                with lock:
                    errors.append(e.body)
                continue
            with lock:
                results.append(made)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(results) == 300
    ips = [s.spec.cluster_ip for s in results]
    ports = [s.spec.ports[0].node_port for s in results]
    assert len(set(ips)) == 300 and len(set(ports)) == 300
    network = ipaddress.ip_network("10.96.0.0/12")
    assert all(ipaddress.ip_address(ip) in network for ip in ips)
    assert all(30000 <= p <= 32767 for p in ports)
    assert "10.96.0.1" not in ips, "the first address is the kubernetes Service's"
    stored = {s.metadata.name: s.spec.cluster_ip for s in core.list_namespaced_service("default").items}
    assert all(stored[s.metadata.name] == s.spec.cluster_ip for s in results)


def test_requested_addresses_conflict_then_free_on_delete(portal):
    core = portal.core()
    create(core, svc("one", {"clusterIP": "10.96.5.5", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30555}]}))
    taken = rejected(core, svc("two", {"clusterIP": "10.96.5.5", "ports": [{"port": 80}]}))
    assert 'spec.clusterIPs: Invalid value: []string{"10.96.5.5"}: failed to allocate IP 10.96.5.5: provided IP is already allocated' in taken
    taken = rejected(core, svc("two", {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30555}]}))
    assert "spec.ports[0].nodePort: Invalid value: 30555: provided port is already allocated" in taken
    core.delete_namespaced_service("one", "default")
    again = create(core, svc("two", {"clusterIP": "10.96.5.5", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30555}]}))
    assert again.spec.cluster_ip == "10.96.5.5" and again.spec.ports[0].node_port == 30555


def test_cluster_ip_is_immutable_and_type_changes(portal):
    core = portal.core()
    made = create(core, svc("t", {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30600}]}))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_service("t", "default", {"spec": {"clusterIP": "10.96.9.9"}})
    assert exc.value.status == 422
    assert causes(exc.value) == ['spec.clusterIPs[0]: Invalid value: []string{"10.96.9.9"}: may not change once set']
    to_cluster_ip = core.patch_namespaced_service("t", "default", {"spec": {"type": "ClusterIP"}})
    assert to_cluster_ip.spec.ports[0].node_port is None
    assert to_cluster_ip.spec.cluster_ip == made.spec.cluster_ip
    # The node port was released with the type change.
    other = create(core, svc("u", {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30600}]}))
    assert other.spec.ports[0].node_port == 30600


def test_headless_gets_no_address(portal):
    made = create(portal.core(), svc("h", {"clusterIP": "None", "selector": {"app": "h"}}))
    assert made.spec.cluster_ip == "None"


def test_allocations_survive_restart(data_dir):
    portal = Portal(data_dir).start()
    made = create(portal.core(), svc("keep", {"type": "NodePort", "ports": [{"port": 80}]}))
    portal.stop()
    portal.start()
    core = portal.core()
    taken = rejected(core, svc("copy", {"clusterIP": made.spec.cluster_ip, "ports": [{"port": 80}]}))
    assert any("provided IP is already allocated" in c for c in taken)
    port = made.spec.ports[0].node_port
    taken = rejected(core, svc("copy", {"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}))
    assert any("provided port is already allocated" in c for c in taken)
    portal.stop()


def test_full_ranges_are_clear_errors(data_dir):
    portal = Portal(data_dir, ["--service-cluster-ip-range", "10.96.0.0/29", "--service-node-port-range", "30000-30001"]).start()
    core = portal.core()
    # /29: 8 addresses, minus network, broadcast and the kubernetes Service's.
    for i in range(5):
        create(core, svc(f"f{i}", {"ports": [{"port": 80}]}))
    full = rejected(core, svc("f5", {"ports": [{"port": 80}]}))
    assert any("failed to allocate a serviceIP: range is full" in c for c in full), full
    core.delete_namespaced_service("f0", "default")
    core.delete_namespaced_service("f1", "default")
    create(core, svc("n0", {"type": "NodePort", "ports": [{"port": 80}]}))
    full = rejected(core, svc("n1", {"type": "NodePort", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}]}))
    assert any("spec.ports[1].nodePort" in c and "range is full" in c for c in full), full
    portal.stop()


def test_load_balancers_from_the_pool(data_dir):
    portal = Portal(data_dir, ["--load-balancer-pool", "192.0.2.8/30"]).start()
    core = portal.core()
    # The pinned one first: a Service content with any address may
    # otherwise take 192.0.2.10 before the pinned one exists.
    create(core, svc("pinned", {"type": "LoadBalancer", "loadBalancerIP": "192.0.2.10", "ports": [{"port": 80}]}))
    create(core, svc("lb", {"type": "LoadBalancer", "ports": [{"port": 80}]}) | {"metadata": {"name": "lb", "annotations": {"example.com/lb-option": "kept"}}})

    def ingress(name):
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = core.read_namespaced_service(name, "default").status.load_balancer
            if status.ingress:
                return status.ingress[0].ip
            time.sleep(0.05)
        return None

    first = ingress("lb")
    assert ipaddress.ip_address(first) in ipaddress.ip_network("192.0.2.8/30")
    assert ingress("pinned") == "192.0.2.10"
    assert core.read_namespaced_service("lb", "default").metadata.annotations["example.com/lb-option"] == "kept"
    core.delete_namespaced_service("pinned", "default")
    create(core, svc("next", {"type": "LoadBalancer", "loadBalancerIP": "192.0.2.10", "ports": [{"port": 80}]}))
    assert ingress("next") == "192.0.2.10", "a deleted Service's address is reused"
    # Changing the type away from LoadBalancer gives the address back.
    core.patch_namespaced_service("lb", "default", {"spec": {"type": "ClusterIP"}})
    import time

    deadline = time.monotonic() + 10
    while core.read_namespaced_service("lb", "default").status.load_balancer.ingress and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not core.read_namespaced_service("lb", "default").status.load_balancer.ingress
    portal.stop()


def test_without_pool_load_balancers_stay_pending(portal, tmp_path):
    create(portal.core(), svc("lb", {"type": "LoadBalancer", "ports": [{"port": 80}]}))
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    row = kubectl.out("get", "svc", "lb").splitlines()[1].split()
    assert row[1] == "LoadBalancer" and row[3] == "<pending>"


def test_endpoints_addresses(portal):
    core = portal.core()
    create(core, svc("manual", {"ports": [{"port": 80}]}))
    bad = {"metadata": {"name": "manual"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 80}]}]}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_endpoints("default", bad)
    assert exc.value.status == 422
    assert causes(exc.value) == ['subsets[0].addresses[0].ip: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128)']
    for ip, words in [("169.254.3.4", "link-local range"), ("224.0.0.9", "link-local multicast range")]:
        bad["subsets"][0]["addresses"][0]["ip"] = ip
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_endpoints("default", bad)
        assert words in causes(exc.value)[0]
    bad["subsets"][0]["addresses"][0]["ip"] = "10.244.0.9"
    made = core.create_namespaced_endpoints("default", bad)
    assert made.subsets[0].addresses[0].ip == "10.244.0.9"
