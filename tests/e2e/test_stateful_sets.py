"""StatefulSets (`apps/v1`, issue 27) on a real node: pods `web-0`, `web-1`,
`web-2` started in order, each reachable by its stable DNS name through a
headless Service from another pod, a deleted pod coming back under its
name, ordered scale-down, partitioned rolling updates with `kubectl
rollout status|history|undo`, `Parallel` pod management with `OnDelete`,
and volume claim templates that keep pods Pending while claims are not
served — each leaving nothing behind on the node."""

import threading

import pytest
from kubernetes import client, watch

from support.agent_bed import NS, AgentNode, busybox_image, web_image
from support.kubectl import Kubectl
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("stateful-sets")) as node:
        busybox_image(node)
        node.v1 = web_image(node, "web", "1")
        node.v2 = web_image(node, "web", "2")
        node.apps = client.AppsV1Api(node.portal.api_client())
        yield node


@pytest.fixture(autouse=True)
def clean_namespace(node):
    """After each test, whatever it left (also on failure) is removed."""
    yield
    for s in node.apps.list_namespaced_stateful_set(NS).items:
        node.apps.delete_namespaced_stateful_set(s.metadata.name, NS)
    for s in node.core.list_namespaced_service(NS).items:
        if s.metadata.name != "kubernetes":
            node.core.delete_namespaced_service(s.metadata.name, NS)
    node.core.delete_collection_namespaced_pod(NS)
    wait_for(lambda: not node.core.list_namespaced_pod(NS).items and not any(node.leftovers().values()),
             "the namespace and the node empty", 90)
    wait_for(lambda: not node.apps.list_namespaced_controller_revision(NS).items, "the revisions collected", 30)


@pytest.fixture
def kubectl(node, tmp_path):
    return Kubectl("kubectl", node.portal, tmp_path)


def stateful_set(name, image, replicas, ready_probe=None, **spec):
    probe = ready_probe or {"httpGet": {"path": "/name.txt", "port": 8080}, "periodSeconds": 1}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": "nginx",
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "web",
                        "image": image,
                        "ports": [{"containerPort": 8080, "name": "web"}],
                        "readinessProbe": probe,
                    }],
                },
            },
            **spec,
        },
    }


HEADLESS = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "nginx"},
    "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080, "name": "web"}]},
}


def live_pods(node, selector="app=web"):
    return {p.metadata.name: p for p in node.core.list_namespaced_pod(NS, label_selector=selector).items
            if p.metadata.deletion_timestamp is None}


def ready_names(node):
    return sorted(name for name, pod in live_pods(node).items() if is_ready(pod))


def is_ready(pod):
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


class PodLog:
    """Every pod watch event of the namespace, in order, as (type, name,
    ready, terminating) — what "in order" is checked against."""

    def __init__(self, node):
        self.node, self.events = node, []
        self.watch = watch.Watch()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            self.follow()
        except Exception:  # noqa: BLE001 - the watch ends when the test stops it
            pass

    def follow(self):
        for event in self.watch.stream(self.node.core.list_namespaced_pod, NS, timeout_seconds=300):
            pod = event["object"]
            terminating = pod.metadata.deletion_timestamp is not None
            self.events.append((event["type"], pod.metadata.name, is_ready(pod), terminating))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.watch.stop()

    def first(self, kind, name, ready=None, terminating=None):
        """The index of the first event of `kind` for `name` (ready, or
        terminating, if asked)."""
        for index, (type_, pod, is_ready_, is_terminating) in enumerate(self.events):
            if (type_ == kind and pod == name and (ready is None or is_ready_ == ready)
                    and (terminating is None or is_terminating == terminating)):
                return index
        raise AssertionError(f"no {kind} event for {name} in {self.events}")


def test_ordered_start_stable_names_and_dns(node, kubectl):
    """The tutorial's StatefulSet: `web-0…2` each start once the one before
    is Ready, answer as themselves at `web-N.nginx`, come back under their
    name when deleted, and go highest first on scale-down."""
    node.core.create_namespaced_service(NS, HEADLESS)
    with PodLog(node) as log:
        node.apps.create_namespaced_stateful_set(NS, stateful_set("web", node.v1, 3))
        pods = wait_for(lambda: (p := live_pods(node)) and len(p) == 3 and all(map(is_ready, p.values())) and p,
                        "web-0, web-1, web-2 ready", 120)
    assert sorted(pods) == ["web-0", "web-1", "web-2"]
    # Each was created only once the one before it was ready.
    assert log.first("ADDED", "web-1") > log.first("MODIFIED", "web-0", ready=True)
    assert log.first("ADDED", "web-2") > log.first("MODIFIED", "web-1", ready=True)
    set_ = node.apps.read_namespaced_stateful_set("web", NS)
    revision = set_.status.update_revision
    assert set_.status.current_revision == revision and revision.startswith("web-")
    for name, pod in pods.items():
        assert pod.spec.hostname == name and pod.spec.subdomain == "nginx"
        assert pod.metadata.labels["statefulset.kubernetes.io/pod-name"] == name
        assert pod.metadata.labels["apps.kubernetes.io/pod-index"] == name[-1]
        assert pod.metadata.labels["controller-revision-hash"] == revision
        assert pod.metadata.owner_references[0].kind == "StatefulSet"
    line = wait_for(lambda: (l := kubectl.out("get", "sts", "web").splitlines()[1]) and l.split()[1] == "3/3" and l,
                    "READY 3/3")
    assert line.split()[0] == "web"
    assert kubectl.out("exec", "web-1", "--", "hostname").strip() == "web-1"

    # Each pod by its stable name, from another pod: its own address, and
    # the pod itself answering.
    def lookups():
        script = "; ".join(
            f"nslookup web-{i}.nginx.{NS}.svc.cluster.local | tail -n +3 | grep Address; wget -qO- http://web-{i}.nginx:8080/name.txt"
            for i in range(3))
        return kubectl.run_to_completion("dns", f"{node.registry.host}/busybox:1.36", "sh", "-c", script)
    out = lookups()
    for name, pod in pods.items():
        assert f"Address: {pod.status.pod_ip}" in out, out
        assert f"\n{name}\n" in f"\n{out}\n", out

    # A deleted pod comes back under its name, with a new identity.
    old_uid = pods["web-1"].metadata.uid
    node.core.delete_namespaced_pod("web-1", NS)
    back = wait_for(lambda: (p := live_pods(node).get("web-1")) and p.metadata.uid != old_uid and is_ready(p) and p,
                    "web-1 back and ready", 90)
    assert back.spec.hostname == "web-1"
    out = wait_for(lambda: (o := lookups()) and f"Address: {back.status.pod_ip}" in o and o, "web-1's new address in DNS")
    assert "\nweb-1\n" in f"\n{out}\n"

    # Its identity labels taken away, the set gives them back.
    kubectl.out("label", "pod", "web-1", "statefulset.kubernetes.io/pod-name-", "apps.kubernetes.io/pod-index=7", "--overwrite")
    wait_for(lambda: (labels := node.core.read_namespaced_pod("web-1", NS).metadata.labels)
             .get("statefulset.kubernetes.io/pod-name") == "web-1" and labels.get("apps.kubernetes.io/pod-index") == "1",
             "web-1's identity labels restored")
    # (The event is written after the pod.)
    wait_for(lambda: any(e.reason == "SuccessfulUpdate" and e.message == "update Pod web-1 in StatefulSet web successful"
                         for e in node.core.list_namespaced_event(NS, field_selector="involvedObject.name=web").items),
             "the SuccessfulUpdate event")

    # Scale-down: the highest ordinal goes first, one at a time.
    with PodLog(node) as log:
        kubectl.out("scale", "sts", "web", "--replicas=1")
        wait_for(lambda: list(live_pods(node)) == ["web-0"] and "web-1" not in
                 {p.metadata.name for p in node.core.list_namespaced_pod(NS).items}, "web-1 and web-2 gone", 90)
    assert log.first("DELETED", "web-2") < log.first("MODIFIED", "web-1", terminating=True)
    wait_for(lambda: node.apps.read_namespaced_stateful_set("web", NS).status.replicas == 1, "status.replicas 1")


def test_an_unready_pod_holds_the_next_ones_back(node):
    """`OrderedReady`: web-1 is not made while web-0 is not ready;
    `Parallel` makes them all at once."""
    never = {"exec": {"command": ["false"]}, "periodSeconds": 1}
    node.apps.create_namespaced_stateful_set(NS, stateful_set("web", node.v1, 3, ready_probe=never))
    wait_for(lambda: (p := live_pods(node).get("web-0")) and p.status.phase == "Running", "web-0 running", 60)
    web0 = live_pods(node)["web-0"]
    # Running but never ready: web-0's container has started, the set
    # has seen it (its status counts it) and still makes nothing more.
    wait_for(lambda: node.apps.read_namespaced_stateful_set("web", NS).status.replicas == 1, "the set to see web-0")
    assert list(live_pods(node)) == ["web-0"] and not is_ready(web0)
    node.apps.delete_namespaced_stateful_set("web", NS)
    wait_for(lambda: not live_pods(node), "web-0 gone", 60)

    node.apps.create_namespaced_stateful_set(
        NS, stateful_set("web", node.v1, 3, ready_probe=never, podManagementPolicy="Parallel"))
    wait_for(lambda: sorted(live_pods(node)) == ["web-0", "web-1", "web-2"], "all three made at once", 60)


def settled(node, updated):
    """Waits until the set has `updated` pods at the update revision and
    every pod ready, as the API shows it."""
    def check():
        status = node.apps.read_namespaced_stateful_set("web", NS).status
        return status.updated_replicas == updated and status.ready_replicas == 3 and status.replicas == 3
    wait_for(check, f"{updated} pods updated and all ready", 120)


def test_partitioned_rolling_update_and_rollout_commands(node, kubectl):
    """`partition: 2` updates web-2 only; lowering it updates the others
    highest first; `rollout status|history|undo` as upstream's."""
    node.core.create_namespaced_service(NS, HEADLESS)
    node.apps.create_namespaced_stateful_set(NS, stateful_set("web", node.v1, 3))
    settled(node, 3)
    out = kubectl.out("rollout", "status", "sts/web", "--timeout=30s")
    assert "partitioned roll out complete: 3 new pods have been updated..." in out, out
    first = node.apps.read_namespaced_stateful_set("web", NS).status.current_revision

    kubectl.out("patch", "sts", "web", "-p", '{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}')
    kubectl.out("set", "image", "sts/web", f"web={node.v2}")
    wait_for(lambda: node.apps.read_namespaced_stateful_set("web", NS).status.observed_generation == 3, "the template observed")
    settled(node, 1)
    out = kubectl.out("rollout", "status", "sts/web", "--timeout=30s")
    assert "partitioned roll out complete: 1 new pods have been updated..." in out, out
    set_ = node.apps.read_namespaced_stateful_set("web", NS)
    second = set_.status.update_revision
    assert second != first and set_.status.current_revision == first
    assert set_.status.updated_replicas == 1 and set_.status.current_replicas == 2
    pods = live_pods(node)
    assert pods["web-2"].spec.containers[0].image == node.v2
    assert pods["web-2"].metadata.labels["controller-revision-hash"] == second
    assert all(pods[n].spec.containers[0].image == node.v1 for n in ("web-0", "web-1"))

    with PodLog(node) as log:
        kubectl.out("patch", "sts", "web", "-p", '{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}')
        settled(node, 3)
        out = kubectl.out("rollout", "status", "sts/web", "--timeout=30s")
    assert "partitioned roll out complete: 3 new pods have been updated..." in out, out
    assert log.first("DELETED", "web-1") < log.first("MODIFIED", "web-0", terminating=True)
    set_ = wait_for(lambda: (s := node.apps.read_namespaced_stateful_set("web", NS)) and s.status.current_revision == second and s,
                    "the update revision current")
    assert all(p.spec.containers[0].image == node.v2 for p in live_pods(node).values())

    history = kubectl.out("rollout", "history", "sts/web")
    assert [line.split()[0] for line in history.splitlines()[2:] if line.strip()] == ["1", "2"], history
    assert "statefulset.apps/web rolled back" in kubectl.out("rollout", "undo", "sts/web")
    wait_for(lambda: all(p.spec.containers[0].image == node.v1 and is_ready(p) for p in live_pods(node).values())
             and len(live_pods(node)) == 3, "every pod back at the first template", 120)
    revisions = {r.metadata.name: r.revision for r in node.apps.list_namespaced_controller_revision(NS).items}
    # The first template's revision is re-used, numbered after the second.
    assert revisions == {first: 3, second: 2}, revisions
    assert node.apps.read_namespaced_stateful_set("web", NS).status.update_revision == first


def test_parallel_on_delete_updates_only_deleted_pods(node, kubectl):
    """`OnDelete`: a new template changes no pod until one is deleted; the
    replacement runs the new template."""
    node.apps.create_namespaced_stateful_set(NS, stateful_set(
        "web", node.v1, 2, podManagementPolicy="Parallel", updateStrategy={"type": "OnDelete"}))
    wait_for(lambda: len(p := live_pods(node)) == 2 and all(map(is_ready, p.values())), "two ready pods", 90)
    kubectl.out("set", "image", "sts/web", f"web={node.v2}")
    set_ = wait_for(lambda: (s := node.apps.read_namespaced_stateful_set("web", NS)) and s.status.observed_generation == 2 and s,
                    "the new template observed")
    assert set_.status.update_revision != set_.status.current_revision
    assert all(p.spec.containers[0].image == node.v1 for p in live_pods(node).values())
    assert "only available for RollingUpdate strategy type" in kubectl("rollout", "status", "sts/web", check=False).stderr
    node.core.delete_namespaced_pod("web-0", NS)
    back = wait_for(lambda: (p := live_pods(node).get("web-0")) and p.spec.containers[0].image == node.v2 and p,
                    "web-0 made again from the new template", 60)
    assert back.metadata.labels["controller-revision-hash"] == set_.status.update_revision
    assert live_pods(node)["web-1"].spec.containers[0].image == node.v1


def test_volume_claim_templates_make_a_claim_per_pod(node, kubectl):
    """Each pod gets its own claims from the templates, named
    `<template>-<pod>` with the set's selector labels, bound before the pod
    runs (the default class provisions them on the pod's node); deleting
    the set keeps them (retention `Retain`)."""
    manifest = stateful_set("web", node.v1, 2, volumeClaimTemplates=[{
        "metadata": {"name": "www"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }])
    manifest["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [{"name": "www", "mountPath": "/data"}]
    node.apps.create_namespaced_stateful_set(NS, manifest)
    wait_for(lambda: ready_names(node) == ["web-0", "web-1"], "both pods ready with their volumes", 120)
    for ordinal in range(2):
        # The pod runs once the claim names its volume; Bound is written after.
        claim = wait_for(lambda: (lambda c: c if c.status.phase == "Bound" else None)(
            node.core.read_namespaced_persistent_volume_claim(f"www-web-{ordinal}", NS)), f"www-web-{ordinal} Bound")
        assert claim.metadata.labels == {"app": "web"}, claim.metadata
        pod = live_pods(node)[f"web-{ordinal}"]
        volume = next(v for v in pod.spec.volumes if v.name == "www")
        assert volume.persistent_volume_claim.claim_name == f"www-web-{ordinal}"
    assert "www-web-0" in kubectl.out("get", "pvc")
    stored = node.apps.read_namespaced_stateful_set("web", NS)
    assert stored.spec.volume_claim_templates[0].spec.volume_mode == "Filesystem"
    assert stored.spec.persistent_volume_claim_retention_policy.when_deleted == "Retain"
    node.apps.delete_namespaced_stateful_set("web", NS)
    wait_for(lambda: not live_pods(node), "the pods to go")
    assert len(node.core.list_namespaced_persistent_volume_claim(NS).items) == 2
    for ordinal in range(2):
        node.core.delete_namespaced_persistent_volume_claim(f"www-web-{ordinal}", NS)
