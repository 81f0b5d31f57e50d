"""Helm on a real node (issue 27): the stock chart that `helm create` makes
installs with Helm 3 and Helm 4 (`--wait`), passes `helm test`, upgrades
to 2 replicas, rolls back and uninstalls leaving nothing behind.

The chart runs `nginx:1.16.0` (its appVersion) and its test pod
`busybox`, both Docker Hub names the node's registry mirror serves: a
real multi-layer Debian nginx image (support.debian_images) and busybox.
Helm 4 lists through watches (client-go's streaming lists with
`sendInitialEvents`), waits with kstatus and applies server-side; Helm 3
sends its DeleteOptions as protobuf. The binaries come from
`scripts/setup` (`.cache/helm-3`, `.cache/helm-4`)."""

import json
import pathlib
import subprocess

import pytest
from kubernetes import client

from support import debian_images, registry
from support.agent_bed import AgentNode, wait_endpoints_programmed
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]

ROOT = pathlib.Path(__file__).resolve().parents[2]
HELMS = {major: ROOT / ".cache" / f"helm-{major}" / "helm" for major in (3, 4)}


@pytest.fixture(scope="module")
def layout():
    # Built before the node namespace is entered: Debian's packages come
    # from the machine's apt sources.
    return debian_images.nginx_layout()


@pytest.fixture(scope="module")
def node(tmp_path_factory, layout):
    with AgentNode(tmp_path_factory.mktemp("helm")) as node:
        debian_images.push(layout, node.registry.host, "library/nginx", "1.16.0")
        registry.push_busybox(node.registry, "library/busybox", "latest")
        node.apps = client.AppsV1Api(node.portal.api_client())
        yield node


class Helm:
    def __init__(self, binary, portal, home):
        assert binary.exists(), f"{binary} is missing: scripts/setup unpacks it"
        self.binary = binary
        # Its own cache, configuration and data: no state shared between
        # the two Helms or with the machine's user.
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "KUBECONFIG": portal.kubeconfig,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args, timeout=240):
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.env["HOME"])
        assert result.returncode == 0, f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        return result.stdout


def replicas(node, namespace):
    """The Deployment's pods (the chart's test pod carries the same labels)."""
    pods = node.core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/instance=demo").items
    return [p for p in pods if any(o.kind == "ReplicaSet" for o in p.metadata.owner_references or [])]


def ready_pods(node, namespace):
    return [p for p in replicas(node, namespace) if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
            and all(s.ready for s in p.status.container_statuses or [])]


def what_is_left(node, namespace):
    """Every object of the namespace but what Kubernetes itself puts in
    each namespace (the default ServiceAccount, the root CA ConfigMap)."""
    apps, core = node.apps, node.core
    discovery = client.DiscoveryV1Api(node.portal.api_client())
    left = {
        "pods": [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
        "services": [s.metadata.name for s in core.list_namespaced_service(namespace).items],
        "endpointslices": [s.metadata.name for s in discovery.list_namespaced_endpoint_slice(namespace).items],
        "deployments": [d.metadata.name for d in apps.list_namespaced_deployment(namespace).items],
        "replicasets": [r.metadata.name for r in apps.list_namespaced_replica_set(namespace).items],
        "secrets": [s.metadata.name for s in core.list_namespaced_secret(namespace).items],
        "serviceaccounts": [s.metadata.name for s in core.list_namespaced_service_account(namespace).items if s.metadata.name != "default"],
        "configmaps": [c.metadata.name for c in core.list_namespaced_config_map(namespace).items if c.metadata.name != "kube-root-ca.crt"],
    }
    return {kind: names for kind, names in left.items() if names}


@pytest.fixture
def namespace(node, major):
    """The release's namespace, gone after the test also when it fails (a
    failed Helm 3 case must not become Helm 4's leftovers)."""
    name = f"helm-{major}"
    yield name
    try:
        node.core.delete_namespace(name)
    except client.ApiException as error:
        if error.status != 404:
            raise
    wait_for(lambda: name not in {n.metadata.name for n in node.core.list_namespace().items}, f"namespace {name} gone", 90)


@pytest.mark.parametrize("major", sorted(HELMS))
def test_the_stock_chart_installs_tests_upgrades_rolls_back_and_uninstalls(node, tmp_path, major, namespace):
    helm = Helm(HELMS[major], node.portal, tmp_path)
    assert helm("version", "--short").startswith(f"v{major}.")
    helm("create", "demo")

    out = helm("install", "demo", "./demo", "--namespace", namespace, "--create-namespace", "--wait", "--timeout", "3m")
    assert "STATUS: deployed" in out, out
    # --wait returned: what it waited for is there.
    assert len(ready_pods(node, namespace)) == 1
    deployment = node.apps.read_namespaced_deployment("demo", namespace)
    assert deployment.status.ready_replicas == 1 and deployment.spec.template.spec.containers[0].image == "nginx:1.16.0"
    # Helm 4 applies server-side, Helm 3 creates (and patches client-side).
    operations = {(m.manager, m.operation) for m in deployment.metadata.managed_fields}
    assert ("helm", "Apply" if major == 4 else "Update") in operations, operations
    assert node.core.read_namespaced_service_account("demo", namespace)
    assert node.core.read_namespaced_endpoints("demo", namespace).subsets[0].addresses
    release = node.core.read_namespaced_secret("sh.helm.release.v1.demo.v1", namespace)
    assert release.type == "helm.sh/release.v1" and release.metadata.labels["status"] == "deployed"

    # The test pod fetches the Service by its name through the cluster DNS.
    # Helm 4 returns the moment the pod is ready; the proxy programs the
    # new endpoint within its min-sync-period (1 s, as kube-proxy's), and
    # our test pod starts faster than that.
    wait_endpoints_programmed([p.status.pod_ip for p in ready_pods(node, namespace)])
    out = helm("test", "demo", "--namespace", namespace, "--timeout", "2m", "--logs")
    assert "Phase:          Succeeded" in out, out

    helm("upgrade", "demo", "./demo", "--namespace", namespace, "--set", "replicaCount=2", "--wait", "--timeout", "3m")
    assert len(ready_pods(node, namespace)) == 2
    assert node.apps.read_namespaced_deployment("demo", namespace).status.ready_replicas == 2

    helm("rollback", "demo", "1", "--namespace", namespace, "--wait", "--timeout", "3m")
    assert node.apps.read_namespaced_deployment("demo", namespace).spec.replicas == 1
    wait_for(lambda: len(replicas(node, namespace)) == 1 and len(ready_pods(node, namespace)) == 1, "one replica again")
    history = json.loads(helm("history", "demo", "--namespace", namespace, "--output", "json"))
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "superseded"), (3, "deployed")]
    assert history[2]["description"] == "Rollback to 1"
    assert json.loads(helm("list", "--namespace", namespace, "--output", "json"))[0]["revision"] == "3"

    out = helm("uninstall", "demo", "--namespace", namespace, "--wait", "--timeout", "2m")
    assert 'release "demo" uninstalled' in out, out
    assert json.loads(helm("list", "--namespace", namespace, "--output", "json")) == []
    # Helm keeps test pods (hooks without a delete policy) on purpose, on
    # Kubernetes too: the chart's own `demo-test-connection` is all it leaves.
    wait_for(lambda: what_is_left(node, namespace) == {"pods": ["demo-test-connection"]}, "only the test pod left", 60)
    node.core.delete_namespaced_pod("demo-test-connection", namespace)
    wait_for(lambda: not node.core.list_namespaced_pod(namespace).items and not any(node.leftovers().values()),
             "nothing left on the node", 60)
