"""ReplicaSets (`apps/v1`, issue 27): served as a kind like any other, kept
by the same controller as ReplicationControllers, with label selectors
(`matchLabels`, `matchExpressions`), the scale subresource, kubectl's
table, adoption and cascading deletion."""

import json

from kubernetes import client
from kubernetes.client.rest import ApiException

from support.api import NS
from support.kubectl import KUBECTLS, Kubectl
from support.waiting import wait_for


def rs_body(name, replicas, selector=None, labels=None):
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}} if selector is None else selector,
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }


def owned(core, uid):
    return [
        p for p in core.list_namespaced_pod(NS).items
        if p.metadata.deletion_timestamp is None
        and any(o.uid == uid and o.controller for o in p.metadata.owner_references or [])
    ]


def test_replica_sets_keep_their_pods_and_scale(portal, tmp_path):
    core = portal.core()
    apps = client.AppsV1Api(portal.api_client())
    selector = {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "edge"]}]}
    rs = apps.create_namespaced_replica_set(NS, rs_body("web", 3, selector, {"app": "web", "tier": "front"}))
    assert rs.spec.replicas == 3 and rs.status.replicas == 0
    pods = wait_for(lambda: (p := owned(core, rs.metadata.uid)) and len(p) == 3 and p, "3 pods")
    ref = pods[0].metadata.owner_references[0]
    assert (ref.api_version, ref.kind, ref.block_owner_deletion) == ("apps/v1", "ReplicaSet", True)
    assert all(p.metadata.name.startswith("web-") for p in pods)
    wait_for(lambda: apps.read_namespaced_replica_set("web", NS).status.replicas == 3, "status.replicas")
    assert apps.read_namespaced_replica_set("web", NS).status.observed_generation == rs.metadata.generation

    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    line = kubectl.out("get", "rs", "web", "-o", "wide").splitlines()[1]
    assert line.split()[:3] == ["web", "3", "3"], line
    assert line.endswith("app=web,tier in (front,edge)"), line
    assert "scaled" in kubectl.out("scale", "rs", "web", "--replicas=5")
    wait_for(lambda: len(owned(core, rs.metadata.uid)) == 5, "scale up to 5")
    scale = apps.read_namespaced_replica_set_scale("web", NS)
    assert scale.spec.replicas == 5 and scale.status.selector == "app=web,tier in (front,edge)"
    kubectl.out("scale", "rs", "web", "--replicas=1")
    wait_for(lambda: len(owned(core, rs.metadata.uid)) == 1, "scale down to 1")

    # An orphan that matches is adopted; one that does not is left alone.
    # The adopted one is bound to a node, so it ranks above the replica's
    # unscheduled pod when one of the two goes.
    core.create_namespaced_pod(NS, {"metadata": {"name": "stray", "labels": {"app": "web", "tier": "edge"}}, "spec": {"nodeName": "elsewhere", "containers": [{"name": "c", "image": "busybox"}]}})
    core.create_namespaced_pod(NS, {"metadata": {"name": "other", "labels": {"app": "web", "tier": "back"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    wait_for(lambda: len(owned(core, rs.metadata.uid)) == 1 and any(
        (o.uid == rs.metadata.uid) for o in core.read_namespaced_pod("stray", NS).metadata.owner_references or []
    ) and owned(core, rs.metadata.uid)[0].metadata.name == "stray", "the stray pod adopted, the unscheduled replica removed")
    assert not core.read_namespaced_pod("other", NS).metadata.owner_references

    # Deleting the ReplicaSet deletes its pods (the garbage collector).
    kubectl.out("delete", "rs", "web")
    wait_for(lambda: not owned(core, rs.metadata.uid) and not [
        p for p in core.list_namespaced_pod(NS).items
        if any(o.uid == rs.metadata.uid for o in p.metadata.owner_references or [])
    ], "the pods collected")


def test_replica_set_validation(portal):
    apps = client.AppsV1Api(portal.api_client())

    def refused(body):
        try:
            apps.create_namespaced_replica_set(NS, body)
        except ApiException as e:
            assert e.status == 422, e
            return json.loads(e.body)["message"]
        raise AssertionError("accepted")

    assert "spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for deployment" in refused(rs_body("nosel", 1, selector={}))
    assert "`selector` does not match template `labels`" in refused(rs_body("mismatch", 1, selector={"matchLabels": {"app": "x"}}))
    apps.create_namespaced_replica_set(NS, rs_body("fixed", 0))
    try:
        apps.patch_namespaced_replica_set("fixed", NS, {"spec": {"selector": {"matchLabels": {"app": "fixed", "x": "y"}}, "template": {"metadata": {"labels": {"app": "fixed", "x": "y"}}}}})
        raise AssertionError("a selector change was accepted")
    except ApiException as e:
        assert e.status == 422 and "field is immutable" in e.body, e.body


def test_kubectl_apply_and_discovery(portal, tmp_path):
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    assert "replicasets" in kubectl.out("api-resources", "--api-group=apps")
    kubectl.apply(json.dumps(rs_body("applied", 2)))
    core = portal.core()
    apps = client.AppsV1Api(portal.api_client())
    rs = apps.read_namespaced_replica_set("applied", NS)
    wait_for(lambda: len(owned(core, rs.metadata.uid)) == 2, "2 pods from an applied ReplicaSet")
    assert "applied" in kubectl.out("get", "all")
