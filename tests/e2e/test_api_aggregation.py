"""API aggregation (issue 30): an APIService hands the group version
`wardle.example.com/v1alpha1` to an extension API server running in a pod
(a Debian-based Python image serving HTTPS with a certificate of the
cluster CA). As metrics-server does, the server reads
`kube-system/extension-apiserver-authentication` with its ServiceAccount
and trusts only callers with a client certificate of the front-proxy CA
named there; it reports the user the `X-Remote-*` headers name. Portal
checks it (`Available`), lists its group in discovery (legacy and
aggregated), authorizes requests by RBAC before proxying them, and says
503 once the server is gone."""

import base64
import json
import subprocess
import textwrap

import pytest

# The extension server: discovery for its group version and a list of
# flunders whose one item says who asked.
EXTENSION = textwrap.dedent("""\
    import http.server, json, os, ssl, urllib.request

    SA = "/var/run/secrets/kubernetes.io/serviceaccount"
    api = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
    asked = urllib.request.Request(
        api + "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
        headers={"Authorization": "Bearer " + open(SA + "/token").read()})
    trust = json.load(urllib.request.urlopen(asked, context=ssl.create_default_context(cafile=SA + "/ca.crt")))["data"]
    open("/tmp/front-proxy-ca.crt", "w").write(trust["requestheader-client-ca-file"])
    allowed = json.loads(trust["requestheader-allowed-names"])
    user_header = json.loads(trust["requestheader-username-headers"])[0]
    group_header = json.loads(trust["requestheader-group-headers"])[0]
    GV = "wardle.example.com/v1alpha1"

    class Extension(http.server.BaseHTTPRequestHandler):
        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            certificate = self.connection.getpeercert() or {}
            names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
            if not any(name in allowed for name in names):
                return self.answer(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "message": "no front-proxy client certificate", "code": 401})
            path = self.path.split("?")[0]
            if path == "/apis/" + GV:
                return self.answer(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV,
                                         "resources": [{"name": "flunders", "singularName": "flunder",
                                                        "namespaced": True, "kind": "Flunder",
                                                        "verbs": ["get", "list"], "shortNames": ["fl"]}]})
            parts = path.strip("/").split("/")
            if parts[:3] == ["apis", "wardle.example.com", "v1alpha1"] and parts[3:4] == ["namespaces"] \\
                    and parts[5:6] == ["flunders"]:
                seen = {"apiVersion": GV, "kind": "Flunder",
                        "metadata": {"name": "seen", "namespace": parts[4]},
                        "spec": {"user": self.headers.get(user_header),
                                 "groups": self.headers.get_all(group_header) or [],
                                 "forged": self.headers.get("X-Remote-Extra-Forged")}}
                if len(parts) == 7:
                    return self.answer(200, seen)
                return self.answer(200, {"apiVersion": GV, "kind": "FlunderList", "metadata": {}, "items": [seen]})
            self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                              "reason": "NotFound", "message": "not found"})

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), Extension)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
    context.load_verify_locations("/tmp/front-proxy-ca.crt")
    context.verify_mode = ssl.CERT_OPTIONAL
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("serving", flush=True)
    server.serve_forever()
    """)

NAME = "v1alpha1.wardle.example.com"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@pytest.fixture(scope="module")
def python_layout():
    from support import debian_images
    # Built before the node namespace is entered (Debian's packages).
    return debian_images.python_layout()


@pytest.mark.root
@pytest.mark.netns
def test_an_extension_api_server_in_a_pod_serves_its_group(tmp_path_factory, python_layout):
    from support import debian_images
    from support.agent_bed import AgentNode, pod_manifest
    from support.tls import cluster_signed
    from support.waiting import wait_for

    tmp = tmp_path_factory.mktemp("aggregation")
    with AgentNode(tmp_path_factory.mktemp("aggregation-node")) as node:
        def kubectl(*args, check=True, stdin=None):
            result = subprocess.run(["kubectl", "--kubeconfig", node.portal.kubeconfig, *args], input=stdin,
                                    capture_output=True, text=True, timeout=120)
            assert not check or result.returncode == 0, result.stderr
            return result

        def curl(path, *headers):
            server = node.portal.config()["clusters"][0]["cluster"]["server"]
            args = ["curl", "-sf", "--cacert", str(pki / "ca.crt"), "-H", f"Authorization: Bearer {node.portal.token}"]
            for header in headers:
                args += ["-H", header]
            result = subprocess.run([*args, server + path], capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, (path, result.stderr)
            return result.stdout

        pki = node.portal.data_dir / "pki"
        image = debian_images.push(python_layout, node.registry.host, "python-kubernetes")
        certificate, key = cluster_signed(tmp, pki, "DNS:api.wardle.svc", "api.wardle.svc")
        kubectl("create", "namespace", "wardle")
        kubectl("-n", "wardle", "create", "secret", "tls", "api-tls",
                f"--cert={certificate}", f"--key={key}")
        # What metrics-server's manifest grants: reading the trust ConfigMap.
        kubectl("-n", "kube-system", "create", "rolebinding", "wardle-auth-reader",
                "--role=extension-apiserver-authentication-reader", "--serviceaccount=wardle:default")
        manifest = pod_manifest("api", image, ["python3", "-c", EXTENSION], labels={"app": "wardle"},
                                volumes=[{"name": "tls", "secret": {"secretName": "api-tls"}}])
        container = manifest["spec"]["containers"][0]
        container["volumeMounts"] = [{"name": "tls", "mountPath": "/tls"}]
        container["ports"] = [{"containerPort": 8443}]
        container["readinessProbe"] = {"tcpSocket": {"port": 8443}, "periodSeconds": 1}
        node.core.create_namespaced_pod("wardle", manifest)
        node.core.create_namespaced_service("wardle", {
            "metadata": {"name": "api"},
            "spec": {"selector": {"app": "wardle"}, "ports": [{"port": 443, "targetPort": 8443}]}})
        ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        api_service = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": NAME},
                       "spec": {"group": "wardle.example.com", "version": "v1alpha1", "caBundle": ca,
                                "groupPriorityMinimum": 1000, "versionPriority": 15,
                                "service": {"namespace": "wardle", "name": "api"}}}
        kubectl("apply", "-f", "-", stdin=json.dumps(api_service))
        waited = kubectl("wait", "--for=condition=Available", f"apiservice/{NAME}", "--timeout=240s", check=False)
        assert waited.returncode == 0, (waited.stderr, kubectl("get", "apiservice", NAME, "-o", "yaml").stdout,
                                        node.log("api"))
        table = kubectl("get", "apiservice", NAME).stdout
        assert "wardle/api" in table and "True" in table, table

        # Discovery: legacy, per group, and aggregated.
        resources = kubectl("api-resources", "--api-group=wardle.example.com").stdout
        assert "flunders" in resources and "Flunder" in resources and "fl" in resources, resources
        group = json.loads(kubectl("get", "--raw", "/apis/wardle.example.com").stdout)
        assert group["preferredVersion"]["groupVersion"] == "wardle.example.com/v1alpha1"
        wardle = next(g for g in json.loads(curl("/apis", f"Accept: {AGGREGATED}"))["items"]
                      if g["metadata"].get("name") == "wardle.example.com")
        assert wardle["versions"][0]["freshness"] == "Current"
        assert wardle["versions"][0]["resources"][0]["resource"] == "flunders"

        # The extension server sees who asked, never what the caller forged.
        seen = json.loads(kubectl("-n", "default", "get", "flunders", "-o", "json").stdout)["items"][0]["spec"]
        assert seen["user"] == "admin" and "system:masters" in seen["groups"], seen
        refused = kubectl("-n", "default", "get", "flunders", "--as=eve", check=False)
        assert ('flunders.wardle.example.com is forbidden: User "eve" cannot list resource "flunders" in API group '
                '"wardle.example.com" in the namespace "default"') in refused.stderr, refused.stderr
        kubectl("create", "clusterrole", "flunder-reader", "--verb=get,list", "--resource=flunders.wardle.example.com")
        kubectl("create", "clusterrolebinding", "eve-reads-flunders", "--clusterrole=flunder-reader", "--user=eve")
        seen = json.loads(kubectl("-n", "default", "get", "flunder", "seen", "-o", "json", "--as=eve",
                                  "--as-group=testers").stdout)["spec"]
        assert seen["user"] == "eve" and "testers" in seen["groups"], seen
        # Identity headers a caller sends itself stay behind.
        seen = json.loads(curl("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders/seen",
                               "Impersonate-User: eve", "X-Remote-User: mallory",
                               "X-Remote-Group: system:masters", "X-Remote-Extra-Forged: yes"))["spec"]
        assert seen == {"user": "eve", "groups": ["system:authenticated"], "forged": None}, seen

        # The server gone: not Available, 503, and discovery says Stale.
        node.core.delete_namespaced_pod("api", "wardle", grace_period_seconds=0)
        waited = kubectl("wait", "--for=condition=Available=false", f"apiservice/{NAME}", "--timeout=120s",
                         check=False)
        assert waited.returncode == 0, waited.stderr
        condition = next(c for c in json.loads(kubectl("get", "apiservice", NAME, "-o", "json").stdout)
                         ["status"]["conditions"] if c["type"] == "Available")
        assert condition["reason"] == "MissingEndpoints", condition
        gone = kubectl("-n", "default", "get", "flunders", check=False)
        assert gone.returncode != 0 and "ServiceUnavailable" in gone.stderr, gone.stderr
        wardle = next(g for g in json.loads(curl("/apis", f"Accept: {AGGREGATED}"))["items"]
                      if g["metadata"].get("name") == "wardle.example.com")
        assert wardle["versions"][0]["freshness"] == "Stale"

        # The APIService deleted: the group is no longer served.
        kubectl("delete", "apiservice", NAME)
        wait_for(lambda: "wardle.example.com" not in kubectl("api-versions").stdout,
                 "the group to leave discovery", timeout=30, interval=0.2)
        assert kubectl("-n", "default", "get", "flunders", check=False).returncode != 0
