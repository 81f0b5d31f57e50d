"""The scheduler binds pending pods to Ready nodes, spreading one owner's
pods (issue 5, SPEC W3); with no node that fits, pods stay Pending with a
FailedScheduling Event."""

from kubernetes import client

from support.api import NS, owned_pods, rc_body
from support.waiting import wait_for

# These tests' bound (their own wait_for's before support.waiting).
WAIT = 10


def make_node(core, name, ready=True):
    node = {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
    return core.create_node(node)


def test_without_nodes_pods_stay_pending(portal):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    rcs.create_namespaced_replication_controller(NS, rc_body("waiting", 2))
    wait_for(lambda: len(owned_pods(core, "waiting")) == 2, "2 pods", timeout=WAIT)

    def failed_scheduling():
        events = core.list_namespaced_event(NS, field_selector="reason=FailedScheduling").items
        return events and events[0].involved_object.kind == "Pod"

    wait_for(failed_scheduling, "a FailedScheduling event while no node fits", timeout=WAIT)
    assert all(not p.spec.node_name for p in owned_pods(core, "waiting")), "no node, no binding"
    # A node appearing later gets them.
    make_node(core, "late")
    wait_for(lambda: all(p.spec.node_name == "late" for p in owned_pods(core, "waiting")), "binding once a node is ready", timeout=WAIT)


def test_pods_spread_over_ready_nodes(portal):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    make_node(core, "node-a")
    make_node(core, "node-b")
    make_node(core, "node-down", ready=False)
    rcs.create_namespaced_replication_controller(NS, rc_body("spread", 4))
    wait_for(lambda: len(owned_pods(core, "spread")) == 4 and all(p.spec.node_name for p in owned_pods(core, "spread")), "all pods bound", timeout=WAIT)
    placement = sorted(p.spec.node_name for p in owned_pods(core, "spread"))
    assert placement == ["node-a", "node-a", "node-b", "node-b"], placement
    scheduled = core.list_namespaced_event(NS, field_selector="reason=Scheduled").items
    assert any("Successfully assigned default/spread-" in e.message for e in scheduled)

    # A bound pod cannot be bound again.
    pod = owned_pods(core, "spread")[0]
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.metadata.name}, "target": {"kind": "Node", "name": "node-b"}}
    try:
        core.create_namespaced_pod_binding(pod.metadata.name, NS, body)
        raise AssertionError("a second binding was accepted")
    except client.rest.ApiException as e:
        assert e.status == 409


def test_taints_node_selectors_and_cordon(portal):
    """Untolerated NoSchedule taints, a nodeSelector and `kubectl cordon`
    keep pods away, with Kubernetes' reasons (issue 17, part)."""
    import subprocess

    core = portal.core()
    core.create_node({
        "metadata": {"name": "db-node", "labels": {"disk": "ssd"}},
        "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
    make_node(core, "web-node")
    kubectl = lambda *args: subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True, timeout=60, check=True)
    kubectl("cordon", "web-node")
    assert core.read_node("web-node").spec.unschedulable
    plain = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    core.create_namespaced_pod(NS, plain)

    def reason():
        events = core.list_namespaced_event(NS, field_selector="reason=FailedScheduling,involvedObject.name=plain").items
        return events[0].message if events else None

    message = wait_for(reason, "FailedScheduling for the plain pod", timeout=WAIT)
    assert message == "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: db}, 1 node(s) were unschedulable.", message
    kubectl("uncordon", "web-node")
    wait_for(lambda: core.read_namespaced_pod("plain", NS).spec.node_name == "web-node", "the plain pod on the uncordoned node", timeout=WAIT)
    tolerant = {"metadata": {"name": "db"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
    }}
    core.create_namespaced_pod(NS, tolerant)
    wait_for(lambda: core.read_namespaced_pod("db", NS).spec.node_name == "db-node", "the tolerant pod on the tainted node it selects", timeout=WAIT)
