"""The garbage collector is a controller: it deletes objects whose owners
are gone (also owners that never existed or went while it was not
running), finishes foreground deletions once blocking dependents are gone,
and orphans dependents for `Orphan` deletions, all through the API."""

from kubernetes import client
from kubernetes.client.rest import ApiException

from support.kubectl import KUBECTLS, Kubectl
from support.waiting import wait_for

NS = "default"


def owner_service(core, name):
    return core.create_namespaced_service(NS, {"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})


def dependent_pod(core, name, owner, block=None, finalizers=None):
    ref = {"apiVersion": "v1", "kind": "Service", "name": owner.metadata.name, "uid": owner.metadata.uid}
    if block is not None:
        ref["blockOwnerDeletion"] = block
    metadata = {"name": name, "ownerReferences": [ref]}
    if finalizers:
        metadata["finalizers"] = finalizers
    return core.create_namespaced_pod(NS, {"metadata": metadata, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})


def exists(read, name):
    try:
        return read(name, NS)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_background_deletion_collects_dependents_of_any_kind(portal):
    core = portal.core()
    owner = owner_service(core, "owner")
    dependent_pod(core, "child", owner)
    core.delete_namespaced_service("owner", NS)
    wait_for(lambda: exists(core.read_namespaced_pod, "child") is None, "the dependent collected")


def test_dependents_of_an_owner_that_never_existed_are_collected_and_others_kept(portal):
    core = portal.core()
    kept = owner_service(core, "kept")
    ghost = client.V1Service(metadata=client.V1ObjectMeta(name="ghost", uid="0b1c6d2e-0000-4000-8000-000000000001"))
    dependent_pod(core, "lonely", ghost)
    # Two owners, one gone: only the reference to the gone one is dropped.
    ref = lambda o: {"apiVersion": "v1", "kind": "Service", "name": o.metadata.name, "uid": o.metadata.uid}
    core.create_namespaced_pod(NS, {"metadata": {"name": "shared", "ownerReferences": [ref(kept), ref(ghost)]}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    wait_for(lambda: exists(core.read_namespaced_pod, "lonely") is None, "the dependent of a missing owner collected")
    shared = wait_for(
        lambda: (p := core.read_namespaced_pod("shared", NS)) and len(p.metadata.owner_references) == 1 and p,
        "the reference to the missing owner dropped",
    )
    assert shared.metadata.owner_references[0].uid == kept.metadata.uid
    # Written through the registry: no manager still claims the reference.
    fields = [str(e.fields_v1) for e in shared.metadata.managed_fields]
    assert all(ghost.metadata.uid not in f for f in fields), shared.metadata.managed_fields


def test_foreground_deletion_waits_for_blocking_dependents(portal, tmp_path):
    core = portal.core()
    owner = owner_service(core, "fg")
    dependent_pod(core, "blocker", owner, block=True, finalizers=["example.com/hold"])
    dependent_pod(core, "bystander", owner, block=False)
    core.delete_namespaced_service("fg", NS, propagation_policy="Foreground")
    # The owner stays, marked, while a blocking dependent exists.
    marked = exists(core.read_namespaced_service, "fg")
    assert marked is not None and marked.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in marked.metadata.finalizers
    blocker = wait_for(
        lambda: (p := core.read_namespaced_pod("blocker", NS)).metadata.deletion_timestamp and p,
        "the blocking dependent marked for deletion",
    )
    wait_for(lambda: exists(core.read_namespaced_pod, "bystander") is None, "the other dependent deleted")
    assert exists(core.read_namespaced_service, "fg") is not None, "held by the blocking dependent"
    core.patch_namespaced_pod("blocker", NS, {"metadata": {"finalizers": None}})
    assert blocker.metadata.name == "blocker"
    wait_for(lambda: exists(core.read_namespaced_pod, "blocker") is None, "the blocking dependent gone")
    wait_for(lambda: exists(core.read_namespaced_service, "fg") is None, "the owner gone after its dependents")


def test_kubectl_orphan_cascade_keeps_dependents_unowned(portal, tmp_path):
    core = portal.core()
    owner = owner_service(core, "parent")
    dependent_pod(core, "kept-child", owner, block=True)
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    kubectl.out("delete", "service", "parent", "--cascade=orphan")
    # kubectl waits for the owner to go: by then the collector has
    # removed the reference and its finalizer.
    child = core.read_namespaced_pod("kept-child", NS)
    assert not child.metadata.owner_references
    assert exists(core.read_namespaced_service, "parent") is None


def test_collection_resumes_after_a_restart(start_portal):
    portal = start_portal()
    core = portal.core()
    owner = owner_service(core, "before")
    dependent_pod(core, "survivor", owner)
    portal.stop()
    # The owner goes while no collector runs.
    portal = start_portal(["--disable", "controllers"])
    core = portal.core()
    core.delete_namespaced_service("before", NS)
    assert exists(core.read_namespaced_pod, "survivor") is not None
    portal.stop()
    portal = start_portal()
    core = portal.core()
    wait_for(lambda: exists(core.read_namespaced_pod, "survivor") is None, "the dependent collected after the restart")
