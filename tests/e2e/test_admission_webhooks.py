"""Admission webhooks (issue 30): a validating webhook refuses objects it
dislikes with its message, a mutating one adds a label by JSON patch,
namespace selectors choose where they apply, warnings reach kubectl, and
with the webhook gone `failurePolicy: Ignore` lets writes through while
`Fail` refuses them. The webhooks are a real HTTPS server on loopback
with a serving certificate of the cluster CA, reached by URL."""

import base64
import http.server
import json
import subprocess
import textwrap

import kubernetes
import pytest

from conftest import Portal


class Hooks(http.server.BaseHTTPRequestHandler):
    """`/validate` refuses ConfigMaps with a `forbidden` key; `/mutate`
    labels every object `mutated=yes`; both record what they were asked."""

    asked = []

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        Hooks.asked.append((self.path.split("?")[0], request["operation"], request["name"]))
        response = {"uid": request["uid"], "allowed": True}
        if self.path.startswith("/validate"):
            if "forbidden" in (request["object"].get("data") or {}):
                response = {"uid": request["uid"], "allowed": False,
                            "status": {"code": 403, "reason": "Forbidden", "message": "no forbidden keys"}}
            elif "warn" in (request["object"].get("data") or {}):
                response["warnings"] = ["warn keys are deprecated"]
        else:
            labels = request["object"]["metadata"].get("labels")
            patch = ([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}] if labels else
                     [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}])
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("admission-webhooks")).start()
    yield portal
    portal.stop()


@pytest.fixture(scope="module")
def hooks(api, tmp_path_factory):
    """The webhook server, with a certificate of the cluster CA for
    127.0.0.1; stopped at the end (and by the test that needs it gone)."""
    from support.tls import cluster_signed, https_server
    certificate, key = cluster_signed(tmp_path_factory.mktemp("hooks"), api.data_dir / "pki", "IP:127.0.0.1")
    with https_server(Hooks, certificate, key) as server:
        yield server


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def configurations(api, port, failure_policy="Fail"):
    """Both configurations, as one List."""
    ca = base64.b64encode((api.data_dir / "pki" / "ca.crt").read_bytes()).decode()

    def webhook(name, path):
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": failure_policy, "timeoutSeconds": 5,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca},
                "namespaceSelector": {"matchLabels": {"hooks": "on"}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                           "resources": ["configmaps"]}]}
    items = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "deny"}, "webhooks": [webhook("deny.hooks.example.com", "/validate")]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "label"}, "webhooks": [webhook("label.hooks.example.com", "/mutate")]},
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def test_webhooks_refuse_and_mutate_where_selected(api, hooks):
    port = hooks.server_address[1]
    kubectl(api, "apply", "-f", "-", stdin=configurations(api, port))
    kubectl(api, "create", "namespace", "hooked")
    kubectl(api, "label", "namespace", "hooked", "hooks=on")
    kubectl(api, "create", "namespace", "plain")
    refused = kubectl(api, "-n", "hooked", "create", "configmap", "bad", "--from-literal=forbidden=1", check=False)
    assert refused.returncode != 0
    assert 'admission webhook "deny.hooks.example.com" denied the request: no forbidden keys' in refused.stderr
    kubectl(api, "-n", "hooked", "create", "configmap", "good", "--from-literal=fine=1")
    good = json.loads(kubectl(api, "-n", "hooked", "get", "configmap", "good", "-o", "json").stdout)
    assert good["metadata"]["labels"] == {"mutated": "yes"}, "the mutating webhook's patch"
    warned = kubectl(api, "-n", "hooked", "create", "configmap", "warned", "--from-literal=warn=1")
    assert "Warning: warn keys are deprecated" in warned.stderr
    # Updates are asked about too, with the old object.
    Hooks.asked.clear()
    kubectl(api, "-n", "hooked", "label", "configmap", "good", "team=a")
    assert ("/mutate", "UPDATE", "good") in Hooks.asked and ("/validate", "UPDATE", "good") in Hooks.asked
    labels = json.loads(kubectl(api, "-n", "hooked", "get", "configmap", "good", "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"mutated": "yes", "team": "a"}
    # Not selected: neither webhook is asked.
    Hooks.asked.clear()
    kubectl(api, "-n", "plain", "create", "configmap", "bad", "--from-literal=forbidden=1")
    plain = json.loads(kubectl(api, "-n", "plain", "get", "configmap", "bad", "-o", "json").stdout)
    assert "labels" not in plain["metadata"] and Hooks.asked == []


def test_failure_policies_when_the_webhook_is_gone(api, hooks):
    port = hooks.server_address[1]
    hooks.shutdown()
    hooks.server_close()
    kubectl(api, "apply", "-f", "-", stdin=configurations(api, port, "Ignore"))
    kubectl(api, "create", "namespace", "gone")
    kubectl(api, "label", "namespace", "gone", "hooks=on")
    kubectl(api, "-n", "gone", "create", "configmap", "through", "--from-literal=forbidden=1")
    kubectl(api, "apply", "-f", "-", stdin=configurations(api, port, "Fail"))
    refused = kubectl(api, "-n", "gone", "create", "configmap", "refused", check=False)
    assert refused.returncode != 0
    assert 'failed calling webhook "label.hooks.example.com": failed to call webhook' in refused.stderr, \
        refused.stderr


def test_configurations_are_checked(api):
    bad = textwrap.dedent("""\
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingWebhookConfiguration
        metadata: {name: bad}
        webhooks:
        - name: short
          admissionReviewVersions: [v1]
          sideEffects: Some
          clientConfig: {url: "http://127.0.0.1:1/"}
        """)
    refused = kubectl(api, "apply", "-f", "-", stdin=bad, check=False)
    assert "webhooks[0].name" in refused.stderr
    assert "'https' is the only allowed URL scheme" in refused.stderr
    assert 'webhooks[0].sideEffects: Unsupported value: "Some"' in refused.stderr


# The webhook a pod serves: the same rules as `Hooks`, standalone.
POD_HOOK = textwrap.dedent("""\
    import base64, http.server, json, ssl

    class Hooks(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = review["request"]
            response = {"uid": request["uid"], "allowed": True}
            if self.path.startswith("/validate"):
                if "forbidden" in (request["object"].get("data") or {}):
                    response = {"uid": request["uid"], "allowed": False,
                                "status": {"code": 403, "message": "no forbidden keys (from a pod)"}}
            else:
                labels = request["object"]["metadata"].get("labels")
                patch = ([{"op": "add", "path": "/metadata/labels/mutated", "value": "by-pod"}] if labels else
                         [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "by-pod"}}])
                response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), Hooks)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("serving", flush=True)
    server.serve_forever()
    """)


@pytest.fixture(scope="module")
def python_layout():
    from support import debian_images
    # Built before the node namespace is entered (Debian's packages).
    return debian_images.python_layout()


@pytest.mark.root
@pytest.mark.netns
def test_a_webhook_served_by_a_pod_behind_a_service(tmp_path_factory, python_layout):
    from support import debian_images
    from support.agent_bed import AgentNode, pod_manifest
    from support.waiting import wait_for

    tmp = tmp_path_factory.mktemp("pod-hook")
    with AgentNode(tmp_path_factory.mktemp("pod-hook-node")) as node:
        image = debian_images.push(python_layout, node.registry.host, "python-kubernetes")
        pki = node.portal.data_dir / "pki"
        from support.tls import cluster_signed
        certificate, key = cluster_signed(tmp, pki, "DNS:hook.hooks.svc", "hook.hooks.svc")
        node.kubectl("create", "namespace", "hooks")
        node.kubectl("-n", "hooks", "create", "secret", "tls", "hook-tls",
                     f"--cert={certificate}", f"--key={key}")
        manifest = pod_manifest("hook", image, ["python3", "-c", POD_HOOK], labels={"app": "hook"},
                                volumes=[{"name": "tls", "secret": {"secretName": "hook-tls"}}])
        container = manifest["spec"]["containers"][0]
        container["volumeMounts"] = [{"name": "tls", "mountPath": "/tls"}]
        container["ports"] = [{"containerPort": 8443}]
        container["readinessProbe"] = {"tcpSocket": {"port": 8443}, "periodSeconds": 1}
        node.core.create_namespaced_pod("hooks", manifest)
        node.core.create_namespaced_service("hooks", {
            "metadata": {"name": "hook"},
            "spec": {"selector": {"app": "hook"}, "ports": [{"port": 443, "targetPort": 8443}]}})

        def ready_endpoints():
            try:
                endpoints = node.core.read_namespaced_endpoints("hook", "hooks")
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return False  # not made by the controller yet
                raise
            return any(subset.addresses for subset in endpoints.subsets or [])
        wait_for(ready_endpoints, "the webhook pod to be ready behind its Service", timeout=240, interval=0.5)
        ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()

        def configuration(kind, name, path, failure_policy):
            return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                    "webhooks": [{"name": f"{name}.hooks.example.com", "admissionReviewVersions": ["v1"],
                                  "sideEffects": "None", "failurePolicy": failure_policy, "timeoutSeconds": 5,
                                  "clientConfig": {"service": {"name": "hook", "namespace": "hooks", "path": path},
                                                   "caBundle": ca},
                                  "namespaceSelector": {"matchLabels": {"hooks": "on"}},
                                  "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                             "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]}]}

        def apply(failure_policy):
            items = [configuration("ValidatingWebhookConfiguration", "deny", "/validate", failure_policy),
                     configuration("MutatingWebhookConfiguration", "label", "/mutate", failure_policy)]
            subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "apply", "-f", "-"],
                           input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
                           check=True, capture_output=True, text=True, timeout=60)
        apply("Fail")
        node.kubectl("create", "namespace", "shop")
        node.kubectl("label", "namespace", "shop", "hooks=on")
        result = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "-n", "shop", "create",
                                 "configmap", "bad", "--from-literal=forbidden=1"],
                                capture_output=True, text=True, timeout=60)
        assert ('admission webhook "deny.hooks.example.com" denied the request: no forbidden keys (from a pod)'
                in result.stderr), result.stderr
        node.kubectl("-n", "shop", "create", "configmap", "good", "--from-literal=fine=1")
        labels = node.core.read_namespaced_config_map("good", "shop").metadata.labels
        assert labels == {"mutated": "by-pod"}
        # The pod gone: Fail refuses, Ignore lets writes through.
        node.core.delete_namespaced_pod("hook", "hooks", grace_period_seconds=0)
        wait_for(lambda: not ready_endpoints(), "the Service to have no endpoints", timeout=60, interval=0.2)
        result = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, "-n", "shop", "create",
                                 "configmap", "refused"], capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and 'failed calling webhook "label.hooks.example.com"' in result.stderr, \
            result.stderr
        apply("Ignore")
        node.kubectl("-n", "shop", "create", "configmap", "through", "--from-literal=forbidden=1")
