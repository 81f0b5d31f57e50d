"""Server-side apply and `metadata.managedFields` (issue 19), as users meet
them: `kubectl apply --server-side` (create, update, conflict,
`--force-conflicts`, fields dropped from the manifest), the managers every
kubectl command records, `kubectl diff --server-side`, and the Python
client's dynamic `server_side_apply`. Both kubectls where they have the
feature."""

import json

import pytest
from kubernetes import dynamic

from support.kubectl import KUBECTLS, Kubectl, client_minor

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: ssa
  labels: {app: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
"""


@pytest.fixture(params=KUBECTLS, ids=lambda p: "kubectl-1.20" if "1.20" in p else "kubectl")
def kubectl(request, portal, tmp_path):
    return Kubectl(request.param, portal, tmp_path)


def server_apply(kubectl, text, *flags, check=True):
    path = kubectl.tmp / "ssa.yaml"
    path.write_text(text)
    return kubectl("apply", "--server-side", *flags, "-f", str(path), check=check)


def get_svc(kubectl, name):
    """The Service with its managedFields (kubectl 1.21+ hides them unless asked)."""
    show = [] if "1.20" in kubectl.binary else ["--show-managed-fields"]
    return kubectl.json("get", "svc", name, *show)


def managers(obj):
    return {(m["manager"], m["operation"]) for m in obj["metadata"].get("managedFields", [])}


def fields_of(obj, manager):
    return next(m["fieldsV1"] for m in obj["metadata"]["managedFields"] if m["manager"] == manager)


def test_apply_creates_updates_conflicts_and_forces(kubectl):
    out = server_apply(kubectl, SERVICE).stdout
    assert "service/ssa serverside-applied" in out
    svc = get_svc(kubectl, "ssa")
    assert managers(svc) == {("kubectl", "Apply")}
    assert fields_of(svc, "kubectl")["f:spec"]["f:ports"] == {
        'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:name": {}, "f:port": {}, "f:targetPort": {}}
    }
    assert svc["spec"]["clusterIP"], "allocated like any Service"

    # A change to the manifest is applied; a second port merges by key.
    changed = SERVICE.replace("targetPort: 8080}", "targetPort: 9090}\n  - {name: https, port: 443}")
    server_apply(kubectl, changed)
    ports = {p["port"]: p["targetPort"] for p in get_svc(kubectl, "ssa")["spec"]["ports"]}
    assert ports == {80: 9090, 443: 443}

    # Another writer changes a label the applier owns: applying the old
    # value is a conflict that names the field and its manager.
    kubectl("label", "svc", "ssa", "app=other", "--overwrite")
    result = server_apply(kubectl, changed, check=False)
    assert result.returncode != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl-label"' in result.stderr
    assert ".metadata.labels.app" in result.stderr
    assert get_svc(kubectl, "ssa")["metadata"]["labels"]["app"] == "other"

    # Forced: the applier's value, and the field is the applier's alone.
    server_apply(kubectl, changed, "--force-conflicts")
    svc = get_svc(kubectl, "ssa")
    assert svc["metadata"]["labels"]["app"] == "web"
    assert ("kubectl-label", "Update") not in managers(svc)

    # A field dropped from the manifest (and owned by nobody else) goes;
    # a label someone else added stays.
    kubectl("label", "svc", "ssa", "team=blue")
    smaller = changed.replace("  selector: {app: web}\n", "")
    server_apply(kubectl, smaller)
    svc = get_svc(kubectl, "ssa")
    assert "selector" not in svc["spec"]
    assert svc["metadata"]["labels"] == {"app": "web", "team": "blue"}


def test_reapplying_changes_nothing_and_conflicts_are_listed(kubectl):
    server_apply(kubectl, SERVICE)
    kubectl("label", "svc", "ssa", "other=1")
    before = get_svc(kubectl, "ssa")["metadata"]["resourceVersion"]
    server_apply(kubectl, SERVICE)
    assert get_svc(kubectl, "ssa")["metadata"]["resourceVersion"] == before, "a no-op apply writes nothing"
    # Two fields owned by another manager: both named, under their manager.
    kubectl("patch", "svc", "ssa", "-p", '{"metadata":{"labels":{"app":"x"}},"spec":{"selector":{"app":"x"}}}')
    result = server_apply(kubectl, SERVICE, check=False)
    assert "Apply failed with 2 conflicts: conflicts with \"kubectl-patch\" using v1:" in result.stderr, result.stderr
    assert "- .metadata.labels.app" in result.stderr and "- .spec.selector.app" in result.stderr
    # Into a namespace that does not exist: 404, nothing made.
    path = kubectl.tmp / "elsewhere.yaml"
    path.write_text(SERVICE.replace("name: ssa", "name: ssa\n  namespace: nowhere"))
    missing = kubectl("apply", "--server-side", "-f", str(path), check=False)
    assert missing.returncode != 0 and 'namespaces "nowhere" not found' in missing.stderr, missing.stderr


def test_every_writer_is_recorded(kubectl, tmp_path):
    kubectl("create", "service", "clusterip", "mf", "--tcp=80:8080")
    kubectl("label", "svc", "mf", "a=1")
    kubectl("annotate", "svc", "mf", "b=2")
    kubectl("patch", "svc", "mf", "-p", '{"spec":{"sessionAffinity":"ClientIP"}}')
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's/a: \"1\"/a: \"edited\"/' \"$1\"\n")
    editor.chmod(0o755)
    kubectl("edit", "svc", "mf", env={"KUBE_EDITOR": str(editor), "EDITOR": str(editor)})
    current = kubectl.out("get", "svc", "mf", "-o", "yaml")
    kubectl("replace", "-f", "-", input=current.replace('b: "2"', 'b: "3"'))
    svc = get_svc(kubectl, "mf")
    assert managers(svc) == {
        ("kubectl-create", "Update"),
        ("kubectl-annotate", "Update"),
        ("kubectl-patch", "Update"),
        ("kubectl-edit", "Update"),
        ("kubectl-replace", "Update"),
    }, managers(svc)
    # Each took what it changed: the label's only field went to the edit
    # (that entry is gone), the annotation to the replace; the annotate
    # still owns the annotations map it made.
    assert fields_of(svc, "kubectl-edit") == {"f:metadata": {"f:labels": {"f:a": {}}}}
    assert fields_of(svc, "kubectl-replace") == {"f:metadata": {"f:annotations": {"f:b": {}}}}
    assert fields_of(svc, "kubectl-annotate") == {"f:metadata": {"f:annotations": {}}}
    assert "f:sessionAffinity" in fields_of(svc, "kubectl-patch")["f:spec"]
    assert "f:ports" in fields_of(svc, "kubectl-create")["f:spec"]
    for entry in svc["metadata"]["managedFields"]:
        assert entry["apiVersion"] == "v1" and entry["fieldsType"] == "FieldsV1" and entry["time"]

    kubectl.apply(SERVICE.replace("name: ssa", "name: csa"))
    assert ("kubectl-client-side-apply", "Update") in managers(get_svc(kubectl, "csa"))


def test_diff_and_dry_run_change_nothing(kubectl):
    server_apply(kubectl, SERVICE)
    changed = SERVICE.replace("targetPort: 8080", "targetPort: 7070")
    path = kubectl.tmp / "changed.yaml"
    path.write_text(changed)
    diff = kubectl("diff", "--server-side", "-f", str(path), check=False)
    assert diff.returncode == 1, diff.stderr
    assert "-  - name: http" not in diff.stdout and "+    targetPort: 7070" in diff.stdout
    server_apply(kubectl, changed, "--dry-run=server")
    assert get_svc(kubectl, "ssa")["spec"]["ports"][0]["targetPort"] == 8080


def test_dry_run_server_for_every_verb(kubectl, tmp_path):
    """kubectl 1.20 allows `--dry-run=server` only for kinds whose patch
    operation in /openapi/v2 takes `dryRun`; the server then stores nothing."""
    dry = "--dry-run=server"
    out = kubectl.out("create", "service", "clusterip", "dry", "--tcp=80:8080", dry)
    assert "service/dry created (server dry run)" in out
    assert kubectl("get", "svc", "dry", check=False).returncode != 0, "nothing was created"
    kubectl("create", "service", "clusterip", "dry", "--tcp=80:8080")
    before = kubectl.json("get", "svc", "dry")
    current = kubectl.out("get", "svc", "dry", "-o", "yaml")
    assert "(server dry run)" in kubectl.out("replace", "-f", "-", dry, input=current.replace("port: 80", "port: 81"))
    # (patch, and label/annotate of kubectl 1.20, do not say "server dry
    # run"; the state below shows nothing changed.)
    kubectl("patch", "svc", "dry", "-p", '{"spec":{"sessionAffinity":"ClientIP"}}', dry)
    kubectl("label", "svc", "dry", "x=1", dry)
    kubectl("annotate", "svc", "dry", "y=2", dry)
    path = tmp_path / "dry.yaml"
    path.write_text(SERVICE.replace("name: ssa", "name: dry"))
    assert "(server dry run)" in kubectl.out("apply", "-f", str(path), dry)
    assert "(server dry run)" in kubectl.out("delete", "svc", "dry", dry)
    after = kubectl.json("get", "svc", "dry")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == before["spec"] and after["metadata"].get("labels") == before["metadata"].get("labels")


def test_python_client_server_side_apply(portal):
    services = dynamic.DynamicClient(portal.api_client()).resources.get(api_version="v1", kind="Service")
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "py", "namespace": "default"},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "py"}},
    }
    created = services.server_side_apply(body=body, name="py", namespace="default", field_manager="controller-a")
    assert created.spec.ports[0].port == 80
    body["spec"]["selector"] = {"app": "b"}
    with pytest.raises(Exception) as conflict:
        services.server_side_apply(body=body, name="py", namespace="default", field_manager="controller-b")
    assert conflict.value.status == 409
    status = json.loads(conflict.value.body)
    assert status["message"] == 'Apply failed with 1 conflict: conflict with "controller-a": .spec.selector.app'
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "controller-a"', "field": ".spec.selector.app"}
    ]
    forced = services.server_side_apply(
        body=body, name="py", namespace="default", field_manager="controller-b", force_conflicts=True
    )
    assert forced.spec.selector.app == "b"
    # No field manager: refused, as Kubernetes does.
    with pytest.raises(Exception) as missing:
        services.server_side_apply(body=body, name="py", namespace="default", field_manager=None)
    assert missing.value.status == 422 and "fieldManager: Required value" in missing.value.body


def test_moving_from_client_side_to_server_side_apply(kubectl):
    """A Service made with `kubectl apply` moves to `--server-side`: no
    conflicts on the values it already has, the server keeps the
    last-applied annotation current for the `kubectl` manager, and kubectl
    1.26+ hands the client-side manager's fields to `kubectl` (a JSON patch
    of managedFields), so a label dropped later really goes; with kubectl
    1.20 (no hand-over) the client-side manager still co-owns it."""
    kubectl.apply(SERVICE.replace("name: ssa", "name: moved"))
    manifest = SERVICE.replace("name: ssa", "name: moved").replace("targetPort: 8080", "targetPort: 9090")
    server_apply(kubectl, manifest)
    svc = get_svc(kubectl, "moved")
    remembered = json.loads(svc["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert remembered["spec"]["ports"][0]["targetPort"] == 9090, "the server rewrote it from the server-side apply"
    assert svc["spec"]["ports"][0]["targetPort"] == 9090
    server_apply(kubectl, manifest.replace("  labels: {app: web}\n", ""))
    svc = get_svc(kubectl, "moved")
    if client_minor(kubectl.binary) >= 26:
        assert ("kubectl-client-side-apply", "Update") not in managers(svc), managers(svc)
        assert "labels" not in svc["metadata"] or "app" not in svc["metadata"]["labels"]
    else:
        assert svc["metadata"]["labels"] == {"app": "web"}, "still co-owned by the client-side manager"
