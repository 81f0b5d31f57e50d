"""Stock kubectl against Portal (issue 3): the commands of the Services
tutorials, asserting on what kubectl prints, as a user would see it.

Runs with every kubectl in KUBECTLS: the machine's (`/usr/bin/kubectl` or
PATH) and, when `scripts/setup` unpacked it, Debian's kubectl 1.20.
"""

import re
import subprocess
import sys
import time

import pytest

from support.kubectl import KUBECTLS, Kubectl, client_minor

MANIFEST = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  labels: {tier: frontend, stack: prod}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 9376}
  - {name: https, port: 443, targetPort: 9377}
---
apiVersion: v1
kind: ReplicationController
metadata:
  name: web
spec:
  replicas: 2
  selector: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: server
        image: registry.local/web:1.0
        ports: [{containerPort: 9376}]
---
apiVersion: v1
kind: Pod
metadata:
  name: front
  labels: {tier: frontend, stack: prod}
spec:
  containers: [{name: c, image: registry.local/front:1.0}]
"""


@pytest.fixture(params=KUBECTLS, ids=lambda p: "kubectl-1.20" if "1.20" in p else "kubectl")
def kubectl(request, portal, tmp_path):
    return Kubectl(request.param, portal, tmp_path)


def header(output):
    """The column names of kubectl's table output."""
    return output.splitlines()[0].split()


def rows(output):
    return [line.split() for line in output.splitlines()[1:] if line.strip()]


def test_apply_reapply_and_change(kubectl):
    out = kubectl.apply(MANIFEST)
    assert "service/web created" in out
    assert "replicationcontroller/web created" in out
    assert "pod/front created" in out
    out = kubectl.apply(MANIFEST)
    assert out.count("unchanged") == 3, out
    version = kubectl.json("get", "svc", "web")["metadata"]["resourceVersion"]
    assert kubectl.json("get", "svc", "web")["metadata"]["resourceVersion"] == version

    changed = MANIFEST.replace("  - {name: https, port: 443, targetPort: 9377}\n", "").replace("stack: prod}", "stack: prod, v: two}", 1)
    out = kubectl.apply(changed)
    assert "service/web configured" in out
    svc = kubectl.json("get", "svc", "web")
    assert [p["port"] for p in svc["spec"]["ports"]] == [80]
    assert svc["metadata"]["labels"]["v"] == "two"


def test_get_columns(kubectl):
    kubectl.apply(MANIFEST)
    assert header(kubectl.out("get", "svc", "-o", "wide")) == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
    web = rows(kubectl.out("get", "svc", "web", "-o", "wide"))[0]
    assert web[0] == "web" and web[1] == "ClusterIP" and web[4] == "80/TCP,443/TCP" and web[-1] == "app=web"
    assert header(kubectl.out("get", "po", "-o", "wide")) == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    assert rows(kubectl.out("get", "po", "front"))[0][:3] == ["front", "0/1", "Pending"]
    assert header(kubectl.out("get", "rc", "-o", "wide")) == ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert rows(kubectl.out("get", "rc", "web"))[0][:2] == ["web", "2"]
    assert header(kubectl.out("get", "ns")) == ["NAME", "STATUS", "AGE"]
    assert ["default", "Active"] == rows(kubectl.out("get", "ns", "default"))[0][:2]
    kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Endpoints\nmetadata: {name: manual}\nsubsets:\n- addresses: [{ip: 10.244.1.5}]\n  ports: [{port: 9376}]\n")
    assert header(kubectl.out("get", "ep", "manual")) == ["NAME", "ENDPOINTS", "AGE"]
    assert rows(kubectl.out("get", "ep", "manual"))[0][:2] == ["manual", "10.244.1.5:9376"]


def test_get_all_namespaces_and_labels(kubectl):
    kubectl.apply(MANIFEST)
    kubectl("create", "namespace", "team")
    kubectl("apply", "-n", "team", "-f", "-", input="apiVersion: v1\nkind: Service\nmetadata: {name: other}\nspec: {ports: [{port: 53, protocol: UDP}]}\n")
    out = kubectl.out("get", "svc", "-A")
    assert header(out)[:2] == ["NAMESPACE", "NAME"]
    assert ["default", "web"] in [r[:2] for r in rows(out)]
    assert ["team", "other"] in [r[:2] for r in rows(out)]
    out = kubectl.out("get", "svc", "web", "--show-labels")
    assert "stack=prod,tier=frontend" in out


def test_output_formats(kubectl):
    kubectl.apply(MANIFEST)
    as_json = kubectl.json("get", "svc", "web")
    assert as_json["kind"] == "Service" and as_json["spec"]["ports"][0]["protocol"] == "TCP"
    as_yaml = kubectl.out("get", "svc", "web", "-o", "yaml")
    assert "kind: Service" in as_yaml and "name: web" in as_yaml
    assert kubectl.out("get", "svc", "-o", "name").split() == ["service/kubernetes", "service/web"]


def test_watch_sees_a_change(kubectl):
    kubectl.apply(MANIFEST)
    command = [kubectl.binary, "--kubeconfig", kubectl.portal.kubeconfig, "--cache-dir", str(kubectl.cache), "get", "svc", "-w", "--show-labels"]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        first = watcher.stdout.readline()
        assert first.split()[:1] == ["NAME"], first
        assert watcher.stdout.readline().split()[0] == "kubernetes"
        assert watcher.stdout.readline().split()[0] == "web"
        kubectl("label", "svc", "web", "changed=yes")
        seen = ""
        while time.monotonic() < deadline and "changed=yes" not in seen:
            seen = watcher.stdout.readline()
        assert "changed=yes" in seen
    finally:
        watcher.kill()
        watcher.wait()


def test_describe_service(kubectl):
    kubectl.apply(MANIFEST)
    out = kubectl.out("describe", "svc", "web")
    lines = [" ".join(line.split()) for line in out.splitlines()]
    for expected in ["Name: web", "Namespace: default", "Selector: app=web", "Type: ClusterIP", "Port: http 80/TCP", "TargetPort: 9376/TCP", "Session Affinity: None"]:
        assert expected in lines, f"{expected!r} not in\n{out}"


def test_edit_with_scripted_editor(kubectl, tmp_path):
    kubectl.apply(MANIFEST)
    editor = tmp_path / "editor.py"
    editor.write_text(f"#!{sys.executable}\nimport sys\np = sys.argv[-1]\ns = open(p).read().replace('tier: frontend', 'tier: edited')\nopen(p, 'w').write(s)\n")
    editor.chmod(0o755)
    out = kubectl.out("edit", "svc", "web", env={"KUBE_EDITOR": str(editor), "EDITOR": str(editor)})
    assert "service/web edited" in out
    assert kubectl.json("get", "svc", "web")["metadata"]["labels"]["tier"] == "edited"


def test_patch_label_annotate(kubectl):
    kubectl.apply(MANIFEST)
    assert "patched" in kubectl.out("patch", "svc", "web", "--type=strategic", "-p", '{"spec":{"ports":[{"port":80,"targetPort":8080}]}}')
    ports = {p["port"]: p["targetPort"] for p in kubectl.json("get", "svc", "web")["spec"]["ports"]}
    assert ports == {80: 8080, 443: 9377}, "strategic merge keeps the other port"
    kubectl("patch", "svc", "web", "--type=merge", "-p", '{"metadata":{"labels":{"merged":"yes"}}}')
    kubectl("patch", "svc", "web", "--type=json", "-p", '[{"op":"replace","path":"/spec/selector","value":{"app":"other"}}]')
    kubectl("label", "svc", "web", "team=blue")
    kubectl("annotate", "svc", "web", "owner=ops")
    svc = kubectl.json("get", "svc", "web")
    assert svc["metadata"]["labels"]["merged"] == "yes"
    assert svc["metadata"]["labels"]["team"] == "blue"
    assert svc["metadata"]["annotations"]["owner"] == "ops"
    assert svc["spec"]["selector"] == {"app": "other"}
    result = kubectl("patch", "svc", "web", "--type=json", "-p", '[{"op":"test","path":"/spec/type","value":"NodePort"}]', check=False)
    assert result.returncode != 0


def test_scale_and_expose(kubectl):
    kubectl.apply(MANIFEST)
    assert "replicationcontroller/web scaled" in kubectl.out("scale", "rc", "web", "--replicas=3")
    assert rows(kubectl.out("get", "rc", "web"))[0][1] == "3"
    assert "service/exposed exposed" in kubectl.out("expose", "rc", "web", "--port=80", "--target-port=9376", "--name=exposed")
    svc = kubectl.json("get", "svc", "exposed")
    assert svc["spec"]["selector"] == {"app": "web"}
    assert svc["spec"]["ports"][0]["port"] == 80 and svc["spec"]["ports"][0]["targetPort"] == 9376


def test_create_service_sends_protobuf(kubectl):
    assert "service/foo created" in kubectl.out("create", "service", "clusterip", "foo", "--tcp=5678:8080")
    svc = kubectl.json("get", "svc", "foo")
    assert svc["spec"]["ports"][0]["port"] == 5678 and svc["spec"]["ports"][0]["targetPort"] == 8080
    assert svc["spec"]["selector"] == {"app": "foo"}
    assert "service/np created" in kubectl.out("create", "service", "nodeport", "np", "--tcp=80:8080")
    assert kubectl.json("get", "svc", "np")["spec"]["type"] == "NodePort"


def test_delete(kubectl, tmp_path):
    kubectl.apply(MANIFEST)
    assert 'service "web" deleted' in kubectl.out("delete", "svc", "web")
    assert kubectl("get", "svc", "web", check=False).returncode != 0
    path = tmp_path / "manifest.yaml"
    out = kubectl.out("delete", "-f", str(path), "--ignore-not-found")
    assert 'replicationcontroller "web" deleted' in out and 'pod "front" deleted' in out
    # The RC's pods go with it (Background cascade, after the RC).
    deadline = time.monotonic() + 10
    while kubectl.out("get", "po", "-o", "name").strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kubectl.out("get", "po", "-o", "name").strip() == ""


def test_label_selector_on_pods(kubectl):
    kubectl.apply(MANIFEST)
    kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Pod\nmetadata: {name: dev, labels: {tier: frontend, stack: dev}}\nspec: {containers: [{name: c, image: x}]}\n")
    out = kubectl.out("get", "po", "-l", "tier in (frontend),stack=prod", "-o", "name")
    assert out.split() == ["pod/front"]


def test_invalid_object_message(kubectl):
    result = kubectl("apply", "-f", "-", input="apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name}\nspec: {ports: [{port: 80}]}\n", check=False)
    assert result.returncode != 0
    assert 'The Service "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a DNS-1035 label must consist of lower case alphanumeric characters' in result.stderr


def test_describe_shows_slices_and_events(kubectl):
    kubectl.apply(MANIFEST)
    uid = kubectl.json("get", "svc", "web")["metadata"]["uid"]
    kubectl(
        "apply", "-f", "-",
        input=(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            "metadata: {name: web-abc, labels: {kubernetes.io/service-name: web}}\n"
            "addressType: IPv4\nports: [{name: http, port: 9376, protocol: TCP}]\n"
            "endpoints: [{addresses: [10.244.1.5], conditions: {ready: true}}]\n"
            # kubectl before 1.21 reads Endpoints: the controller writes both.
            "---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\n"
            "subsets: [{addresses: [{ip: 10.244.1.5}], ports: [{name: http, port: 9376}]}]\n"
        ),
    )
    event = (
        "apiVersion: v1\nkind: Event\nmetadata: {name: web.1}\n"
        f"involvedObject: {{kind: Service, name: web, namespace: default, uid: {uid}, apiVersion: v1}}\n"
        "reason: Testing\nmessage: hello from the test\ntype: Normal\ncount: 1\n"
        "firstTimestamp: '2026-01-01T00:00:00Z'\nlastTimestamp: '2026-01-01T00:00:00Z'\nsource: {component: e2e}\n"
    )
    kubectl("create", "-f", "-", input=event)
    out = kubectl.out("describe", "svc", "web")
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "Endpoints: 10.244.1.5:9376" in lines, out
    assert any("Testing" in line and "hello from the test" in line for line in lines), out
    assert header(kubectl.out("get", "events")) == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "service/web" in kubectl.out("get", "events")


def test_describe_service_with_an_unnamed_port(kubectl):
    """kubectl 1.32 dereferences every EndpointSlice port's name in describe:
    the controller must write `name: ""` for an unnamed port, as Kubernetes
    does (it panicked with a nil pointer before)."""
    kubectl(
        "apply", "-f", "-",
        input=(
            "apiVersion: v1\nkind: Service\nmetadata: {name: plain}\n"
            "spec: {selector: {app: plain}, ports: [{port: 80, targetPort: 8080}]}\n"
            "---\napiVersion: v1\nkind: Pod\nmetadata: {name: plain-1, labels: {app: plain}}\n"
            "spec: {containers: [{name: c, image: registry.local/app:1}]}\n"
        ),
    )
    status = {"status": {"phase": "Running", "podIP": "10.244.0.7", "conditions": [{"type": "Ready", "status": "True"}]}}
    # No node runs it here: the test writes the status a node would.
    kubectl.portal.core().patch_namespaced_pod_status("plain-1", "default", status)
    deadline = time.monotonic() + 10
    while True:
        slices = kubectl.json("get", "endpointslices", "-l", "kubernetes.io/service-name=plain")["items"]
        if any(s.get("endpoints") for s in slices):
            break
        assert time.monotonic() < deadline, slices
        time.sleep(0.05)
    assert [p["name"] for s in slices for p in s["ports"]] == [""]
    result = kubectl("describe", "svc", "plain", check=False)
    assert result.returncode == 0 and "panic" not in result.stderr, result.stderr
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "Endpoints: 10.244.0.7:8080" in lines, result.stdout


def test_get_all(kubectl):
    """`kubectl get all`: pods, Services and ReplicationControllers are in
    the `all` category of discovery (issue 19)."""
    kubectl.apply(MANIFEST)
    out = kubectl.out("get", "all")
    for name in ("pod/front", "service/web", "replicationcontroller/web"):
        assert name in out, out
    assert "service/kubernetes" in out
    assert "endpoints/" not in out and "event" not in out.lower()


def test_reapplying_a_pod_with_tolerations(kubectl):
    """The server's default tolerations are added on every write, so a
    re-applied manifest with tolerations of its own is no spec change."""
    pod = """\
apiVersion: v1
kind: Pod
metadata:
  name: tolerant
  labels: {v: "1"}
spec:
  tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
  containers: [{name: c, image: registry.local/app:1}]
"""
    kubectl.apply(pod)
    out = kubectl.apply(pod.replace('v: "1"', 'v: "2"'))
    assert "configured" in out, out
    tolerations = kubectl.json("get", "pod", "tolerant")["spec"]["tolerations"]
    assert [t["key"] for t in tolerations] == ["dedicated", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]


def test_wait_for_a_namespace_to_be_deleted(kubectl):
    """A namespace passes through Terminating with its `kubernetes`
    finalizer (as in Kubernetes), so a script can delete it and then wait
    for it to be gone (issue 19). What the namespace went through is read
    from a watch opened before the delete (no timing window); a finalizer on
    a Service inside holds the namespace until `kubectl wait` is watching
    (its -v=6 log shows the watch request)."""
    import subprocess
    import threading

    from kubernetes import watch

    kubectl("create", "namespace", "doomed")
    core = kubectl.portal.core()
    core.create_namespaced_service("doomed", {"metadata": {"name": "inside", "finalizers": ["example.com/hold"]}, "spec": {"ports": [{"port": 80}]}})
    start = core.read_namespace("doomed").metadata.resource_version
    seen = []

    def follow():
        stream = watch.Watch().stream(
            core.list_namespace, field_selector="metadata.name=doomed", resource_version=start, timeout_seconds=30
        )
        for event in stream:
            ns = event["object"]
            conditions = {c.type for c in (ns.status.conditions or [])}
            seen.append((event["type"], ns.status.phase, ns.spec.finalizers if ns.spec else None, conditions))
            if event["type"] == "DELETED":
                return

    follower = threading.Thread(target=follow)
    follower.start()
    kubectl("delete", "namespace", "doomed", "--wait=false")
    waiting = subprocess.Popen(
        [kubectl.binary, "--kubeconfig", kubectl.portal.kubeconfig, "--cache-dir", str(kubectl.cache), "-v=6",
         "wait", "--for=delete", "namespace/doomed", "--timeout=30s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in waiting.stderr:
            if "watch=true" in line:
                break
        core.patch_namespaced_service("inside", "doomed", {"metadata": {"finalizers": None}})
        out, _ = waiting.communicate(timeout=35)
    finally:
        waiting.kill()
    assert "namespace/doomed condition met" in out
    follower.join(timeout=35)
    assert seen and seen[-1][0] == "DELETED", seen
    terminating = [s for s in seen if s[1] == "Terminating"]
    assert terminating[0][2] == ["kubernetes"], seen
    assert any("NamespaceContentRemaining" in s[3] and s[2] == ["kubernetes"] for s in terminating), seen
    assert any(s[0] == "MODIFIED" and not s[2] for s in terminating), "the finalizer is taken off before it goes"
    assert kubectl("get", "namespace", "doomed", check=False).returncode != 0
    assert kubectl.json("get", "svc", "-n", "doomed")["items"] == []


def test_explain_shows_the_real_schemas(kubectl):
    """`kubectl explain` reads the kinds' schemas from /openapi/v3 (kubectl
    1.27+) or /openapi/v2 (1.20): Kubernetes' descriptions."""
    out = kubectl.out("explain", "service.spec.ports")
    assert "The list of ports that are exposed by this service" in out and "targetPort" in out, out
    assert "Container image name" in kubectl.out("explain", "pod.spec.containers.image")
    assert "holderIdentity" in kubectl.out("explain", "lease.spec", "--api-version=coordination.k8s.io/v1")


def test_kubectl_1_20_validates_against_the_schemas(kubectl):
    """kubectl 1.20 validates client-side with /openapi/v2's definitions
    (newer kubectls leave it to the server): either way a typo is refused
    and names the field."""
    result = kubectl("apply", "-f", "-", check=False, input=MANIFEST.replace("  selector: {app: web}\n  ports:", "  selector: {app: web}\n  portz: []\n  ports:", 1))
    assert result.returncode != 0
    assert "portz" in result.stderr, result.stderr
    if "1.20" in kubectl.binary:
        assert "ValidationError(Service.spec)" in result.stderr, result.stderr
    assert kubectl("get", "svc", "web", check=False).returncode != 0, "nothing was created"


def test_debug_copy_to_sends_a_pod_as_protobuf(kubectl):
    """`kubectl debug --copy-to` creates the copy with a protobuf body: every
    kind's protobuf is decoded (issue 19; it was 415 for pods)."""
    kubectl("run", "web", "--image=registry.local/web:1", "--labels=app=web", "--env=MODE=prod")
    result = kubectl(
        "debug", "web", "--copy-to=web-debug", "--image=registry.local/tools:1", "--container=debugger", "-v=8"
    )
    if client_minor(kubectl.binary) >= 30:
        # (kubectl 1.20 sends this one as JSON.)
        assert "application/vnd.kubernetes.protobuf" in result.stderr, "the copy was sent as protobuf"
    copy = kubectl.json("get", "pod", "web-debug")
    containers = {c["name"]: c for c in copy["spec"]["containers"]}
    assert containers["web"]["image"] == "registry.local/web:1"
    assert containers["web"]["env"] == [{"name": "MODE", "value": "prod"}]
    assert containers["debugger"]["image"] == "registry.local/tools:1"


def test_cluster_info_lists_the_control_plane_and_the_dns(kubectl):
    """`kubectl cluster-info` (a newcomer's first command): the control
    plane and the cluster DNS, found by its `kubernetes.io/cluster-service`
    label, each with the address to reach it."""
    # (kubectl 1.20 colours its output even when it is not a terminal.)
    out = re.sub(r"\x1b\[[0-9;]*m", "", kubectl.out("cluster-info"))
    assert "Kubernetes control plane is running at https://" in out, out
    assert "Portal-DNS is running at https://" in out, out
    assert "/api/v1/namespaces/kube-system/services/kube-dns:dns/proxy" in out, out
