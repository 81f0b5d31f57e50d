"""HorizontalPodAutoscalers (`autoscaling/v2`, issue 27): `kubectl
autoscale` makes one, stored with Kubernetes' defaults and shown as kubectl
shows it (no node here, so no metrics: `<unknown>`). Scaling on metrics is
tested in test_resource_metrics.py."""

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
