"""Kinds users define (issue 30): a CustomResourceDefinition with two
versions, a structural schema with defaults, an enum, bounds and a CEL
rule, printer columns, the status and scale subresources, selectable
fields and a map list; its objects through real kubectl and the Python
client — columns, 422s in upstream's words, pruning, `kubectl explain`,
`kubectl scale`, watches, conversion between versions, server-side apply,
garbage collection — and the definition's deletion taking its objects
with it. Aggregated discovery lists a new group at once."""

import json
import ssl
import subprocess
import textwrap
import urllib.request

import kubernetes
import pytest
from kubernetes import watch

from conftest import Portal
from support.waiting import wait_for

CRD = textwrap.dedent("""\
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: widgets.example.com
    spec:
      group: example.com
      scope: Namespaced
      names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd], categories: [all]}
      versions:
      - name: v1beta1
        served: true
        storage: false
        schema:
          openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
      - name: v1
        served: true
        storage: true
        subresources:
          status: {}
          scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
        additionalPrinterColumns:
        - {name: Size, type: integer, jsonPath: .spec.size}
        - {name: Color, type: string, jsonPath: .spec.color}
        - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
        selectableFields:
        - {jsonPath: .spec.color}
        schema:
          openAPIV3Schema:
            type: object
            description: A widget of the test shop.
            properties:
              spec:
                type: object
                description: What the widget should be.
                required: [size]
                x-kubernetes-validations:
                - {rule: "self.size != 4", message: "four is unlucky"}
                - {rule: "self.color == oldSelf.color", message: "color is immutable"}
                properties:
                  size: {type: integer, minimum: 1, maximum: 10, description: How big it is.}
                  color: {type: string, enum: [red, green], default: red}
                  replicas: {type: integer, default: 1}
                  ports:
                    type: array
                    x-kubernetes-list-type: map
                    x-kubernetes-list-map-keys: [name]
                    items:
                      type: object
                      required: [name]
                      properties:
                        name: {type: string}
                        port: {type: integer}
              status:
                type: object
                properties:
                  replicas: {type: integer}
                  selector: {type: string}
    """)


def widget(name, **spec):
    return json.dumps({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": name}, "spec": spec})


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("custom-resources")).start()
    yield portal
    portal.stop()


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def aggregated_groups(portal):
    context = ssl.create_default_context(cafile=str(portal.data_dir / "pki" / "ca.crt"))
    context.check_hostname = False
    request = urllib.request.Request(portal.server + "/apis", headers={
        "Authorization": f"Bearer {portal.token}",
        "Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/json;g=apidiscovery.k8s.io;v=v2")
        return {group["metadata"]["name"]: group for group in json.loads(response.read())["items"]}


@pytest.fixture(scope="module")
def widgets(api):
    """The Widget CRD, established."""
    assert "example.com" not in aggregated_groups(api)
    kubectl(api, "apply", "-f", "-", stdin=CRD)
    # Served at once: aggregated discovery lists the group (no sleep).
    group = wait_for(lambda: aggregated_groups(api).get("example.com"), "the group in aggregated discovery",
                     timeout=1)
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    resource = group["versions"][0]["resources"][0]
    assert resource["resource"] == "widgets" and resource["shortNames"] == ["wd"]
    assert {s["subresource"] for s in resource["subresources"]} == {"status", "scale"}
    kubectl(api, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")
    return api


def test_the_definition_reports_its_names_and_versions(widgets):
    crd = json.loads(kubectl(widgets, "get", "crd", "widgets.example.com", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert crd["status"]["acceptedNames"]["kind"] == "Widget"
    assert crd["status"]["storedVersions"] == ["v1"]
    assert crd["spec"]["names"]["listKind"] == "WidgetList", "defaulted"
    assert "customresourcecleanup.apiextensions.k8s.io" in crd["metadata"]["finalizers"]
    out = kubectl(widgets, "api-resources", "--api-group=example.com").stdout
    assert "widgets" in out and "wd" in out and "example.com/v1" in out


def test_objects_show_their_columns_and_defaults(widgets):
    kubectl(widgets, "apply", "-f", "-", stdin=widget("small", size=2))
    lines = kubectl(widgets, "get", "widgets").stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "COLOR", "AGE"]
    assert lines[1].split()[:3] == ["small", "2", "red"]
    stored = json.loads(kubectl(widgets, "get", "wd", "small", "-o", "json").stdout)
    assert stored["spec"]["color"] == "red" and stored["spec"]["replicas"] == 1
    assert "small" in kubectl(widgets, "get", "all").stdout, "the all category"


def test_invalid_objects_get_the_schemas_and_the_rules_messages(widgets):
    bad = kubectl(widgets, "apply", "-f", "-", stdin=widget("bad", size=40, color="blue"), check=False)
    assert bad.returncode != 0
    assert 'spec.color: Unsupported value: "blue": supported values: "red", "green"' in bad.stderr
    assert "spec.size: Invalid value: 40: spec.size in body should be less than or equal to 10" in bad.stderr
    unlucky = kubectl(widgets, "apply", "-f", "-", stdin=widget("bad", size=4), check=False)
    assert 'The Widget "bad" is invalid: spec: Invalid value: "object": four is unlucky' in unlucky.stderr
    missing = kubectl(widgets, "apply", "-f", "-", stdin=widget("bad"), check=False)
    assert "spec.size: Required value" in missing.stderr
    wrong_type = kubectl(widgets, "apply", "-f", "-", stdin=widget("bad", size="big"), check=False)
    assert 'spec.size in body must be of type integer: "string"' in wrong_type.stderr
    # A transition rule holds on updates.
    kubectl(widgets, "apply", "-f", "-", stdin=widget("fixed", size=1, color="green"))
    changed = kubectl(widgets, "patch", "widget", "fixed", "--type=merge", "-p", '{"spec":{"color":"red"}}',
                      check=False)
    assert "color is immutable" in changed.stderr
    # Kinds users define take no strategic merge patches (as upstream).
    strategic = kubectl(widgets, "patch", "widget", "fixed", "-p", '{"spec":{"size":2}}', check=False)
    assert "application/merge-patch+json" in strategic.stderr


def test_unknown_fields_are_pruned_or_refused(widgets):
    strict = kubectl(widgets, "apply", "-f", "-", stdin=widget("extra", size=1, junk=True), check=False)
    assert 'strict decoding error: unknown field "spec.junk"' in strict.stderr
    warned = kubectl(widgets, "apply", "--validate=warn", "-f", "-", stdin=widget("extra", size=1, junk=True))
    assert 'unknown field "spec.junk"' in warned.stderr
    stored = json.loads(kubectl(widgets, "get", "widget", "extra", "-o", "json").stdout)
    assert "junk" not in stored["spec"]


def test_explain_shows_the_schema(widgets):
    out = kubectl(widgets, "explain", "widgets.spec").stdout
    assert "What the widget should be." in out
    assert "size\t<integer> -required-" in out or "size\t<integer>" in out
    assert "How big it is." in out


def test_status_and_scale_subresources(widgets):
    kubectl(widgets, "apply", "-f", "-", stdin=widget("scaled", size=3))
    kubectl(widgets, "patch", "widget", "scaled", "--subresource=status", "--type=merge",
            "-p", '{"status":{"replicas":2,"selector":"app=w"},"spec":{"size":9}}')
    stored = json.loads(kubectl(widgets, "get", "widget", "scaled", "-o", "json").stdout)
    assert stored["status"] == {"replicas": 2, "selector": "app=w"}
    assert stored["spec"]["size"] == 3, "the status subresource writes status only"
    assert stored["metadata"]["generation"] == 1
    # A main write keeps the status; a spec change counts a generation.
    kubectl(widgets, "patch", "widget", "scaled", "--type=merge", "-p", '{"spec":{"size":5},"status":{"replicas":7}}')
    stored = json.loads(kubectl(widgets, "get", "widget", "scaled", "-o", "json").stdout)
    assert stored["status"]["replicas"] == 2 and stored["metadata"]["generation"] == 2
    kubectl(widgets, "scale", "widget", "scaled", "--replicas=4")
    scale = json.loads(kubectl(widgets, "get", "--raw",
                               "/apis/example.com/v1/namespaces/default/widgets/scaled/scale").stdout)
    assert scale["spec"]["replicas"] == 4
    assert scale["status"] == {"replicas": 2, "selector": "app=w"}


def test_versions_convert_and_selectable_fields(widgets):
    kubectl(widgets, "apply", "-f", "-", stdin=widget("green-one", size=2, color="green"))
    beta = json.loads(kubectl(widgets, "get", "widgets.v1beta1.example.com", "green-one", "-o", "json").stdout)
    assert beta["apiVersion"] == "example.com/v1beta1"
    kubectl(widgets, "patch", "widgets.v1beta1.example.com", "green-one", "--type=merge", "-p",
            '{"metadata":{"labels":{"via":"beta"}}}')
    stable = json.loads(kubectl(widgets, "get", "widgets.v1.example.com", "green-one", "-o", "json").stdout)
    assert stable["apiVersion"] == "example.com/v1" and stable["metadata"]["labels"] == {"via": "beta"}
    listed = json.loads(kubectl(widgets, "get", "--raw", "/apis/example.com/v1beta1/namespaces/default/widgets").stdout)
    assert {item["apiVersion"] for item in listed["items"]} == {"example.com/v1beta1"}
    names = kubectl(widgets, "get", "widgets", "--field-selector", "spec.color=green", "-o", "name").stdout.split()
    assert "widget.example.com/green-one" in names and "widget.example.com/small" not in names


def test_python_client_watches_and_applies_server_side(widgets):
    client = kubernetes.config.new_client_from_config(config_file=widgets.kubeconfig)
    custom = kubernetes.client.CustomObjectsApi(client)
    listed = custom.list_namespaced_custom_object("example.com", "v1", "default", "widgets")
    stream = watch.Watch().stream(custom.list_namespaced_custom_object, "example.com", "v1", "default", "widgets",
                                  resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=20)
    custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets",
                                           json.loads(widget("watched", size=1)))
    custom.patch_namespaced_custom_object("example.com", "v1", "default", "widgets", "watched",
                                          {"spec": {"size": 6}})
    seen = []
    for event in stream:
        if event["object"]["metadata"]["name"] == "watched":
            seen.append((event["type"], event["object"]["spec"]["size"]))
        if len(seen) == 2:
            break
    assert seen == [("ADDED", 1), ("MODIFIED", 6)]
    # Server-side apply merges a map list by its keys, one manager per item.
    apply = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "ports"},
             "spec": {"size": 1, "ports": [{"name": "http", "port": 80}]}}
    kubectl(widgets, "apply", "--server-side", "--field-manager=a", "-f", "-", stdin=json.dumps(apply))
    apply["spec"]["ports"] = [{"name": "dns", "port": 53}]
    kubectl(widgets, "apply", "--server-side", "--field-manager=b", "-f", "-", stdin=json.dumps(apply))
    stored = custom.get_namespaced_custom_object("example.com", "v1", "default", "widgets", "ports")
    assert sorted(p["name"] for p in stored["spec"]["ports"]) == ["dns", "http"]


def test_owned_objects_are_collected_with_their_owner(widgets):
    kubectl(widgets, "create", "configmap", "owner")
    owner = json.loads(kubectl(widgets, "get", "configmap", "owner", "-o", "json").stdout)
    owned = json.loads(widget("owned", size=1))
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                             "uid": owner["metadata"]["uid"]}]
    kubectl(widgets, "apply", "-f", "-", stdin=json.dumps(owned))
    kubectl(widgets, "delete", "configmap", "owner")
    wait_for(lambda: kubectl(widgets, "get", "widget", "owned", check=False).returncode != 0,
             "the garbage collector to delete the owned widget")


def test_deleting_the_definition_deletes_its_objects(tmp_path):
    portal = Portal(tmp_path).start()
    try:
        kubectl(portal, "apply", "-f", "-", stdin=CRD)
        kubectl(portal, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")
        kubectl(portal, "create", "namespace", "shop")
        for name in ("a", "b"):
            kubectl(portal, "-n", "shop", "apply", "-f", "-", stdin=widget(name, size=1))
        # One held by a finalizer: the definition waits for it.
        held = json.loads(widget("held", size=1))
        held["metadata"]["finalizers"] = ["example.com/hold"]
        kubectl(portal, "apply", "-f", "-", stdin=json.dumps(held))
        kubectl(portal, "delete", "crd", "widgets.example.com", "--wait=false")

        def terminating():
            crd = json.loads(kubectl(portal, "get", "crd", "widgets.example.com", "-o", "json").stdout)
            return {c["type"]: c["status"] for c in crd["status"]["conditions"]}.get("Terminating") == "True"
        wait_for(terminating, "the Terminating condition")
        late = kubectl(portal, "apply", "-f", "-", stdin=widget("late", size=1), check=False)
        assert "create not allowed while custom resource definition is terminating" in late.stderr, late.stderr
        wait_for(lambda: kubectl(portal, "-n", "shop", "get", "widgets", "-o", "name").stdout == "",
                 "the objects to be deleted")
        assert kubectl(portal, "get", "crd", "widgets.example.com", check=False).returncode == 0, \
            "held by the object with a finalizer"
        kubectl(portal, "patch", "widget", "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
        wait_for(lambda: kubectl(portal, "get", "crd", "widgets.example.com", check=False).returncode != 0,
                 "the definition to go")
        assert "example.com" not in aggregated_groups(portal)
        # Defined again, it starts empty.
        kubectl(portal, "apply", "-f", "-", stdin=CRD)
        kubectl(portal, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")
        assert kubectl(portal, "get", "widgets", "-A", "-o", "name").stdout == ""
    finally:
        portal.stop()


def test_invalid_and_clashing_definitions(widgets):
    not_structural = CRD.replace("size: {type: integer, minimum: 1", "size: {minimum: 1")
    assert not_structural != CRD
    refused = kubectl(widgets, "apply", "-f", "-", stdin=not_structural, check=False)
    assert "must not be empty for specified object fields" in refused.stderr
    wrong_name = CRD.replace("name: widgets.example.com", "name: widgets.example.org")
    refused = kubectl(widgets, "apply", "-f", "-", stdin=wrong_name, check=False)
    assert 'must be spec.names.plural+"."+spec.group' in refused.stderr
    # Kubernetes' own groups need an approval (and so never reach its kinds).
    protected = CRD.replace("widgets.example.com", "rolebindings.rbac.authorization.k8s.io") \
        .replace("group: example.com", "group: rbac.authorization.k8s.io").replace("widgets", "rolebindings")
    refused = kubectl(widgets, "apply", "-f", "-", stdin=protected, check=False)
    assert "protected groups must have approval annotation" in refused.stderr, refused.stderr
    # A second definition of the same kind is kept but not served.
    clash = CRD.replace("widgets", "gizmos").replace("widget,", "gizmo,").replace("shortNames: [wd], ", "")
    kubectl(widgets, "apply", "-f", "-", stdin=clash)

    def refused_names():
        crd = json.loads(kubectl(widgets, "get", "crd", "gizmos.example.com", "-o", "json").stdout)
        conditions = {c["type"]: c for c in crd["status"].get("conditions", [])}
        return conditions.get("NamesAccepted", {}).get("reason") == "NameConflict" and conditions
    conditions = wait_for(refused_names, "NamesAccepted=False")
    assert conditions["NamesAccepted"]["status"] == "False"
    assert conditions.get("Established", {}).get("status") != "True"
    assert kubectl(widgets, "get", "gizmos", check=False).returncode != 0
    kubectl(widgets, "delete", "crd", "gizmos.example.com")
