"""Resource metrics (issue 34): the agent reads usage from cgroups and
serves it (`/stats/summary`, `/metrics/resource`); the API server answers
`metrics.k8s.io/v1beta1` from it, so `kubectl top nodes|pods` works with
nothing to install, and a CPU-burning pod shows as busy."""

import json
import subprocess

import kubernetes
import pytest

from support import nodes
from support.agent_bed import NS, AgentNode, busybox_image, pod_manifest
from support.tls import agent_client_certificate
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with AgentNode(tmp_path_factory.mktemp("metrics")) as node:
        node.busybox = busybox_image(node)
        yield node


def millicores(text):
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def top_pods(node):
    """kubectl top pods as {name: (millicores, memory)}, {} until it answers."""
    result = node.kubectl("top", "pods", "-n", NS, "--no-headers", check=False)
    rows = [line.split() for line in result.splitlines() if line.strip()]
    return {row[0]: (millicores(row[1]), row[2]) for row in rows}


def test_kubectl_top_shows_a_busy_pod_and_the_node(node):
    burn = pod_manifest("burn", node.busybox, ["sh", "-c", "while :; do :; done"])
    burn["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    node.core.create_namespaced_pod(NS, burn)
    node.core.create_namespaced_pod(NS, pod_manifest("idle", node.busybox, ["sleep", "3600"]))
    try:
        node.wait_running("burn")
        node.wait_running("idle")
        seen = wait_for(lambda: (lambda t: t if {"burn", "idle"} <= t.keys() else None)(top_pods(node)),
                        "kubectl top pods to list both pods", timeout=60)
        # A busy loop takes most of a core; sleep takes none.
        busy = wait_for(lambda: top_pods(node).get("burn", (0, ""))[0] >= 300 and top_pods(node),
                        "the busy pod's CPU", timeout=60)
        assert busy["idle"][0] < 50, busy
        assert seen["burn"][1].endswith("Mi")

        nodes = node.kubectl("top", "nodes", "--no-headers").split()
        assert nodes[0] == node.node_name and nodes[1].endswith("m") and nodes[2].endswith("%"), nodes

        # The API itself, as an autoscaler reads it.
        raw = json.loads(node.kubectl("get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods/burn"))
        assert raw["kind"] == "PodMetrics" and raw["containers"][0]["name"] == "burn"
        assert raw["containers"][0]["usage"]["cpu"].endswith("n"), raw
        listed = json.loads(node.kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"))
        assert listed["kind"] == "NodeMetricsList" and listed["items"][0]["metadata"]["name"] == node.node_name
        # Label selectors, as `kubectl top pods -l`.
        node.core.patch_namespaced_pod("burn", NS, {"metadata": {"labels": {"app": "burn"}}})
        selected = node.kubectl("top", "pods", "-n", NS, "-l", "app=burn", "--no-headers").split()
        assert selected[0] == "burn", selected
        missing = raw_status(node, f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods/nope")
        assert "NotFound" in missing and 'pods.metrics.k8s.io "nope" not found' in missing, missing
    finally:
        for name in ("burn", "idle"):
            node.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def raw_status(node, path, *extra):
    """`kubectl get --raw PATH` that must fail: its error text."""
    result = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "get", "--raw", path, *extra],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stdout
    return result.stderr


def test_discovery_and_permissions(node):
    resources = node.kubectl("api-resources", "--api-group=metrics.k8s.io", "--no-headers")
    names = sorted(line.split()[0] for line in resources.splitlines())
    assert names == ["nodes", "pods"], resources
    denied = raw_status(node, f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods", "--as=nobody")
    assert 'pods.metrics.k8s.io is forbidden: User "nobody" cannot list resource "pods"' in denied, denied
    denied = raw_status(node, "/apis/metrics.k8s.io/v1beta1/nodes", "--as=nobody")
    assert "Forbidden" in denied, denied
    # Node metrics are cluster-scoped: a namespace's path does not exist
    # (a namespaced Role never reads every node), nor does a watch.
    assert "NotFound" in raw_status(node, f"/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/nodes")
    assert "MethodNotAllowed" in raw_status(node, "/apis/metrics.k8s.io/v1beta1/nodes?watch=true") \
        or "not allow" in raw_status(node, "/apis/metrics.k8s.io/v1beta1/nodes?watch=true")


def test_the_agent_serves_the_kubelets_resource_metrics(node, tmp_path):
    """`/metrics/resource` and `/stats/summary` on the agent API, as
    metrics-server scrapes them (with a client certificate of the agents'
    client CA, as the API server's)."""
    node.core.create_namespaced_pod(NS, pod_manifest("steady", node.busybox, ["sleep", "3600"]))
    try:
        node.wait_running("steady")
        certificate = agent_client_certificate(tmp_path, node.data_dir / "pki")

        def scrape(path):
            return subprocess.run(
                ["curl", "-sk", "--cert", str(certificate[0]), "--key", str(certificate[1]),
                 f"https://{nodes.NODE_IP}:10250{path}"], capture_output=True, text=True, timeout=30).stdout

        text = wait_for(lambda: (lambda t: t if 'pod="steady"' in t else None)(scrape("/metrics/resource")),
                        "the pod in /metrics/resource")
        assert "# TYPE container_cpu_usage_seconds_total counter" in text
        assert 'container_memory_working_set_bytes{container="steady",namespace="default",pod="steady"}' in text
        assert "node_cpu_usage_seconds_total " in text and "resource_scrape_error 0" in text
        summary = json.loads(scrape("/stats/summary"))
        assert summary["node"]["nodeName"] == node.node_name
        assert any(p["podRef"]["name"] == "steady" for p in summary["pods"])
        # Without a client certificate: refused.
        assert "steady" not in subprocess.run(["curl", "-sk", f"https://{nodes.NODE_IP}:10250/stats/summary"],
                                              capture_output=True, text=True, timeout=30).stdout
    finally:
        node.core.delete_namespaced_pod("steady", NS, grace_period_seconds=0)


BURNER = """
apiVersion: v1
kind: ConfigMap
metadata: {name: load}
data: {burn: "yes"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: burner}
spec:
  replicas: 1
  selector: {matchLabels: {app: burner}}
  template:
    metadata: {labels: {app: burner}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burner
        image: IMAGE
        # Busy while the ConfigMap says so (its volume follows it), idle after.
        command: ["sh", "-c", "while :; do if [ \\"$(cat /load/burn)\\" = yes ]; then i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; else sleep 1; fi; done"]
        resources: {requests: {cpu: 100m}}
        volumeMounts: [{name: load, mountPath: /load}]
      volumes: [{name: load, configMap: {name: load}}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: burner}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burner}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  # Shortened for the test: scale down as soon as the load is gone.
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
"""


def test_an_autoscaler_follows_cpu_load_up_and_back_down(node, tmp_path):
    manifest = tmp_path / "burner.yaml"
    manifest.write_text(BURNER.replace("IMAGE", node.busybox))
    node.kubectl("apply", "-f", str(manifest))
    apps = kubernetes.client.AppsV1Api(node.portal.api_client())
    autoscaling = kubernetes.client.AutoscalingV2Api(node.portal.api_client())
    try:
        # Under load: more replicas (1 → 3 at most).
        wait_for(lambda: (apps.read_namespaced_deployment("burner", NS).spec.replicas or 0) >= 2,
                 "the autoscaler to scale the Deployment up", timeout=120)
        # The autoscaler scales the target first and writes its own status
        # after: wait for the status of the sync that scaled.
        hpa = wait_for(lambda: (lambda h: h if (h.status.desired_replicas or 0) >= 2 else None)(
                           autoscaling.read_namespaced_horizontal_pod_autoscaler("burner", NS)),
                       "the autoscaler's status after scaling up", timeout=60)
        conditions = {c.type: (c.status, c.reason, c.message) for c in hpa.status.conditions}
        assert conditions["ScalingActive"][:2] == ("True", "ValidMetricFound"), conditions
        assert hpa.status.current_metrics[0].resource.current.average_utilization > 50
        assert hpa.status.last_scale_time is not None
        row = node.kubectl("get", "hpa", "burner", "--no-headers").split()
        assert row[2] == "cpu:" and row[3].endswith("/50%"), row
        events = node.kubectl("get", "events", "--field-selector", "involvedObject.name=burner,reason=SuccessfulRescale")
        assert "New size:" in events and "cpu resource utilization (percentage of request) above target" in events
        # The load stops: back to one replica.
        node.core.patch_namespaced_config_map("load", NS, {"data": {"burn": "no"}})
        wait_for(lambda: apps.read_namespaced_deployment("burner", NS).spec.replicas == 1,
                 "the autoscaler to scale back down", timeout=150)
        # (The event follows the scale.)
        wait_for(lambda: "All metrics below target" in node.kubectl(
                     "get", "events", "--field-selector", "involvedObject.name=burner,reason=SuccessfulRescale"),
                 "the scale-down event", timeout=30)
    finally:
        node.kubectl("delete", "-f", str(manifest), "--wait=false", check=False)
