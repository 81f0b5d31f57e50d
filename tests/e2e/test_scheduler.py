"""The scheduler binds pending pods to Ready nodes, spreading one owner's
pods (issue 5, SPEC W3); with no node that fits, pods stay Pending with a
FailedScheduling Event."""

from kubernetes import client

from test_endpoints import NS, wait_for
from test_replication import owned_pods, rc_body


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
    wait_for(lambda: len(owned_pods(core, "waiting")) == 2, "2 pods")

    def failed_scheduling():
        events = core.list_namespaced_event(NS, field_selector="reason=FailedScheduling").items
        return events and events[0].involved_object.kind == "Pod"

    wait_for(failed_scheduling, "a FailedScheduling event while no node fits")
    assert all(not p.spec.node_name for p in owned_pods(core, "waiting")), "no node, no binding"
    # A node appearing later gets them.
    make_node(core, "late")
    wait_for(lambda: all(p.spec.node_name == "late" for p in owned_pods(core, "waiting")), "binding once a node is ready")


def test_pods_spread_over_ready_nodes(portal):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    make_node(core, "node-a")
    make_node(core, "node-b")
    make_node(core, "node-down", ready=False)
    rcs.create_namespaced_replication_controller(NS, rc_body("spread", 4))
    wait_for(lambda: len(owned_pods(core, "spread")) == 4 and all(p.spec.node_name for p in owned_pods(core, "spread")), "all pods bound")
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
