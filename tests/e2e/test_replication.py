"""ReplicationControllers keep their pods (issue 5, SPEC W4), through
kubectl scale too."""

from kubernetes import client

from support.api import NS, owned_pods, rc_body
from support.kubectl import KUBECTLS, Kubectl
from support.waiting import wait_for

# These tests' bound (their own wait_for's before support.waiting).
WAIT = 10


def test_replicas_are_kept(portal, tmp_path):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    rcs.create_namespaced_replication_controller(NS, rc_body("web", 3))
    wait_for(lambda: len(owned_pods(core, "web")) == 3, "3 pods", timeout=WAIT)
    pods = owned_pods(core, "web")
    assert all(p.metadata.owner_references[0].kind == "ReplicationController" for p in pods)
    assert all(p.metadata.name.startswith("web-") for p in pods)
    wait_for(lambda: rcs.read_namespaced_replication_controller("web", NS).status.replicas == 3, "status.replicas", timeout=WAIT)
    rc = rcs.read_namespaced_replication_controller("web", NS)
    assert rc.status.observed_generation == rc.metadata.generation

    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    assert "scaled" in kubectl.out("scale", "rc", "web", "--replicas=5")
    wait_for(lambda: len(owned_pods(core, "web")) == 5, "scale up to 5", timeout=WAIT)
    kubectl.out("scale", "rc", "web", "--replicas=1")
    wait_for(lambda: len(owned_pods(core, "web")) == 1, "scale down to 1", timeout=WAIT)

    survivor = owned_pods(core, "web")[0].metadata.name
    core.delete_namespaced_pod(survivor, NS)
    wait_for(lambda: [p.metadata.name for p in owned_pods(core, "web")] not in ([], [survivor]), "a replacement pod", timeout=WAIT)
    wait_for(lambda: len(owned_pods(core, "web")) == 1, "exactly one pod again", timeout=WAIT)


def test_describe_shows_controller_events(portal, tmp_path):
    rcs = client.CoreV1Api(portal.api_client())
    rcs.create_namespaced_replication_controller(NS, rc_body("described", 2))
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    wait_for(lambda: kubectl.out("describe", "rc", "described").count("SuccessfulCreate") == 2, "two SuccessfulCreate events in describe", timeout=WAIT)


def test_deleting_an_rc_cascades_or_orphans(portal, tmp_path):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    rcs.create_namespaced_replication_controller(NS, rc_body("orphaned", 2))
    wait_for(lambda: len(owned_pods(core, "orphaned")) == 2, "2 pods", timeout=WAIT)
    kubectl.out("delete", "rc", "orphaned", "--cascade=orphan")
    pods = core.list_namespaced_pod(NS, label_selector="app=orphaned").items
    assert len(pods) == 2 and all(not p.metadata.owner_references for p in pods), "orphans keep running, unowned"

    rcs.create_namespaced_replication_controller(NS, rc_body("cascade", 2))
    wait_for(lambda: len(owned_pods(core, "cascade")) == 2, "2 pods", timeout=WAIT)
    kubectl.out("delete", "rc", "cascade", "--cascade=foreground")
    assert core.list_namespaced_pod(NS, label_selector="app=cascade").items == [], "foreground: dependents first"


def test_orphans_are_adopted_and_relabelled_pods_released(portal):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    core.create_namespaced_pod(NS, {
        "metadata": {"name": "stray", "labels": {"app": "adopter"}},
        "spec": {"containers": [{"name": "c", "image": "registry.local/app:1"}]},
    })
    rcs.create_namespaced_replication_controller(NS, rc_body("adopter", 2))
    uid = rcs.read_namespaced_replication_controller("adopter", NS).metadata.uid
    wait_for(lambda: len(owned_pods(core, "adopter")) == 2, "two pods, the stray one adopted", timeout=WAIT)
    stray = core.read_namespaced_pod("stray", NS)
    assert [(o.uid, o.controller) for o in stray.metadata.owner_references] == [(uid, True)]
    # Relabelled out of the selector: released, and replaced.
    core.patch_namespaced_pod("stray", NS, {"metadata": {"labels": {"app": "debugging"}}})
    wait_for(lambda: not core.read_namespaced_pod("stray", NS).metadata.owner_references, "the stray pod released", timeout=WAIT)
    wait_for(lambda: len(owned_pods(core, "adopter")) == 2, "a replacement for the released pod", timeout=WAIT)
    assert "stray" not in [p.metadata.name for p in owned_pods(core, "adopter")]
