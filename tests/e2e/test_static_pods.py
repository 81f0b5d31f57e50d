"""Static pods (issue 15, SPEC W2): pods from a manifest directory, a
manifest URL and manifests pushed to the agent's API, merged with the API's
pods; their mirror pods in the API (seen by kubectl, selected by Services,
recreated when deleted); and an agent that runs them with no API server at
all, whose mirror pods appear once the API server does, with nothing
restarted. All inside network namespaces the tests make."""

import http.client
import http.server
import json
import pathlib
import shutil
import signal
import ssl
import subprocess
import threading
import time

import pytest
import yaml

from conftest import BINARY, Portal
from support import agent_bed, nodes, registry
from support.agent_bed import NS, AgentNode, container_pids, running_containers_of, web_image
from support.tls import agent_client_certificate
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

URL_PORT = 18080
NODE = "node-1"


class ManifestServer:
    """A manifest URL on the node's loopback whose body a test sets."""

    def __init__(self, port):
        self.body = b""
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    args = [
        "--pod-manifest-path", str(manifests),
        "--manifest-url", f"http://127.0.0.1:{URL_PORT}/pods.yaml",
        "--manifest-url-header", "X-Portal-Test:static",
        "--http-check-frequency", "1s",
        "--manifest-endpoint",
    ]
    with AgentNode(tmp_path_factory.mktemp("agent"), node_name=NODE, extra_args=args) as node:
        node.manifests = manifests
        node.web = web_image(node)
        node.web2 = web_image(node, tag="2")
        node.url = ManifestServer(URL_PORT)
        try:
            yield node
        finally:
            node.url.close()


def static_pod(name, image, labels=None, **spec):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "containers": [{"name": "web", "image": image, "ports": [{"containerPort": 8080, "name": "http"}]}],
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }


def fetch(url, timeout=2):
    result = subprocess.run(["wget", "-qO-", "--tries=1", "-T", str(timeout), url], capture_output=True, text=True, timeout=timeout + 5)
    return result.stdout if result.returncode == 0 else None


def mirror(node, name, hash_=None):
    """The mirror pod when it is Running and ready (of that hash, if given)."""
    try:
        pod = node.pod(name)
    except Exception:
        return None
    annotations = pod.metadata.annotations or {}
    if hash_ is not None and annotations.get("kubernetes.io/config.mirror") != hash_:
        return None
    statuses = pod.status.container_statuses or []
    running = pod.status.phase == "Running" and statuses and all(s.ready for s in statuses)
    return pod if running and pod.status.pod_ip and pod.metadata.deletion_timestamp is None else None


def gone(node, name):
    return not any(p.metadata.name == name for p in node.core.list_namespaced_pod(NS).items)


def pids_of(node, uid):
    agent_dir = node.data_dir / "agent"
    return {cid: pid for cid, pid in container_pids(agent_dir).items() if cid in running_containers_of(agent_dir, uid)}


def test_a_manifest_file_runs_changes_and_stops(node):
    path = node.manifests / "web.yaml"
    path.write_text(yaml.safe_dump(static_pod("web", node.web)))
    # The directory is read every 20 s: a pod Running well before that
    # came from the change notification.
    started = time.monotonic()
    pod = wait_for(lambda: mirror(node, f"web-{NODE}"), "the static pod's mirror Running", timeout=60)
    annotations = pod.metadata.annotations
    uid = annotations["kubernetes.io/config.hash"]
    assert annotations["kubernetes.io/config.mirror"] == uid
    assert annotations["kubernetes.io/config.source"] == "file"
    assert "kubernetes.io/config.seen" in annotations
    assert pod.metadata.uid != uid, "the mirror is an API object of its own"
    owner = pod.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid) == ("Node", NODE, node.core.read_node(NODE).metadata.uid)
    assert pod.spec.node_name == NODE
    assert f"pod/web-{NODE}" in node.kubectl("get", "pods", "-o", "name")
    assert fetch(f"http://{pod.status.pod_ip}:8080/name.txt") == f"web-{NODE}\n"
    # Its Events are recorded under its name (those after the mirror came
    # carry the mirror's UID, so kubectl describe shows them).
    wait_for(lambda: any(reason == "Started" for _, reason, _ in node.events(f"web-{NODE}")), "the static pod's Started Event")
    # kubectl exec and logs reach the static pod through its mirror's name.
    assert node.kubectl("exec", f"web-{NODE}", "--", "cat", "/var/www/name.txt") == f"web-{NODE}\n"
    node.kubectl("logs", f"web-{NODE}")
    first_pids = pids_of(node, uid)
    assert first_pids, "the static pod's containers run under its own UID"
    print(f"file notification to Running: {time.monotonic() - started:.1f}s")

    # An edit is a new pod: new hash, new containers, the old ones gone.
    path.write_text(yaml.safe_dump(static_pod("web", node.web2)))
    changed = wait_for(
        lambda: (lambda p: p if p and p.metadata.annotations["kubernetes.io/config.hash"] != uid else None)(mirror(node, f"web-{NODE}")),
        "the edited static pod's mirror Running",
        timeout=60,
    )
    assert changed.spec.containers[0].image == node.web2
    new_uid = changed.metadata.annotations["kubernetes.io/config.hash"]
    wait_for(lambda: not running_containers_of(node.data_dir / "agent", uid), "the old static pod's containers to stop")
    assert pids_of(node, new_uid)

    # Removing the file stops the pod and removes its mirror.
    path.unlink()
    wait_for(lambda: gone(node, f"web-{NODE}"), "the mirror pod to go")
    wait_for(lambda: not running_containers_of(node.data_dir / "agent", new_uid), "the static pod's containers to stop")


def test_an_edited_host_network_pod_starts_after_the_old_one_stopped(node):
    """One static pod per name at a time: the edited pod's new version waits
    for the old one, which holds the node's port 8080 while it stops."""
    path = node.manifests / "hostweb.yaml"
    slow_stop = ["sh", "-c", "hostname > /var/www/name.txt; trap 'sleep 2; exit 0' TERM; httpd -f -p 8080 -h /var/www & while true; do sleep 1; done"]
    first = static_pod("hostweb", node.web, hostNetwork=True)
    first["spec"]["containers"][0]["command"] = slow_stop
    first["spec"]["terminationGracePeriodSeconds"] = 10
    path.write_text(yaml.safe_dump(first))
    name = f"hostweb-{NODE}"
    try:
        pod = wait_for(lambda: mirror(node, name), "the host-network static pod Running", timeout=60)
        uid = pod.metadata.annotations["kubernetes.io/config.hash"]
        wait_for(lambda: fetch(f"http://{nodes.NODE_IP}:8080/name.txt"), "the pod serving on the node's port")
        # The new version serves on the same port and exits if it cannot bind.
        path.write_text(yaml.safe_dump(static_pod("hostweb", node.web2, hostNetwork=True)))
        changed = wait_for(
            lambda: (lambda p: p if p and p.metadata.annotations["kubernetes.io/config.hash"] != uid else None)(mirror(node, name)),
            "the edited host-network pod Running",
            timeout=60,
        )
        assert changed.status.container_statuses[0].restart_count == 0, "the new pod started while the old one held the port"
        assert not running_containers_of(node.data_dir / "agent", uid)
    finally:
        path.unlink()
    wait_for(lambda: gone(node, name), "the mirror pod to go")


def test_a_bad_manifest_is_reported_and_the_others_still_run(node):
    (node.manifests / "broken.yaml").write_text("metadata: {name: broken\nspec: [")
    (node.manifests / "nocontainers.json").write_text(json.dumps({"metadata": {"name": "empty"}, "spec": {"containers": []}}))
    (node.manifests / "good.yaml").write_text(yaml.safe_dump(static_pod("good", node.web)))
    try:
        wait_for(lambda: mirror(node, f"good-{NODE}"), "the good static pod Running", timeout=60)

        def reported():
            events = node.core.list_namespaced_event(NS, field_selector=f"involvedObject.kind=Node,involvedObject.name={NODE}").items
            messages = [e.message for e in events if e.reason == "FailedStaticPodManifest" and e.type == "Warning"]
            return messages if any("broken.yaml" in m for m in messages) and any("nocontainers.json" in m and "spec.containers" in m for m in messages) else None

        wait_for(reported, "Warning events naming the bad manifests")
        assert "broken.yaml" in node.portal.log()
        assert gone(node, f"broken-{NODE}") and gone(node, f"empty-{NODE}")
    finally:
        for name in ("broken.yaml", "nocontainers.json", "good.yaml"):
            (node.manifests / name).unlink()
    wait_for(lambda: gone(node, f"good-{NODE}"), "the good static pod's mirror to go")


def test_a_mirror_pod_is_selected_by_a_service_and_comes_back_when_deleted(node):
    path = node.manifests / "shop.yaml"
    path.write_text(yaml.safe_dump(static_pod("shop", node.web, labels={"app": "shop"})))
    name = f"shop-{NODE}"
    try:
        pod = wait_for(lambda: mirror(node, name), "the mirror Running", timeout=60)
        uid = pod.metadata.annotations["kubernetes.io/config.hash"]
        pids = pids_of(node, uid)
        node.core.create_namespaced_service(NS, {"metadata": {"name": "shop"}, "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        discovery = agent_bed.kubernetes.client.DiscoveryV1Api(node.core.api_client)

        def listed():
            slices = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=shop").items
            endpoints = [e for s in slices for e in (s.endpoints or [])]
            return endpoints if any(pod.status.pod_ip in e.addresses and e.conditions.ready and e.target_ref.name == name for e in endpoints) else None

        wait_for(listed, "the mirror pod in the Service's EndpointSlice")
        cluster_ip = node.core.read_namespaced_service("shop", NS).spec.cluster_ip
        agent_bed.wait_programmed(cluster_ip)
        wait_for(lambda: fetch(f"http://{cluster_ip}/name.txt") == f"{name}\n", "traffic through the Service to the static pod")

        # Someone else marks the mirror not Ready (the node lifecycle
        # controller does while a node is away): the agent writes its own
        # status back, and the pod is in the Service again.
        pod_ready = lambda p: next(c.status for c in p.status.conditions if c.type == "Ready")
        marked = node.core.patch_namespaced_pod_status(name, NS, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        assert pod_ready(marked) == "False"
        wait_for(lambda: pod_ready(node.pod(name)) == "True", "the agent to write the mirror Ready again")
        wait_for(listed, "the mirror pod back in the EndpointSlice")

        # The API keeps a mirror a mirror.
        refused = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "annotate", "pod", name, "kubernetes.io/config.mirror-"], capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "may not remove or update mirror pod annotation" in refused.stderr, refused.stderr

        # Deleted through the API: the mirror comes back (a new object), the
        # static pod itself never stopped.
        node.kubectl("delete", "pod", name, "--wait=false")
        back = wait_for(
            lambda: (lambda p: p if p and p.metadata.uid != pod.metadata.uid else None)(mirror(node, name)),
            "the mirror pod to come back",
            timeout=60,
        )
        assert back.metadata.annotations["kubernetes.io/config.mirror"] == uid
        assert pids_of(node, uid) == pids, "deleting the mirror restarted the static pod"
        wait_for(lambda: fetch(f"http://{cluster_ip}/name.txt") == f"{name}\n", "traffic after the mirror came back")
    finally:
        node.core.delete_namespaced_service("shop", NS)
        path.unlink()
    wait_for(lambda: gone(node, name), "the mirror pod to go")


def test_a_manifest_url_runs_survives_its_server_going_and_follows_changes(node):
    name = f"remote-{NODE}"
    node.url.body = yaml.safe_dump(static_pod("remote", node.web)).encode()
    pod = wait_for(lambda: mirror(node, name), "the URL's pod Running", timeout=60)
    assert pod.metadata.annotations["kubernetes.io/config.source"] == "http"
    assert node.url.requests[-1].get("x-portal-test") == "static", "the --manifest-url-header is sent"
    uid = pod.metadata.annotations["kubernetes.io/config.hash"]
    pids = pids_of(node, uid)

    # The server answers garbage, then goes away: the last good set stays.
    # (The agent logs each new problem once: it has handled each when its
    # log says so.)
    kept = lambda: node.portal.log().count("the last good set keeps running")
    before = kept()
    node.url.body = b"{not: [a manifest"
    wait_for(lambda: kept() > before, "the agent to report the bad manifest")
    node.url.close()
    wait_for(lambda: kept() > before + 1, "the agent to report the unreachable URL")
    assert mirror(node, name, uid) and pids_of(node, uid) == pids, "an unreachable URL stopped its pod"
    assert "the last good set keeps running" in node.portal.log()

    # Back with a changed manifest: picked up.
    node.url = ManifestServer(URL_PORT)
    node.url.body = yaml.safe_dump(static_pod("remote", node.web2)).encode()
    changed = wait_for(
        lambda: (lambda p: p if p and p.metadata.annotations["kubernetes.io/config.hash"] != uid else None)(mirror(node, name)),
        "the changed URL pod Running",
        timeout=60,
    )
    assert changed.spec.containers[0].image == node.web2
    wait_for(lambda: not running_containers_of(node.data_dir / "agent", uid), "the old URL pod's containers to stop")
    node.url.body = b""
    wait_for(lambda: gone(node, name), "the URL pod to go with an empty manifest")


def agent_api(method, path, body=None, cert=None):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert:
        context.load_cert_chain(*cert)
    connection = http.client.HTTPSConnection(nodes.NODE_IP, 10250, context=context, timeout=10)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_manifests_pushed_to_the_agent_api(node, tmp_path):
    # No anonymous access: without a client certificate the handshake fails.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        agent_api("GET", "/manifests")
    cert = agent_client_certificate(tmp_path, node.data_dir / "pki")
    status, text = agent_api("PUT", "/manifests", b"metadata: {name: bad}\nspec: {}\n", cert)
    assert status == 400 and "spec.containers" in text
    status, text = agent_api("PUT", "/manifests", yaml.safe_dump(static_pod("pushed", node.web)).encode(), cert)
    assert status == 200 and f"pushed-{NODE}" in text
    pod = wait_for(lambda: mirror(node, f"pushed-{NODE}"), "the pushed pod Running", timeout=60)
    assert pod.metadata.annotations["kubernetes.io/config.source"] == "endpoint"
    status, text = agent_api("GET", "/manifests", cert=cert)
    assert status == 200 and [p["metadata"]["name"] for p in json.loads(text)["items"]] == [f"pushed-{NODE}"]
    # An empty push stops every pushed pod.
    assert agent_api("PUT", "/manifests", b"", cert)[0] == 200
    wait_for(lambda: gone(node, f"pushed-{NODE}"), "the pushed pod to go")


def test_nothing_is_left_after_the_static_pods_go(node):
    """After the tests above: no pod process, sandbox or link remains."""
    def clean():
        left = node.leftovers()
        return left if not any(left.values()) else None
    wait_for(clean, "everything the static pods made to be removed")
