"""ReplicationControllers keep their pods (issue 5, SPEC W4), through
kubectl scale too."""

from kubernetes import client

from test_endpoints import NS, wait_for
from test_kubectl import KUBECTLS, Kubectl


def rc_body(name, replicas):
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"app": name},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "registry.local/app:1"}]}},
        },
    }


def owned_pods(core, name):
    return [p for p in core.list_namespaced_pod(NS, label_selector=f"app={name}").items if p.metadata.owner_references]


def test_replicas_are_kept(portal, tmp_path):
    core = portal.core()
    rcs = client.CoreV1Api(portal.api_client())
    rcs.create_namespaced_replication_controller(NS, rc_body("web", 3))
    wait_for(lambda: len(owned_pods(core, "web")) == 3, "3 pods")
    pods = owned_pods(core, "web")
    assert all(p.metadata.owner_references[0].kind == "ReplicationController" for p in pods)
    assert all(p.metadata.name.startswith("web-") for p in pods)
    wait_for(lambda: rcs.read_namespaced_replication_controller("web", NS).status.replicas == 3, "status.replicas")
    rc = rcs.read_namespaced_replication_controller("web", NS)
    assert rc.status.observed_generation == rc.metadata.generation

    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    assert "scaled" in kubectl.out("scale", "rc", "web", "--replicas=5")
    wait_for(lambda: len(owned_pods(core, "web")) == 5, "scale up to 5")
    kubectl.out("scale", "rc", "web", "--replicas=1")
    wait_for(lambda: len(owned_pods(core, "web")) == 1, "scale down to 1")

    survivor = owned_pods(core, "web")[0].metadata.name
    core.delete_namespaced_pod(survivor, NS)
    wait_for(lambda: [p.metadata.name for p in owned_pods(core, "web")] not in ([], [survivor]), "a replacement pod")
    wait_for(lambda: len(owned_pods(core, "web")) == 1, "exactly one pod again")
