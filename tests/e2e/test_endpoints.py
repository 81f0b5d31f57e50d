"""Endpoints follow the pods (issue 5, SPEC E1, E2, S2): pods are created
through the API, given an IP and a Ready condition through the status
subresource, and the controller inside `portal server` keeps the Service's
Endpoints and EndpointSlices in line."""

import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from support.api import NS
from support.waiting import wait_for

# These tests' bound (their own wait_for's before support.waiting).
WAIT = 10


def make_pod(core, name, labels, port_name="web", port=8080):
    # Placed by hand, as a kubelet's pod: the tests write its status, and
    # the scheduler has nothing to say about it meanwhile.
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(node_name="test-node", containers=[client.V1Container(name="c", image="registry.local/app:1", ports=[client.V1ContainerPort(name=port_name, container_port=port)])]),
    )
    return core.create_namespaced_pod(NS, pod)


def set_status(core, name, ip, ready):
    pod = core.read_namespaced_pod(name, NS)
    condition = client.V1PodCondition(type="Ready", status="True" if ready else "False", last_transition_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    pod.status = client.V1PodStatus(phase="Running", pod_ip=ip, conditions=[condition])
    core.replace_namespaced_pod_status(name, NS, pod)


def make_service(core, name, selector, target="web"):
    body = {"metadata": {"name": name}, "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": target}]}}
    return core.create_namespaced_service(NS, body)


def addresses(core, name):
    """(ready IPs, not-ready IPs) of an Endpoints object, or None."""
    try:
        ep = core.read_namespaced_endpoints(name, NS)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    ready, unready = set(), set()
    for subset in ep.subsets or []:
        ready |= {a.ip for a in subset.addresses or []}
        unready |= {a.ip for a in subset.not_ready_addresses or []}
    return ready, unready


def slice_endpoints(discovery, name):
    slices = discovery.list_namespaced_endpoint_slice(NS, label_selector=f"kubernetes.io/service-name={name}").items
    return {(e.addresses[0], e.conditions.ready) for s in slices for e in s.endpoints or []}


def test_endpoints_list_exactly_the_ready_pods(portal):
    core = portal.core()
    discovery = client.DiscoveryV1Api(portal.api_client())
    make_service(core, "web", {"app": "web"})
    for i, ready in enumerate([True, True, False]):
        make_pod(core, f"p{i}", {"app": "web"})
        set_status(core, f"p{i}", f"10.244.0.{i + 10}", ready)
    make_pod(core, "other", {"app": "other"})
    set_status(core, "other", "10.244.0.99", True)

    wait_for(lambda: addresses(core, "web") == ({"10.244.0.10", "10.244.0.11"}, {"10.244.0.12"}), "ready pods in Endpoints", timeout=WAIT)
    wait_for(lambda: slice_endpoints(discovery, "web") == {("10.244.0.10", True), ("10.244.0.11", True), ("10.244.0.12", False)}, "EndpointSlice endpoints", timeout=WAIT)
    ep = core.read_namespaced_endpoints("web", NS)
    assert ep.subsets[0].ports[0].port == 8080 and ep.subsets[0].ports[0].name == "http"
    assert ep.subsets[0].addresses[0].target_ref.kind == "Pod"
    assert "endpoints.kubernetes.io/last-change-trigger-time" in ep.metadata.annotations
    slices = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=web").items
    assert slices[0].metadata.labels["endpointslice.kubernetes.io/managed-by"] == "endpointslice-controller.k8s.io"
    assert slices[0].address_type == "IPv4" and slices[0].ports[0].port == 8080

    # Readiness flips, relabelling and deletion are followed.
    set_status(core, "p2", "10.244.0.12", True)
    wait_for(lambda: addresses(core, "web") == ({"10.244.0.10", "10.244.0.11", "10.244.0.12"}, set()), "a pod turning ready", timeout=WAIT)
    set_status(core, "p0", "10.244.0.10", False)
    wait_for(lambda: addresses(core, "web") == ({"10.244.0.11", "10.244.0.12"}, {"10.244.0.10"}), "a pod turning unready", timeout=WAIT)
    core.patch_namespaced_pod("p1", NS, {"metadata": {"labels": {"app": "moved"}}})
    wait_for(lambda: addresses(core, "web") == ({"10.244.0.12"}, {"10.244.0.10"}), "a relabelled pod leaving", timeout=WAIT)
    core.delete_namespaced_pod("p2", NS)
    wait_for(lambda: addresses(core, "web") == (set(), {"10.244.0.10"}), "a deleted pod leaving", timeout=WAIT)
    wait_for(lambda: slice_endpoints(discovery, "web") == {("10.244.0.10", False)}, "slices following", timeout=WAIT)

    # A new selector takes other pods.
    core.patch_namespaced_service("web", NS, {"spec": {"selector": {"app": "moved"}}})
    wait_for(lambda: addresses(core, "web") == ({"10.244.0.11"}, set()), "the selector change", timeout=WAIT)

    # Deleting the Service deletes what the controller made.
    core.delete_namespaced_service("web", NS)
    wait_for(lambda: addresses(core, "web") is None, "Endpoints removed with the Service", timeout=WAIT)
    wait_for(lambda: slice_endpoints(discovery, "web") == set() and not discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=web").items, "slices removed", timeout=WAIT)


def test_named_target_port_resolves_per_pod(portal):
    core = portal.core()
    make_service(core, "named", {"app": "named"}, target="web")
    make_pod(core, "a", {"app": "named"}, port=8080)
    make_pod(core, "b", {"app": "named"}, port=9090)
    set_status(core, "a", "10.244.1.1", True)
    set_status(core, "b", "10.244.1.2", True)

    def subsets():
        ep = core.read_namespaced_endpoints("named", NS) if addresses(core, "named") else None
        if not ep or not ep.subsets:
            return None
        return sorted((s.ports[0].port, sorted(a.ip for a in s.addresses or [])) for s in ep.subsets)

    assert wait_for(lambda: subsets() == [(8080, ["10.244.1.1"]), (9090, ["10.244.1.2"])] and subsets(), "two subsets", timeout=WAIT)


def test_selectorless_endpoints_are_left_alone(portal):
    core = portal.core()
    core.create_namespaced_service(NS, {"metadata": {"name": "manual"}, "spec": {"ports": [{"port": 80}]}})
    core.create_namespaced_endpoints(NS, {"metadata": {"name": "manual"}, "subsets": [{"addresses": [{"ip": "192.0.2.7"}], "ports": [{"port": 80}]}]})
    # The controllers have seen both: the mirroring controller has made a
    # slice of the manual Endpoints, and the endpoints controller has
    # handled a Service with a selector made after them.
    discovery = client.DiscoveryV1Api(portal.api_client())
    wait_for(lambda: slice_endpoints(discovery, "manual") == {("192.0.2.7", True)}, "the manual Endpoints mirrored", timeout=WAIT)
    make_service(core, "later", {"app": "later"})
    wait_for(lambda: addresses(core, "later") is not None, "Endpoints for a later Service", timeout=WAIT)
    assert addresses(core, "manual") == ({"192.0.2.7"}, set())


def test_manual_endpoints_are_mirrored_to_slices(portal):
    core = portal.core()
    discovery = client.DiscoveryV1Api(portal.api_client())
    core.create_namespaced_service(NS, {"metadata": {"name": "external"}, "spec": {"ports": [{"name": "db", "port": 5432}]}})
    body = {"metadata": {"name": "external"}, "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "notReadyAddresses": [{"ip": "192.0.2.11"}], "ports": [{"name": "db", "port": 5432}]}]}
    core.create_namespaced_endpoints(NS, body)
    wait_for(lambda: slice_endpoints(discovery, "external") == {("192.0.2.10", True), ("192.0.2.11", False)}, "mirrored slice", timeout=WAIT)
    mirrored = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=external").items[0]
    assert mirrored.metadata.labels["endpointslice.kubernetes.io/managed-by"] == "endpointslicemirroring-controller.k8s.io"
    assert mirrored.ports[0].port == 5432 and mirrored.ports[0].name == "db"
    body["subsets"][0]["addresses"] = [{"ip": "192.0.2.12"}]
    core.replace_namespaced_endpoints("external", NS, body)
    wait_for(lambda: slice_endpoints(discovery, "external") == {("192.0.2.12", True), ("192.0.2.11", False)}, "the mirror following", timeout=WAIT)
    core.delete_namespaced_endpoints("external", NS)
    wait_for(lambda: not discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=external").items, "the mirror removed", timeout=WAIT)
