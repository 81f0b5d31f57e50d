"""HorizontalPodAutoscalers (`autoscaling/v2`, issue 27): `kubectl
autoscale` makes one, stored with Kubernetes' defaults and shown as kubectl
shows it (no node here, so no metrics: `<unknown>`). Scaling on metrics is
tested in test_resource_metrics.py. `autoscaling/v1` (kubectl 1.20's
`autoscale`) is the same object seen as upstream converts it."""

import json

import pytest
from kubernetes import client

from support.api import NS
from support.kubectl import KUBECTLS, Kubectl


def test_kubectl_autoscale_makes_an_autoscaler(portal, tmp_path):
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    kubectl.out("create", "deployment", "web", "--image=registry.local/web:1")
    out = kubectl.out("autoscale", "deployment", "web", "--min=2", "--max=5", "--cpu-percent=60")
    assert "horizontalpodautoscaler.autoscaling/web autoscaled" in out
    hpa = client.AutoscalingV2Api(portal.api_client()).read_namespaced_horizontal_pod_autoscaler("web", NS)
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (2, 5)
    assert hpa.spec.scale_target_ref.kind == "Deployment" and hpa.spec.scale_target_ref.name == "web"
    assert hpa.spec.metrics[0].resource.target.average_utilization == 60
    line = kubectl.out("get", "hpa", "web").splitlines()[1].split()
    assert line[:6] == ["web", "Deployment/web", "cpu:", "<unknown>/60%", "2", "5"], line
    result = kubectl("autoscale", "deployment", "web", "--min=6", "--max=5", "--name=bad", check=False)
    assert result.returncode != 0


@pytest.mark.parametrize("binary", KUBECTLS)
def test_autoscaling_v1_is_the_same_autoscaler_as_v2(portal, tmp_path, binary):
    """kubectl 1.20 posts `autoscaling/v1`: stored at v2 with its CPU target
    as a metric; what only v2 can say survives a v1 client's replace, in
    upstream's annotations, and v2 never shows them."""
    kubectl = Kubectl(binary, portal, tmp_path)
    name = f"v1-{KUBECTLS.index(binary)}"
    kubectl.out("create", "deployment", name, "--image=registry.local/web:1")
    created = kubectl.out("create", "-f", "-", "-o", "json", input=json.dumps({
        "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "maxReplicas": 4, "targetCPUUtilizationPercentage": 70}}))
    assert json.loads(created)["apiVersion"] == "autoscaling/v1"
    v2 = client.AutoscalingV2Api(portal.api_client())
    stored = v2.read_namespaced_horizontal_pod_autoscaler(name, NS)
    assert stored.spec.min_replicas == 1 and stored.spec.metrics[0].resource.target.average_utilization == 70

    memory = {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}}
    v2.patch_namespaced_horizontal_pod_autoscaler(name, NS, {"spec": {"metrics": [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}, memory]}})
    v1 = json.loads(kubectl.out("get", f"horizontalpodautoscalers.v1.autoscaling/{name}", "-o", "json"))
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 70 and "metrics" not in v1["spec"]
    carried = json.loads(v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"])
    assert carried == [{"type": "Resource", "resource": {"name": "memory", "targetAverageValue": "100Mi"}}]
    v1["spec"]["maxReplicas"] = 6
    kubectl.out("replace", "-f", "-", input=json.dumps(v1))
    stored = v2.read_namespaced_horizontal_pod_autoscaler(name, NS)
    assert stored.spec.max_replicas == 6
    # Upstream's order after a v1 write: the carried metrics, then the CPU target.
    assert [m.resource.name for m in stored.spec.metrics] == ["memory", "cpu"]
    assert not any(k.startswith("autoscaling.alpha") for k in stored.metadata.annotations or {})
    described = kubectl.out("describe", f"horizontalpodautoscalers.v1.autoscaling/{name}")
    assert "Max replicas:" in described and ("/ 70%" in described or "utilization:   70%" in described), described

    made = kubectl.out("autoscale", "deployment", name, "--max=3", f"--name={name}-cli")
    assert "autoscaled" in made
    assert v2.read_namespaced_horizontal_pod_autoscaler(f"{name}-cli", NS).spec.max_replicas == 3
    kubectl.out("delete", "hpa", name, f"{name}-cli")
    kubectl.out("delete", "deployment", name)
