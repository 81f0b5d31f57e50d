"""The Gateway API through the built-in layer-7 proxy (issue 32), on
loopback: Portal installs the standard channel's definitions and the
`portal` GatewayClass; a Gateway's listeners on the proxy's two ports
(HTTP, and HTTPS with a certificate from a Secret) take HTTPRoutes that
match on path, headers, query and method, split traffic by weight, and
filter (redirects, header changes, rewrites, mirrors, timeouts); each
object's status conditions read as the Gateway API specification says,
cross-namespace references need a ReferenceGrant, and kubectl shows them
all. Backends are HTTP servers in this process behind selector-less
Services."""

import http.client
import json
import math
import re

import pytest

from support.waiting import wait_for
from test_ingress import Backend, apply, curl, kubectl, serve_backends, start_with_proxy

GROUP = "gateway.networking.k8s.io"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    backends = {"a": Backend("a"), "b": Backend("b")}
    portal = start_with_proxy(tmp_path_factory.mktemp("gateway"))
    try:
        kubectl(portal, "create", "namespace", "other")
        for namespace in ("default", "other"):
            serve_backends(portal, backends, namespace)
        # Portal's class is there and accepted once the definitions are served.
        wait_for(lambda: condition(portal, "gatewayclass", "portal", "Accepted", namespace=None) == "True",
                 "the portal GatewayClass to be accepted")
        apply(portal, gateway(portal))
        wait_for(lambda: condition(portal, "gateway", "web", "Programmed") == "True", "the Gateway to be programmed")
        portal.backends = backends
        yield portal
    finally:
        portal.stop()
        for backend in backends.values():
            backend.close()


def gateway(portal, name="web", listeners=None):
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": "default"},
            "spec": {"gatewayClassName": "portal", "listeners": listeners or [
                {"name": "http", "port": portal.http_port, "protocol": "HTTP"}]}}


def route(name, rules, hostnames=("a.example.test",), namespace="default", parents=None):
    return {"apiVersion": f"{GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": namespace},
            "spec": {"parentRefs": parents or [{"name": "web", "namespace": "default"}],
                     "hostnames": list(hostnames), "rules": rules}}


def backend_ref(name, weight=None, namespace=None):
    ref = {"name": name, "port": 80}
    if weight is not None:
        ref["weight"] = weight
    if namespace:
        ref["namespace"] = namespace
    return ref


def get(portal, kind, name, namespace="default"):
    args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
    return json.loads(kubectl(portal, *args).stdout)


def condition(portal, kind, name, wanted, namespace="default", of=None):
    """The status of one condition: the object's own, or (of=route parent
    index, or of=("listener", name)) of a parent or listener."""
    found = get(portal, kind, name, namespace).get("status") or {}
    if of is None:
        conditions = found.get("conditions", [])
    elif isinstance(of, tuple):
        conditions = next((l["conditions"] for l in found.get("listeners", []) if l["name"] == of[1]), [])
    else:
        parents = found.get("parents", [])
        conditions = parents[of]["conditions"] if len(parents) > of else []
    return next((c["status"] for c in conditions if c["type"] == wanted), None)


def reason(portal, kind, name, wanted, namespace="default", parent=0):
    found = get(portal, kind, name, namespace).get("status") or {}
    parents = found.get("parents", [])
    conditions = parents[parent]["conditions"] if kind == "httproute" and len(parents) > parent else found.get("conditions", [])
    return next((c["reason"] for c in conditions if c["type"] == wanted), None)


def accepted(portal, name, namespace="default"):
    """Waits until a route is accepted and its references resolve."""
    wait_for(lambda: condition(portal, "httproute", name, "Accepted", namespace, of=0) == "True"
             and condition(portal, "httproute", name, "ResolvedRefs", namespace, of=0) == "True",
             f"route {name} to be accepted")


def ask(portal, path, host="a.example.test", method="GET", headers=None, connection=None):
    """One plain HTTP request: (status, headers, decoded JSON body or text)."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", portal.http_port, timeout=10)
    try:
        connection.request(method, path, headers={"Host": host, **(headers or {})})
        response = connection.getresponse()
        body = response.read().decode()
        try:
            body = json.loads(body)
        except ValueError:
            pass
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        if own:
            connection.close()


def test_definitions_class_and_gateway_status(bed):
    crds = kubectl(bed, "get", "crd", "-o", "name").stdout
    for plural in ("gatewayclasses", "gateways", "httproutes", "referencegrants"):
        assert f"{plural}.{GROUP}" in crds
    table = kubectl(bed, "get", "gatewayclass").stdout
    assert re.search(r"portal\s+portal.dev/gateway-controller\s+True", table), table
    found = get(bed, "gateway", "web")
    assert found["status"]["addresses"] == [{"type": "IPAddress", "value": "127.0.0.1"}]
    listener = found["status"]["listeners"][0]
    assert listener["supportedKinds"] == [{"group": GROUP, "kind": "HTTPRoute"}]
    assert {c["type"]: c["status"] for c in listener["conditions"]} == {
        "Accepted": "True", "Programmed": "True", "ResolvedRefs": "True", "Conflicted": "False"}
    assert all(c["observedGeneration"] == found["metadata"]["generation"] for c in found["status"]["conditions"])
    table = kubectl(bed, "get", "gateway", "web").stdout
    assert re.search(r"web\s+portal\s+127\.0\.0\.1\s+True", table), table
    # The same objects at v1beta1, as the standard channel serves them.
    beta = json.loads(kubectl(bed, "get", f"gateways.v1beta1.{GROUP}", "web", "-o", "json").stdout)
    assert beta["apiVersion"] == f"{GROUP}/v1beta1" and beta["spec"]["gatewayClassName"] == "portal"
    # Listeners must differ in port, protocol or hostname.
    twice = gateway(bed, "twice", [{"name": "one", "port": bed.http_port, "protocol": "HTTP"},
                                   {"name": "two", "port": bed.http_port, "protocol": "HTTP"}])
    refused = kubectl(bed, "apply", "-f", "-", stdin=json.dumps(twice), check=False)
    assert "Combination of port, protocol and hostname must be unique for each listener" in refused.stderr, refused.stderr
    # Defaults from the definitions: allowedRoutes from the same namespace.
    assert found["spec"]["listeners"][0]["allowedRoutes"] == {"namespaces": {"from": "Same"}}


def test_weights_split_traffic_as_asked(bed):
    apply(bed, route("split", [{"backendRefs": [backend_ref("a", 90), backend_ref("b", 10)]}], hostnames=["split.example.test"]))
    accepted(bed, "split")
    wait_for(lambda: ask(bed, "/", host="split.example.test")[0] == 200, "the route to serve")
    connection = http.client.HTTPConnection("127.0.0.1", bed.http_port, timeout=10)
    counts = {"a": 0, "b": 0}
    n = 1000
    for _ in range(n):
        status, _, body = ask(bed, "/", host="split.example.test", connection=connection)
        assert status == 200
        counts[body["backend"]] += 1
    connection.close()
    # Within five standard deviations of the binomial mean (p = 0.9).
    sd = math.sqrt(n * 0.9 * 0.1)
    assert abs(counts["a"] - 900) < 5 * sd, counts
    # A weight of 0 takes nothing.
    apply(bed, route("split", [{"backendRefs": [backend_ref("a", 1), backend_ref("b", 0)]}], hostnames=["split.example.test"]))
    wait_for(lambda: all(ask(bed, "/", host="split.example.test")[2]["backend"] == "a" for _ in range(20)),
             "the zero weight to take effect")


def test_matches_by_header_query_method_and_path(bed):
    apply(bed, route("canary", [
        {"matches": [{"headers": [{"name": "X-Canary", "value": "true"}]}], "backendRefs": [backend_ref("b")]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [backend_ref("a")]},
        {"matches": [{"path": {"type": "Exact", "value": "/exact"}}, {"queryParams": [{"name": "v", "value": "2"}]}],
         "backendRefs": [backend_ref("b")]},
        {"matches": [{"method": "POST", "path": {"type": "PathPrefix", "value": "/form"}}], "backendRefs": [backend_ref("b")]},
        {"matches": [{"path": {"type": "RegularExpression", "value": "/items/[0-9]+"}}], "backendRefs": [backend_ref("b")]},
    ], hostnames=["canary.example.test"]))
    accepted(bed, "canary")
    host = "canary.example.test"
    wait_for(lambda: ask(bed, "/", host=host)[0] == 200, "the route to serve")
    assert ask(bed, "/x", host=host)[2]["backend"] == "a"
    assert ask(bed, "/x", host=host, headers={"X-Canary": "true"})[2]["backend"] == "b"
    assert ask(bed, "/x", host=host, headers={"X-Canary": "false"})[2]["backend"] == "a"
    # Exact beats the shorter prefix; a query match counts as a match.
    assert ask(bed, "/exact", host=host)[2]["backend"] == "b"
    assert ask(bed, "/exact/more", host=host)[2]["backend"] == "a"
    assert ask(bed, "/anything?v=2", host=host)[2]["backend"] == "b"
    assert ask(bed, "/anything?v=3", host=host)[2]["backend"] == "a"
    assert ask(bed, "/form", host=host, method="POST")[2]["backend"] == "b"
    assert ask(bed, "/form", host=host)[2]["backend"] == "a"
    assert ask(bed, "/items/42", host=host)[2]["backend"] == "b"
    assert ask(bed, "/items/x", host=host)[2]["backend"] == "a"
    # A host no route names is not found.
    assert ask(bed, "/", host="nobody.example.test")[0] == 404


def test_filters_redirect_rewrite_headers_mirror_timeout(bed):
    host = "filters.example.test"
    apply(bed, route("filters", [
        {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
         "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "statusCode": 301}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/moved"}}],
         "filters": [{"type": "RequestRedirect", "requestRedirect": {
             "hostname": "new.example.test", "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/now"}}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
         "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}},
                     {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                         "set": [{"name": "X-Set", "value": "set"}], "add": [{"name": "X-Added", "value": "added"}],
                         "remove": ["X-Gone"]}},
                     {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "X-Reply", "value": "yes"}]}}],
         "backendRefs": [backend_ref("a")]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/mirrored"}}],
         "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "b", "port": 80}}}],
         "backendRefs": [backend_ref("a")]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/slow"}}], "timeouts": {"request": "500ms"},
         "backendRefs": [backend_ref("a")]},
    ], hostnames=[host]))
    accepted(bed, "filters")
    wait_for(lambda: ask(bed, "/v1/x", host=host)[0] == 200, "the route to serve")
    status, headers, _ = ask(bed, "/old/page?q=1", host=host)
    assert status == 301 and headers["location"] == f"https://{host}/old/page?q=1", (status, headers)
    status, headers, _ = ask(bed, "/moved/page", host=f"{host}:{bed.http_port}")
    assert status == 302 and headers["location"] == f"http://new.example.test:{bed.http_port}/now/page", (status, headers)
    status, headers, body = ask(bed, "/v1/items?x=1", host=host, headers={"X-Gone": "1", "X-Set": "old"})
    assert status == 200 and body["path"] == "/v2/items?x=1", body
    assert body["headers"]["x-set"] == "set" and body["headers"]["x-added"] == "added" and "x-gone" not in body["headers"]
    assert headers["x-reply"] == "yes"
    before = list(bed.backends["b"].seen)
    assert ask(bed, "/mirrored/1", host=host)[2]["backend"] == "a"
    wait_for(lambda: "/mirrored/1" in bed.backends["b"].seen[len(before):], "the mirror to receive a copy")
    assert ask(bed, "/slow", host=host)[0] == 504


def test_references_across_namespaces_need_a_grant(bed):
    host = "grant.example.test"
    apply(bed, route("across", [{"backendRefs": [backend_ref("b", namespace="other")]}], hostnames=[host]))
    wait_for(lambda: reason(bed, "httproute", "across", "ResolvedRefs") == "RefNotPermitted", "RefNotPermitted")
    assert condition(bed, "httproute", "across", "Accepted", of=0) == "True"
    wait_for(lambda: ask(bed, "/", host=host)[0] == 500, "the unresolved backend to answer 500")
    apply(bed, {"apiVersion": f"{GROUP}/v1beta1", "kind": "ReferenceGrant", "metadata": {"name": "from-default", "namespace": "other"},
                "spec": {"from": [{"group": GROUP, "kind": "HTTPRoute", "namespace": "default"}],
                         "to": [{"group": "", "kind": "Service"}]}})
    accepted(bed, "across")
    wait_for(lambda: ask(bed, "/", host=host)[0] == 200, "the granted backend to serve")
    # A missing Service.
    apply(bed, route("missing", [{"backendRefs": [backend_ref("nowhere")]}], hostnames=["missing.example.test"]))
    wait_for(lambda: reason(bed, "httproute", "missing", "ResolvedRefs") == "BackendNotFound", "BackendNotFound")


def test_attachment_is_checked(bed):
    # A route from another namespace: the listener allows its own only.
    apply(bed, route("foreign", [{"backendRefs": [backend_ref("a")]}], namespace="other", hostnames=["foreign.example.test"]))
    wait_for(lambda: reason(bed, "httproute", "foreign", "Accepted", namespace="other") == "NotAllowedByListeners",
             "NotAllowedByListeners")
    assert ask(bed, "/", host="foreign.example.test")[0] == 404
    # A listener name that does not exist.
    apply(bed, route("nameless", [{"backendRefs": [backend_ref("a")]}], hostnames=["nameless.example.test"],
                     parents=[{"name": "web", "sectionName": "nope"}]))
    wait_for(lambda: reason(bed, "httproute", "nameless", "Accepted") == "NoMatchingParent", "NoMatchingParent")
    # A listener on a port the proxy does not serve, and one that selects
    # namespaces by label; the other namespace joins by its label.
    listeners = [{"name": "http", "port": bed.http_port, "protocol": "HTTP", "hostname": "*.wild.test",
                  "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"gateway": "yes"}}}}},
                 {"name": "elsewhere", "port": 1, "protocol": "HTTP"}]
    apply(bed, gateway(bed, "second", listeners))
    wait_for(lambda: condition(bed, "gateway", "second", "Accepted", of=("listener", "elsewhere")) == "False",
             "the unserved port to be refused")
    found = get(bed, "gateway", "second")
    elsewhere = next(l for l in found["status"]["listeners"] if l["name"] == "elsewhere")
    assert next(c["reason"] for c in elsewhere["conditions"] if c["type"] == "Accepted") == "PortUnavailable"
    assert next(c["reason"] for c in found["status"]["conditions"] if c["type"] == "Accepted") == "ListenersNotValid"
    apply(bed, route("wild", [{"backendRefs": [backend_ref("b")]}], namespace="other", hostnames=[],
                     parents=[{"name": "second", "namespace": "default", "sectionName": "http"}]))
    wait_for(lambda: reason(bed, "httproute", "wild", "Accepted", namespace="other") == "NotAllowedByListeners",
             "the unlabelled namespace to be refused")
    kubectl(bed, "label", "namespace", "other", "gateway=yes")
    accepted(bed, "wild", namespace="other")
    wait_for(lambda: ask(bed, "/", host="deep.sub.wild.test")[0] == 200, "the wildcard listener to serve")
    assert ask(bed, "/", host="deep.sub.wild.test")[2]["backend"] == "b"
    wait_for(lambda: get(bed, "gateway", "second")["status"]["listeners"][0]["attachedRoutes"] == 1, "attachedRoutes")
    # Hostnames that do not meet the listener's.
    apply(bed, route("unmet", [{"backendRefs": [backend_ref("a")]}], namespace="other", hostnames=["a.elsewhere.test"],
                     parents=[{"name": "second", "namespace": "default"}]))
    wait_for(lambda: reason(bed, "httproute", "unmet", "Accepted", namespace="other") == "NoMatchingListenerHostname",
             "NoMatchingListenerHostname")


def test_https_listener_serves_its_certificate(bed, tmp_path):
    import subprocess
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tls.gw.test",
                    "-addext", "subjectAltName=DNS:tls.gw.test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    kubectl(bed, "create", "secret", "tls", "gw-tls", f"--cert={cert}", f"--key={key}")
    apply(bed, gateway(bed, "secure", [{"name": "https", "port": bed.https_port, "protocol": "HTTPS", "hostname": "tls.gw.test",
                                        "tls": {"certificateRefs": [{"name": "gw-tls"}]}}]))
    wait_for(lambda: condition(bed, "gateway", "secure", "Programmed") == "True", "the HTTPS Gateway to be programmed")
    apply(bed, route("secure", [{"backendRefs": [backend_ref("a")]}], hostnames=["tls.gw.test"],
                     parents=[{"name": "secure"}]))
    accepted(bed, "secure")
    code, version, body, err = wait_for(
        lambda: (lambda r: r if r[0] == 200 else None)(curl(bed, "/", "--cacert", str(cert), host="tls.gw.test", tls=True)),
        "the listener's certificate to be served")
    assert json.loads(body)["proto"] == "https"
    # A listener naming a Secret that is not there is not programmed.
    apply(bed, gateway(bed, "broken", [{"name": "https", "port": bed.https_port, "protocol": "HTTPS",
                                        "tls": {"certificateRefs": [{"name": "absent"}]}}]))
    wait_for(lambda: condition(bed, "gateway", "broken", "ResolvedRefs", of=("listener", "https")) == "False",
             "the missing Secret to be reported")
    assert condition(bed, "gateway", "broken", "Programmed") == "False"


def test_validation_from_the_definitions(bed):
    bad = route("bad", [{"matches": [{"path": {"type": "Exact", "value": "relative"}}],
                         "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}],
                         "backendRefs": [{"name": "a"}]}])
    result = kubectl(bed, "apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert result.returncode != 0
    assert "RequestRedirect filter must not be used together with backendRefs" in result.stderr
    assert "Must have port for Service reference" in result.stderr
    assert "value must be an absolute path" in result.stderr
    result = kubectl(bed, "patch", "gatewayclass", "portal", "--type=merge", "-p",
                     '{"spec":{"controllerName":"example.com/other"}}', check=False)
    assert "Value is immutable" in result.stderr
