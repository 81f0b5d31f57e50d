"""The scheduler binds pending pods to Ready nodes (issue 5, SPEC W3),
spreading what a user sees as one app, honouring topology spread
constraints, pod affinity and anti-affinity and node affinity (issue 27);
with no node that fits, pods stay Pending with a FailedScheduling Event
in upstream's words."""

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

    def scheduled_conditions():
        conditions = [next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
                      for p in owned_pods(core, "waiting")]
        return all(conditions) and conditions
    # The pods say why they wait, as the kube-scheduler writes it.
    for condition in wait_for(scheduled_conditions, "PodScheduled conditions", timeout=WAIT):
        assert (condition.status, condition.reason) == ("False", "Unschedulable")
        assert condition.message.startswith("0/0 nodes are available"), condition.message
    # A node appearing later gets them, and they are scheduled.
    make_node(core, "late")
    wait_for(lambda: all(p.spec.node_name == "late" for p in owned_pods(core, "waiting")), "binding once a node is ready", timeout=WAIT)
    # (The binding writes the node, then the condition.)
    wait_for(lambda: (conditions := scheduled_conditions()) and all(c.status == "True" for c in conditions),
             "PodScheduled True", timeout=WAIT)


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
    # The event is recorded after the binding: wait for it.
    wait_for(lambda: any("Successfully assigned default/spread-" in e.message
                         for e in core.list_namespaced_event(NS, field_selector="reason=Scheduled").items),
             "a Scheduled event", timeout=WAIT)

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


def labelled_node(core, name, **labels):
    return core.create_node({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })


def place(core, name, labels, **spec):
    """Creates a pod and waits for its binding; its node."""
    core.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": labels},
                                    "spec": {"containers": [{"name": "c", "image": "x"}], **spec}})
    return wait_for(lambda: core.read_namespaced_pod(name, NS).spec.node_name, f"{name} bound", timeout=WAIT)


def failed_scheduling(core, name):
    def reason():
        events = core.list_namespaced_event(NS, field_selector=f"reason=FailedScheduling,involvedObject.name={name}").items
        return events[0].message if events else None
    return wait_for(reason, f"FailedScheduling for {name}", timeout=WAIT)


def test_pods_of_one_service_spread_across_nodes(portal):
    """SPEC W3: what a user sees as one app (the pods a Service selects)
    spreads across nodes, even onto a node that runs more pods."""
    core = portal.core()
    labelled_node(core, "busy")
    labelled_node(core, "idle")
    for i in range(3):
        place(core, f"other-{i}", {"app": "other"}, nodeName="busy")
    core.create_namespaced_service(NS, {"metadata": {"name": "shop"},
                                        "spec": {"selector": {"tier": "shop"}, "ports": [{"port": 80}]}})
    # The service reaches the scheduler's cache before the pods come.
    wait_for(lambda: core.read_namespaced_service("shop", NS).spec.cluster_ip, "the service")
    first = place(core, "shop-1", {"tier": "shop"})
    second = place(core, "shop-2", {"tier": "shop"})
    assert {first, second} == {"busy", "idle"}, (first, second)


def test_pod_affinity_and_anti_affinity(portal):
    """Required anti-affinity by hostname keeps a kind one per node, the
    last one Pending with upstream's reason; required affinity brings a pod
    to the node of the pods it wants; preferred node affinity picks."""
    core = portal.core()
    for name in ("a", "b"):
        labelled_node(core, name, disk="ssd" if name == "b" else "hdd")
    apart = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    first = place(core, "cache-1", {"app": "cache"}, affinity=apart)
    second = place(core, "cache-2", {"app": "cache"}, affinity=apart)
    assert {first, second} == {"a", "b"}
    core.create_namespaced_pod(NS, {"metadata": {"name": "cache-3", "labels": {"app": "cache"}},
                                    "spec": {"containers": [{"name": "c", "image": "x"}], "affinity": apart}})
    message = failed_scheduling(core, "cache-3")
    assert message == "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules.", message

    # With the second cache gone, a web pod that must be near a cache goes
    # where the first one is.
    core.delete_namespaced_pod("cache-2", NS, grace_period_seconds=0)
    core.delete_namespaced_pod("cache-3", NS, grace_period_seconds=0)
    wait_for(lambda: len(core.list_namespaced_pod(NS, label_selector="app=cache").items) == 1, "one cache left")
    near = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    assert place(core, "web-1", {"app": "web"}, affinity=near) == first
    # A pod without rules of its own still may not join a pod whose
    # anti-affinity matches it.
    assert place(core, "cache-4", {"app": "cache"}) != first
    prefer_ssd = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}
    assert place(core, "fast", {"app": "fast"}, affinity=prefer_ssd) == "b"


def test_topology_spread_constraints(portal):
    """`DoNotSchedule` keeps the count per zone within maxSkew; a node
    without the key is not a candidate, with upstream's reason."""
    core = portal.core()
    labelled_node(core, "a", **{"topology.kubernetes.io/zone": "z1"})
    labelled_node(core, "b", **{"topology.kubernetes.io/zone": "z1"})
    labelled_node(core, "c", **{"topology.kubernetes.io/zone": "z2"})
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "web"}}}]
    nodes = [place(core, f"web-{i}", {"app": "web"}, topologySpreadConstraints=spread) for i in range(4)]
    zones = {"a": "z1", "b": "z1", "c": "z2"}
    assert sorted(zones[n] for n in nodes) == ["z1", "z1", "z2", "z2"], nodes
    missing = [{"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "rack"}}}]
    core.create_namespaced_pod(NS, {"metadata": {"name": "racked", "labels": {"app": "rack"}},
                                    "spec": {"containers": [{"name": "c", "image": "x"}], "topologySpreadConstraints": missing}})
    message = failed_scheduling(core, "racked")
    assert message == ("0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints "
                       "(missing required label)."), message
