"""CRD conversion webhooks (issue 30): a CustomResourceDefinition with two
versions whose schemas differ (`spec.color` in v1, `spec.colour` in v2)
and `conversion.strategy: Webhook`. Objects are stored at v1 and served at
either version through the webhook (a real HTTPS server on loopback with a
certificate of the cluster CA): gets, lists (one review for many
objects), watches and writes at v2; the webhook may change labels and
annotations but not the object's identity; a failing webhook fails
reads at the other version in upstream's words, while the stored version
still reads."""

import base64
import http.server
import json
import subprocess

import pytest

from conftest import Portal

GROUP = "convert.example.com"


class Converter(http.server.BaseHTTPRequestHandler):
    """Renames `color` ↔ `colour`, notes the version it converted to in
    an annotation, tries to rename the object (which must not stick), and
    records how many objects each review carried. `failing` answers every
    review with a failure."""

    reviews = []
    failing = False

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        Converter.reviews.append(len(request["objects"]))
        desired = request["desiredAPIVersion"]
        converted = []
        for obj in request["objects"]:
            obj = json.loads(json.dumps(obj))
            spec = obj.setdefault("spec", {})
            if desired.endswith("/v2") and "color" in spec:
                spec["colour"] = spec.pop("color")
            if desired.endswith("/v1") and "colour" in spec:
                spec["color"] = spec.pop("colour")
            obj["apiVersion"] = desired
            obj["metadata"].setdefault("annotations", {})["converted-to"] = desired
            obj["metadata"]["name"] = "renamed-" + obj["metadata"]["name"]
            converted.append(obj)
        result = {"status": "Success"}
        if Converter.failing:
            result = {"status": "Failure", "message": "cannot convert today"}
            converted = []
        body = json.dumps({"apiVersion": review["apiVersion"], "kind": "ConversionReview",
                           "response": {"uid": request["uid"], "result": result,
                                        "convertedObjects": converted}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("conversion-webhooks")).start()
    yield portal
    portal.stop()


@pytest.fixture(scope="module")
def converter(api, tmp_path_factory):
    from support.tls import cluster_signed, https_server
    certificate, key = cluster_signed(tmp_path_factory.mktemp("converter"), api.data_dir / "pki", "IP:127.0.0.1")
    with https_server(Converter, certificate, key) as server:
        yield server


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def definition(api, port):
    ca = base64.b64encode((api.data_dir / "pki" / "ca.crt").read_bytes()).decode()

    def version(name, field, storage):
        return {"name": name, "served": True, "storage": storage, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "properties": {field: {"type": "string"}}}}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"gizmos.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                     "versions": [version("v1", "color", True), version("v2", "colour", False)],
                     "conversion": {"strategy": "Webhook", "webhook": {
                         "conversionReviewVersions": ["v1"],
                         "clientConfig": {"url": f"https://127.0.0.1:{port}/convert", "caBundle": ca}}}}}


def gizmo(version, name, field, value):
    return json.dumps({"apiVersion": f"{GROUP}/{version}", "kind": "Gizmo",
                       "metadata": {"name": name, "namespace": "default"}, "spec": {field: value}})


@pytest.fixture(scope="module")
def gizmos(api, converter):
    kubectl(api, "apply", "-f", "-", stdin=json.dumps(definition(api, converter.server_address[1])))
    kubectl(api, "wait", "--for=condition=Established", f"crd/gizmos.{GROUP}", "--timeout=30s")
    return api


def read(api, version, name):
    return json.loads(kubectl(api, "get", f"gizmos.{version}.{GROUP}", name, "-o", "json").stdout)


def test_objects_are_stored_at_one_version_and_served_at_both(gizmos):
    api = gizmos
    kubectl(api, "apply", "-f", "-", stdin=gizmo("v2", "written-at-v2", "colour", "blue"))
    stored = read(api, "v1", "written-at-v2")
    assert stored["apiVersion"] == f"{GROUP}/v1" and stored["spec"] == {"color": "blue"}, stored
    served = read(api, "v2", "written-at-v2")
    assert served["apiVersion"] == f"{GROUP}/v2" and served["spec"] == {"colour": "blue"}, served
    # The webhook's annotation stays; its renaming does not.
    assert served["metadata"]["name"] == "written-at-v2"
    assert served["metadata"]["annotations"]["converted-to"] == f"{GROUP}/v2"
    assert served["metadata"]["uid"] == stored["metadata"]["uid"]
    # An update through v2 lands in the stored v1 object.
    kubectl(api, "patch", f"gizmos.v2.{GROUP}", "written-at-v2", "--type=merge", "-p", '{"spec":{"colour":"green"}}')
    assert read(api, "v1", "written-at-v2")["spec"] == {"color": "green"}


def test_a_list_converts_in_one_review_and_a_watch_converts_each_event(gizmos):
    api = gizmos
    for name in ("one", "two", "three"):
        kubectl(api, "apply", "-f", "-", stdin=gizmo("v1", name, "color", name))
    Converter.reviews.clear()
    listed = json.loads(kubectl(api, "get", f"gizmos.v2.{GROUP}", "-o", "json").stdout)
    colours = {item["metadata"]["name"]: item["spec"].get("colour") for item in listed["items"]}
    assert {"one": "one", "two": "two", "three": "three"}.items() <= colours.items(), colours
    assert max(Converter.reviews) >= 3, f"one review for the list: {Converter.reviews}"
    revision = json.loads(kubectl(api, "get", "--raw", f"/apis/{GROUP}/v2/namespaces/default/gizmos").stdout
                          )["metadata"]["resourceVersion"]
    kubectl(api, "patch", f"gizmos.v1.{GROUP}", "one", "--type=merge", "-p", '{"spec":{"color":"red"}}')
    events = kubectl(api, "get", "--raw", f"/apis/{GROUP}/v2/namespaces/default/gizmos"
                     f"?watch=1&resourceVersion={revision}&timeoutSeconds=2").stdout
    modified = [json.loads(line) for line in events.splitlines() if line.strip()]
    assert modified and modified[0]["type"] == "MODIFIED", events
    assert modified[0]["object"]["apiVersion"] == f"{GROUP}/v2"
    assert modified[0]["object"]["spec"] == {"colour": "red"}


def test_a_failing_webhook_fails_reads_at_the_other_version(gizmos):
    api = gizmos
    kubectl(api, "apply", "-f", "-", stdin=gizmo("v1", "fragile", "color", "grey"))
    Converter.failing = True
    try:
        refused = kubectl(api, "get", f"gizmos.v2.{GROUP}", "fragile", check=False)
        assert refused.returncode != 0
        assert (f"conversion webhook for {GROUP}/v1, Kind=Gizmo returned failure: cannot convert today"
                in refused.stderr), refused.stderr
        refused = kubectl(api, "apply", "-f", "-", stdin=gizmo("v2", "unwritten", "colour", "pink"), check=False)
        assert refused.returncode != 0 and "returned failure" in refused.stderr, refused.stderr
        # The stored version needs no conversion.
        assert read(api, "v1", "fragile")["spec"] == {"color": "grey"}
    finally:
        Converter.failing = False
    assert read(api, "v2", "fragile")["spec"] == {"colour": "grey"}


def test_conversion_settings_are_checked(gizmos):
    api = gizmos
    bad = definition(api, 1)
    bad["metadata"]["name"] = f"widgets.{GROUP}"
    bad["spec"]["names"] = {"plural": "widgets", "kind": "Widget"}
    bad["spec"]["conversion"] = {"strategy": "Webhook"}
    refused = kubectl(api, "apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert "spec.conversion.webhook: Required value: required when strategy is set to Webhook" in refused.stderr, \
        refused.stderr
    bad["spec"]["conversion"] = {"strategy": "None", "webhook": {"conversionReviewVersions": ["v1"]}}
    refused = kubectl(api, "apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert "spec.conversion.webhook: Forbidden: should not be set when strategy is not set to Webhook" in \
        refused.stderr, refused.stderr
    bad["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v2"], "clientConfig": {"url": "http://127.0.0.1:1/"}}}
    refused = kubectl(api, "apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert "'https' is the only allowed URL scheme" in refused.stderr, refused.stderr
    assert "must include at least one of v1, v1beta1" in refused.stderr, refused.stderr
