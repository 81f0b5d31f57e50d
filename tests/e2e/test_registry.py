"""The server's own writes go through the registry, as a client's do: they
are validated, recorded in managedFields under their own manager, and a
dry run through the same code changes nothing."""

import subprocess

from kubernetes import client, watch

from support.kubectl import KUBECTLS
from support.waiting import wait_for


def managers(obj):
    """(manager, operation, subresource) of each managedFields entry."""
    return {(e.manager, e.operation, e.subresource) for e in obj.metadata.managed_fields or []}


def owned(obj, manager):
    entry = next(e for e in obj.metadata.managed_fields if e.manager == manager)
    return entry.fields_v1


def test_kubernetes_service_and_endpoints_name_their_manager(start_portal):
    portal = start_portal(["--node-ip", "192.0.2.44"])
    core = portal.core()
    svc = core.read_namespaced_service("kubernetes", "default")
    assert ("portal-apiserver", "Update", None) in managers(svc), svc.metadata.managed_fields
    assert "f:ports" in owned(svc, "portal-apiserver")["f:spec"]
    endpoints = core.read_namespaced_endpoints("kubernetes", "default")
    assert ("portal-apiserver", "Update", None) in managers(endpoints)
    assert endpoints.subsets[0].addresses[0].ip == "192.0.2.44"
    dns = core.read_namespaced_service("kube-dns", "kube-system")
    assert ("portal-apiserver", "Update", None) in managers(dns)


def test_load_balancer_addresses_are_the_providers_status_writes(start_portal):
    portal = start_portal(["--load-balancer-pool", "192.0.2.8/30"])
    core = portal.core()
    core.create_namespaced_service(
        "default",
        client.V1Service(
            metadata=client.V1ObjectMeta(name="lb"),
            spec=client.V1ServiceSpec(type="LoadBalancer", ports=[client.V1ServicePort(port=80)]),
        ),
        field_manager="tester",
    )
    svc = wait_for(
        lambda: (s := core.read_namespaced_service("lb", "default")).status.load_balancer.ingress and s,
        "an address from the pool",
    )
    assert svc.status.load_balancer.ingress[0].ip.startswith("192.0.2.")
    assert ("portal-load-balancer", "Update", "status") in managers(svc), svc.metadata.managed_fields
    assert "f:loadBalancer" in owned(svc, "portal-load-balancer")["f:status"]
    assert ("tester", "Update", None) in managers(svc)


def test_namespace_termination_writes_as_the_namespace_controller(start_portal):
    portal = start_portal()
    core = portal.core()
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_service("doomed", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}})
    kubectl = KUBECTLS[0]

    # A server-side dry run goes through the same delete code and leaves
    # the namespace, and what is in it, as they were.
    before = core.read_namespace("doomed")
    result = subprocess.run(
        [kubectl, "--kubeconfig", portal.kubeconfig, "delete", "namespace", "doomed", "--dry-run=server"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout
    after = core.read_namespace("doomed")
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.metadata.deletion_timestamp is None and after.status.phase == "Active"
    assert core.read_namespaced_service("s", "doomed")

    # For real: the conditions the namespace controller writes are its own
    # status writes, seen on the way out.
    stream = watch.Watch().stream(
        core.list_namespace, field_selector="metadata.name=doomed",
        resource_version=after.metadata.resource_version, timeout_seconds=30,
    )
    core.delete_namespace("doomed")
    seen_conditions = None
    for event in stream:
        ns = event["object"]
        if ns.status.conditions and seen_conditions is None:
            seen_conditions = ns
        if event["type"] == "DELETED":
            break
    assert seen_conditions is not None, "no conditions were written before the namespace went"
    assert ("portal-namespace-controller", "Update", "status") in managers(seen_conditions)
    assert "f:conditions" in owned(seen_conditions, "portal-namespace-controller")["f:status"]


def test_orphaning_is_the_garbage_collectors_update(portal):
    core = portal.core()
    rc = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"app": "web"},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }
    core.create_namespaced_replication_controller("default", rc)
    pods = wait_for(
        lambda: (p := core.list_namespaced_pod("default", label_selector="app=web").items) and len(p) == 2 and p,
        "the controller's two pods",
    )
    assert all(p.metadata.owner_references for p in pods)
    core.delete_namespaced_replication_controller("web", "default", propagation_policy="Orphan")

    def orphaned():
        now = core.list_namespaced_pod("default", label_selector="app=web").items
        return len(now) == 2 and all(not p.metadata.owner_references for p in now) and now

    owner = pods[0].metadata.owner_references[0].uid
    for pod in wait_for(orphaned, "both pods orphaned"):
        # Through the registry, the removal is recorded: no manager still
        # owns the reference that went (written around it, the creator's
        # entry kept claiming it).
        fields = [e.fields_v1 for e in pod.metadata.managed_fields]
        assert all(owner not in str(f) for f in fields), pod.metadata.managed_fields


def test_controllers_writes_name_their_manager(portal):
    """The controllers run in the server on its loopback client: what they
    write names them (as kube-controller-manager's do), not an empty
    manager."""
    core = portal.core()
    rc = {
        "metadata": {"name": "managed"},
        "spec": {
            "replicas": 1,
            "selector": {"app": "managed"},
            "template": {"metadata": {"labels": {"app": "managed"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }
    core.create_namespaced_replication_controller("default", rc)
    pod = wait_for(
        lambda: (p := core.list_namespaced_pod("default", label_selector="app=managed").items) and p[0],
        "the controller's pod",
    )
    assert ("portal-controllers", "Update", None) in managers(pod), pod.metadata.managed_fields
