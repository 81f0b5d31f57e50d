"""Persistent storage (issue 28): the default `local-path` StorageClass, a
claim bound when its first pod is scheduled (`WaitForFirstConsumer`) to a
directory of that pod's node, data that outlives the pod and the agent,
claims protected while in use, volumes released and deleted (with their
data) or kept as their reclaim policy says, static volumes bound by size
and class, and a StatefulSet's `volumeClaimTemplates`. Pods run for real in
a node namespace the test makes."""

import pathlib
import time

import kubernetes
import pytest

from support.agent_bed import NS, AgentNode, busybox_image
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("storage")) as node:
        node.busybox = busybox_image(node)
        yield node


def claim(name, size="1Gi", **spec):
    return {"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec}}


def pod_with_claim(node, name, claim_name, script):
    return {"metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": node.busybox, "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}


def read_claim(node, name):
    return node.core.read_namespaced_persistent_volume_claim(name, NS)


def gone(read):
    try:
        read()
        return False
    except kubernetes.client.ApiException as error:
        return error.status == 404


def test_a_claim_follows_its_first_pod_and_keeps_its_data(node):
    core = node.core
    classes = node.kubectl("get", "storageclass")
    assert "local-path (default)" in classes and "WaitForFirstConsumer" in classes, classes

    core.create_namespaced_persistent_volume_claim(NS, claim("data"))
    # The default class, retroactively; then waiting for a consumer.
    wait_for(lambda: read_claim(node, "data").spec.storage_class_name == "local-path", "the default class")
    wait_for(lambda: any(e[1] == "WaitForFirstConsumer" for e in node.events("data")), "WaitForFirstConsumer")
    assert read_claim(node, "data").status.phase == "Pending"

    core.create_namespaced_pod(NS, pod_with_claim(node, "writer", "data", "echo kept > /data/file; exec sleep 100000"))
    node.wait_running("writer")
    # The pod runs once the claim names its volume; Bound is written after.
    bound = wait_for(lambda: (lambda c: c if c.status.phase == "Bound" else None)(read_claim(node, "data")),
                     "the claim Bound")
    assert bound.status.capacity["storage"] == "1Gi"
    assert bound.metadata.annotations["volume.kubernetes.io/selected-node"] == node.node_name
    volume = core.read_persistent_volume(bound.spec.volume_name)
    directory = pathlib.Path(volume.spec.host_path.path)
    assert directory.parent == (node.data_dir / "agent" / "storage").resolve(), directory
    assert (directory / "file").read_text() == "kept\n"
    table = node.kubectl("get", "pv")
    assert f"{NS}/data" in table and "Bound" in table and "RWO" in table, table

    # In use: deleting the claim waits for the pod.
    core.delete_namespaced_persistent_volume_claim("data", NS)
    protected = read_claim(node, "data")
    assert protected.metadata.deletion_timestamp and "kubernetes.io/pvc-protection" in protected.metadata.finalizers

    # The data outlives the pod and the agent.
    node.restart()
    core = node.core
    assert node.kubectl("-n", NS, "exec", "writer", "--", "cat", "/data/file") == "kept\n"

    core.delete_namespaced_pod("writer", NS, grace_period_seconds=0)
    wait_for(lambda: gone(lambda: read_claim(node, "data")), "the claim to go once its pod is gone")
    # Reclaim policy Delete: the volume and its directory go too.
    wait_for(lambda: gone(lambda: core.read_persistent_volume(volume.metadata.name)), "the released volume to be deleted")
    wait_for(lambda: not directory.exists(), "the volume's directory to be removed", timeout=90)


def test_data_survives_a_new_pod(node):
    core = node.core
    core.create_namespaced_persistent_volume_claim(NS, claim("notes", "64Mi"))
    core.create_namespaced_pod(NS, pod_with_claim(node, "first", "notes", "echo one >> /data/log; exec sleep 100000"))
    node.wait_running("first")
    core.delete_namespaced_pod("first", NS, grace_period_seconds=0)
    wait_for(lambda: gone(lambda: node.pod("first")), "the first pod to go")
    core.create_namespaced_pod(NS, pod_with_claim(node, "second", "notes", "echo two >> /data/log; exec sleep 100000"))
    node.wait_running("second")
    assert node.kubectl("-n", NS, "exec", "second", "--", "cat", "/data/log") == "one\ntwo\n"
    core.delete_namespaced_pod("second", NS, grace_period_seconds=0)
    core.delete_namespaced_persistent_volume_claim("notes", NS)


def test_static_volumes_bind_by_class_and_size_and_retain(node, tmp_path):
    core = node.core
    for name, size in [("static-small", "100Mi"), ("static-big", "5Gi")]:
        core.create_persistent_volume({"metadata": {"name": name}, "spec": {
            "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(tmp_path / name)}}})
    wait_for(lambda: core.read_persistent_volume("static-big").status.phase == "Available", "Available volumes")
    core.create_namespaced_persistent_volume_claim(NS, claim("manual", "1Gi", storageClassName="manual"))
    bound = wait_for(lambda: (c := read_claim(node, "manual")).status.phase == "Bound" and c, "the claim to bind")
    assert bound.spec.volume_name == "static-big", "the smallest volume that fits"
    # The claim's phase and the volume's are two writes: wait for the second.
    wait_for(lambda: core.read_persistent_volume("static-big").status.phase == "Bound", "the volume Bound")
    core.delete_namespaced_persistent_volume_claim("manual", NS)
    wait_for(lambda: core.read_persistent_volume("static-big").status.phase == "Released", "Released, and kept")
    assert core.read_persistent_volume("static-small").status.phase == "Available"
    for name in ["static-small", "static-big"]:
        core.delete_persistent_volume(name)


def test_stateful_set_claims_get_volumes(node):
    apps = kubernetes.client.AppsV1Api(node.portal.api_client())
    apps.create_namespaced_stateful_set(NS, {"metadata": {"name": "db"}, "spec": {
        "serviceName": "db", "replicas": 2, "selector": {"matchLabels": {"app": "db"}},
        "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "db", "image": node.busybox, "command": ["sh", "-c", "hostname > /var/lib/db/owner; exec sleep 100000"],
             "volumeMounts": [{"name": "store", "mountPath": "/var/lib/db"}]}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "store"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}}}]}})
    for ordinal in range(2):
        wait_for(lambda: node.core.list_namespaced_pod(NS, field_selector=f"metadata.name=db-{ordinal}").items,
                 f"pod db-{ordinal} to be made", timeout=120)
        node.wait_running(f"db-{ordinal}", timeout=120)
        claim_name = f"store-db-{ordinal}"
        wait_for(lambda: read_claim(node, claim_name).status.phase == "Bound", f"{claim_name} Bound")
        assert node.kubectl("-n", NS, "exec", f"db-{ordinal}", "--", "cat", "/var/lib/db/owner") == f"db-{ordinal}\n"
    apps.delete_namespaced_stateful_set("db", NS)
    wait_for(lambda: not node.core.list_namespaced_pod(NS, label_selector="app=db").items, "the set's pods to go")
    # Retained by the set's default policy: the claims stay.
    assert read_claim(node, "store-db-0").status.phase == "Bound"
    for ordinal in range(2):
        node.core.delete_namespaced_persistent_volume_claim(f"store-db-{ordinal}", NS)


def test_stateful_set_claims_go_as_the_retention_policy_says(node):
    """`persistentVolumeClaimRetentionPolicy` Delete/Delete: a scale-down
    takes the removed pod's claim, deleting the set takes the rest."""
    apps = kubernetes.client.AppsV1Api(node.portal.api_client())
    apps.create_namespaced_stateful_set(NS, {"metadata": {"name": "cache"}, "spec": {
        "serviceName": "cache", "replicas": 2, "selector": {"matchLabels": {"app": "cache"}},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"},
        "template": {"metadata": {"labels": {"app": "cache"}}, "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "c", "image": node.busybox, "command": ["sleep", "100000"],
             "volumeMounts": [{"name": "slab", "mountPath": "/slab"}]}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "slab"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}}}]}})
    for ordinal in range(2):
        wait_for(lambda: node.core.list_namespaced_pod(NS, field_selector=f"metadata.name=cache-{ordinal}").items,
                 f"pod cache-{ordinal} to be made", timeout=120)
        node.wait_running(f"cache-{ordinal}", timeout=120)
    owners = read_claim(node, "slab-cache-0").metadata.owner_references
    assert [(o.kind, o.name) for o in owners] == [("StatefulSet", "cache")]
    apps.patch_namespaced_stateful_set_scale("cache", NS, {"spec": {"replicas": 1}})
    wait_for(lambda: gone(lambda: read_claim(node, "slab-cache-1")), "the scaled-down pod's claim to go", timeout=90)
    assert read_claim(node, "slab-cache-0").status.phase == "Bound"
    apps.delete_namespaced_stateful_set("cache", NS)
    wait_for(lambda: gone(lambda: read_claim(node, "slab-cache-0")), "the set's claims to go with it", timeout=90)
