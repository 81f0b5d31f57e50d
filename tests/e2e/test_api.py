"""The core API through the Python `kubernetes` client: CRUD, selectors,
watch ordering, optimistic concurrency and Status errors (SPEC A3-A6, A8, O3)."""

import json
import ssl
import threading
import urllib.error
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from support.api import portal_ca, service


def error_body(exc):
    return json.loads(exc.body)


def test_system_namespaces_exist(portal):
    names = {ns.metadata.name for ns in portal.core().list_namespace().items}
    assert {"default", "kube-system", "kube-public"} <= names


def test_create_get_list_delete(portal):
    core = portal.core()
    created = core.create_namespaced_service("default", service("web", {"app": "web"}))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert int(created.metadata.resource_version) > 0
    got = core.read_namespaced_service("web", "default")
    assert got.metadata.uid == created.metadata.uid
    assert got.metadata.resource_version == created.metadata.resource_version
    assert got.spec.ports[0].port == 80
    listed = core.list_namespaced_service("default")
    assert [s.metadata.name for s in listed.items] == ["kubernetes", "web"]
    assert int(listed.metadata.resource_version) >= int(created.metadata.resource_version)
    # Key order: default/kubernetes, default/web, kube-system/kube-dns.
    assert [s.metadata.name for s in core.list_service_for_all_namespaces().items] == ["kubernetes", "web", "kube-dns"]
    core.delete_namespaced_service("web", "default")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_service("web", "default")
    assert exc.value.status == 404


def test_label_selectors(portal):
    core = portal.core()
    core.create_namespaced_service("default", service("a", {"tier": "frontend", "stack": "prod"}))
    core.create_namespaced_service("default", service("b", {"tier": "backend", "stack": "prod"}))
    core.create_namespaced_service("default", service("c", {"tier": "frontend", "stack": "dev"}))

    def names(selector):
        return sorted(s.metadata.name for s in core.list_namespaced_service("default", label_selector=selector).items)

    assert names("tier=frontend") == ["a", "c"]
    assert names("tier!=frontend") == ["b", "kubernetes"], "!= matches objects without the label"
    assert names("tier in (frontend),stack=prod") == ["a"]
    assert names("stack notin (prod)") == ["c", "kubernetes"]
    assert names("stack") == ["a", "b", "c"]
    assert names("!stack") == ["kubernetes"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_service("default", label_selector="tier in (")
    assert exc.value.status == 400


def test_field_selectors(portal):
    core = portal.core()
    core.create_namespaced_service("default", service("one"))
    core.create_namespaced_service("default", service("two"))
    found = core.list_namespaced_service("default", field_selector="metadata.name=two").items
    assert [s.metadata.name for s in found] == ["two"]
    found = core.list_service_for_all_namespaces(field_selector="metadata.namespace=default,metadata.name!=two").items
    assert [s.metadata.name for s in found] == ["kubernetes", "one"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_service("default", field_selector="spec.nodeName=x")
    assert exc.value.status == 400


def test_paging(portal):
    core = portal.core()
    for i in range(7):
        core.create_namespaced_service("default", service(f"s{i}"))
    seen, token = [], None
    while True:
        page = core.list_namespaced_service("default", limit=3, _continue=token)
        assert len(page.items) <= 3
        seen += [s.metadata.name for s in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert seen == ["kubernetes"] + [f"s{i}" for i in range(7)]


def test_watch_sees_changes_in_order(portal):
    core = portal.core()
    start = core.list_namespaced_service("default").metadata.resource_version
    events = []
    done = threading.Event()

    def run():
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_service, "default", resource_version=start, timeout_seconds=20):
            events.append((event["type"], event["object"].metadata.name, event["object"].metadata.resource_version))
            if event["type"] == "DELETED":
                w.stop()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    created = core.create_namespaced_service("default", service("w"))
    created.metadata.labels = {"changed": "yes"}
    updated = core.replace_namespaced_service("w", "default", created)
    core.delete_namespaced_service("w", "default")
    assert done.wait(20), f"watch saw only {events}"
    assert [(t, n) for t, n, _ in events] == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]
    assert events[0][2] == created.metadata.resource_version
    assert events[1][2] == updated.metadata.resource_version
    assert int(events[2][2]) > int(updated.metadata.resource_version)


def test_watch_with_selector_reports_transitions(portal):
    """An object that stops matching is DELETED for a selective watcher."""
    core = portal.core()
    start = core.list_namespaced_service("default").metadata.resource_version
    events = []
    w = watch.Watch()
    core.create_namespaced_service("default", service("t", {"app": "on"}))
    current = core.read_namespaced_service("t", "default")
    current.metadata.labels = {"app": "off"}
    core.replace_namespaced_service("t", "default", current)
    for event in w.stream(core.list_namespaced_service, "default", resource_version=start, label_selector="app=on", timeout_seconds=10):
        events.append(event["type"])
        if len(events) == 2:
            w.stop()
    assert events == ["ADDED", "DELETED"]


def test_stale_update_conflicts(portal):
    core = portal.core()
    first = core.create_namespaced_service("default", service("c"))
    first.metadata.labels = {"v": "1"}
    core.replace_namespaced_service("c", "default", first)
    first.metadata.labels = {"v": "2"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_service("c", "default", first)
    assert exc.value.status == 409
    assert error_body(exc.value)["reason"] == "Conflict"


def test_create_twice_already_exists(portal):
    core = portal.core()
    core.create_namespaced_service("default", service("dup"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_service("default", service("dup"))
    assert exc.value.status == 409
    assert error_body(exc.value)["reason"] == "AlreadyExists"


def test_get_missing_not_found(portal):
    with pytest.raises(ApiException) as exc:
        portal.core().read_namespaced_service("nope", "default")
    assert exc.value.status == 404
    body = error_body(exc.value)
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'services "nope" not found'


def test_write_into_missing_namespace(portal):
    with pytest.raises(ApiException) as exc:
        portal.core().create_namespaced_service("ghost", service("x"))
    assert exc.value.status == 404
    assert error_body(exc.value)["message"] == 'namespaces "ghost" not found'


def test_invalid_name_is_422_with_causes(portal):
    with pytest.raises(ApiException) as exc:
        portal.core().create_namespaced_service("default", service("Bad_Name"))
    assert exc.value.status == 422
    body = error_body(exc.value)
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith('Service "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"')


def test_generate_name(portal):
    body = service("")
    body.metadata.name = None
    body.metadata.generate_name = "gen-"
    created = portal.core().create_namespaced_service("default", body)
    assert created.metadata.name.startswith("gen-") and len(created.metadata.name) == 9


def test_status_subresource_is_separate(portal):
    core = portal.core()
    # Bound already: the scheduler has nothing to write to it meanwhile.
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="none")], node_name="elsewhere"),
        status=client.V1PodStatus(phase="Running"),
    )
    created = core.create_namespaced_pod("default", pod)
    assert created.status.phase == "Pending", "status is the server's on create"
    created.status = client.V1PodStatus(phase="Running", pod_ip="10.244.0.5")
    updated = core.replace_namespaced_pod_status("p", "default", created)
    assert updated.status.pod_ip == "10.244.0.5"
    updated.spec.active_deadline_seconds = 30
    updated.status = client.V1PodStatus(phase="Failed")
    again = core.replace_namespaced_pod("p", "default", updated)
    assert again.status.phase == "Running", "a spec write keeps status"
    assert again.spec.active_deadline_seconds == 30
    assert again.metadata.generation == 2


def raw(portal, method, path, body=None, token=True, content_type="application/json"):
    """One HTTPS request with the cluster CA, bypassing client-side checks."""
    context = ssl.create_default_context(cafile=None)
    context.load_verify_locations(cadata=portal_ca(portal))
    request = urllib.request.Request(portal.server + path, data=body, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {portal.token}")
    if body is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_oversized_body_is_413(portal):
    big = json.dumps({"metadata": {"name": "big", "annotations": {"a": "x" * (3 * 1024 * 1024 + 10)}}}).encode()
    try:
        code, body = raw(portal, "POST", "/api/v1/namespaces/default/services", big)
    except (ConnectionError, urllib.error.URLError) as e:  # the server may close while we still send
        pytest.fail(f"expected a 413 Status, got {e!r}")
    assert code == 413
    assert body["reason"] == "RequestEntityTooLarge"


def test_strict_field_validation(portal):
    body = json.dumps({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"bogus": 1, "ports": [{"port": 80}]}}).encode()
    code, status = raw(portal, "POST", "/api/v1/namespaces/default/services?fieldValidation=Strict", body)
    assert code == 400
    assert 'unknown field "spec.bogus"' in status["message"]
    code, created = raw(portal, "POST", "/api/v1/namespaces/default/services", body)
    assert code == 201 and "bogus" not in created["spec"], "unknown fields are dropped otherwise"


def test_yaml_body(portal):
    body = b"apiVersion: v1\nkind: Service\nmetadata:\n  name: from-yaml\nspec:\n  ports:\n  - port: 8080\n"
    code, created = raw(portal, "POST", "/api/v1/namespaces/default/services", body, content_type="application/yaml")
    assert code == 201 and created["spec"]["ports"][0]["port"] == 8080


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'"str"', b'{"spec": {"ports": "nope"}}', b'{"kind": "Pod"}', b"\xff\xfe", b'{"metadata": {"name": 7}}'],
)
def test_malformed_bodies_are_400(portal, body):
    code, status = raw(portal, "POST", "/api/v1/namespaces/default/services", body)
    assert code == 400, status
    assert status["kind"] == "Status"


def test_requests_without_credentials_are_anonymous_and_wrong_ones_refused(portal):
    # No credential: system:anonymous, allowed only what RBAC grants it
    # (the bootstrap policy: /healthz, /version; not discovery, not objects).
    code, body = raw(portal, "GET", "/api/v1/namespaces/default/services", token=False)
    assert code == 403 and body["reason"] == "Forbidden", body
    assert body["message"] == (
        'services is forbidden: User "system:anonymous" cannot list resource "services" '
        'in API group "" in the namespace "default"'
    )
    code, version = raw(portal, "GET", "/version", token=False)
    assert code == 200 and version["major"] == "1"
    code, body = raw(portal, "GET", "/apis", token=False)
    assert code == 403 and 'cannot get path "/apis"' in body["message"]
    # A credential that is wrong is 401, never anonymous.
    configuration = client.Configuration()
    configuration.host = portal.server
    configuration.verify_ssl = False
    configuration.api_key = {"authorization": "Bearer not-a-token"}
    with pytest.raises(ApiException) as exc:
        client.CoreV1Api(client.ApiClient(configuration)).list_namespaced_service("default")
    assert exc.value.status == 401


def test_plain_http_is_refused(portal):
    plain = portal.server.replace("https://", "http://")
    with pytest.raises(Exception) as exc:
        urllib.request.urlopen(plain + "/api/v1/namespaces", timeout=10).read()
    assert not isinstance(exc.value, urllib.error.HTTPError) or exc.value.code >= 400


def test_health_and_metrics(portal):
    import urllib.request as r

    context = ssl.create_default_context()
    context.load_verify_locations(cadata=portal_ca(portal))
    for path in ["/healthz", "/livez", "/readyz"]:
        assert r.urlopen(portal.server + path, context=context, timeout=10).read() == b"ok"
    portal.core().list_namespaced_service("default")
    request = r.Request(portal.server + "/metrics", headers={"Authorization": f"Bearer {portal.token}"})
    text = r.urlopen(request, context=context, timeout=10).read().decode()
    assert 'apiserver_request_total{verb="LIST",resource="services",code="200"}' in text
    assert "portal_store_commit_duration_seconds_bucket" in text


def test_namespace_lifecycle(portal):
    core = portal.core()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    core.create_namespaced_service("team", service("inside"))
    core.delete_namespace("team")
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if "team" not in {n.metadata.name for n in core.list_namespace().items}:
            break
        time.sleep(0.05)
    else:
        pytest.fail("namespace was not removed")
    assert core.list_namespaced_service("team").items == []
    with pytest.raises(ApiException) as exc:
        core.delete_namespace("default")
    assert exc.value.status == 403


def test_put_racing_delete_never_answers_5xx(portal):
    """100 concurrent PUT/DELETE pairs on the same pods: each PUT either
    lands or finds the object gone (404) or changed (409), as Kubernetes
    answers; never a server error (issue 19)."""
    from concurrent.futures import ThreadPoolExecutor

    core = portal.core()
    names = [f"race-{i}" for i in range(100)]
    pod = lambda n: {"metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = {n: core.create_namespaced_pod("default", pod(n)) for n in names}

    def put(name):
        body = core.api_client.sanitize_for_serialization(created[name])
        body["metadata"]["labels"] = {"touched": "yes"}
        try:
            core.replace_namespaced_pod(name, "default", body)
            return 200
        except ApiException as e:
            return e.status

    def delete(name):
        try:
            core.delete_namespaced_pod(name, "default")
            return 200
        except ApiException as e:
            return e.status

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(f, n) for n in names for f in (put, delete)]
        statuses = [f.result() for f in futures]
    print("PUT/DELETE statuses:", {s: statuses.count(s) for s in set(statuses)})
    assert all(s in (200, 201, 404, 409) for s in statuses), sorted(set(statuses))
    assert not core.list_namespaced_pod("default").items, "every pod was deleted"


def test_replace_with_resource_version_zero_is_unconditional(portal):
    """`resourceVersion: "0"` (or none) in a PUT is an unconditional update,
    as Kubernetes treats it for every kind Portal serves."""
    core = portal.core()
    core.create_namespaced_endpoints("default", {"metadata": {"name": "rv0"}})
    for version in ("0", None):
        body = {"metadata": {"name": "rv0", "labels": {"version": str(version)}}}
        if version is not None:
            body["metadata"]["resourceVersion"] = version
        updated = core.replace_namespaced_endpoints("rv0", "default", body)
        assert updated.metadata.labels == {"version": str(version)}
        assert updated.metadata.resource_version not in ("", "0")
    # A stale non-zero version still conflicts.
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_endpoints("rv0", "default", {"metadata": {"name": "rv0", "resourceVersion": "1"}})
    assert stale.value.status == 409


POD_SPEC_RULES = [
    (
        {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}]},
        'spec.containers[0].resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1',
    ),
    (
        {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"gpu": "1"}}}]},
        'spec.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource type or fully qualified',
    ),
    (
        {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"example.com/gpu": "1"}}}]},
        "spec.containers[0].resources.limits[example.com/gpu]: Required value: Limit must be set for non overcommitable resources",
    ),
    ({"containers": []}, "spec.containers: Required value"),
    ({"containers": [{"name": "", "image": "x"}]}, "spec.containers[0].name: Required value"),
    ({"containers": [{"name": None, "image": "x"}]}, "spec.containers[0].name: Required value"),
    ({"containers": [{"name": "c"}]}, "spec.containers[0].image: Required value"),
    ({"containers": [{"name": "c", "image": "x"}, {"name": "c", "image": "y"}]}, 'spec.containers[1].name: Duplicate value: "c"'),
    ({"containers": [{"name": "Bad_Name", "image": "x"}]}, 'spec.containers[0].name: Invalid value: "Bad_Name": a lowercase RFC 1123 label'),
    ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 70000}]}]},
     "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"),
    ({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "name": "web"}, {"containerPort": 81, "name": "web"}]}]},
     'spec.containers[0].ports[1].name: Duplicate value: "web"'),
    ({"containers": [{"name": "c", "image": "x", "imagePullPolicy": "Sometimes"}]},
     'spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never"'),
    ({"containers": [{"name": "c", "image": "x", "livenessProbe": {"periodSeconds": 5}}]},
     "spec.containers[0].livenessProbe: Required value: must specify a handler type"),
    ({"containers": [{"name": "c", "image": "x", "livenessProbe": {"exec": {"command": ["true"]}, "successThreshold": 3}}]},
     "spec.containers[0].livenessProbe.successThreshold: Invalid value: 3: must be 1"),
    ({"containers": [{"name": "c", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]},
     'spec.containers[0].volumeMounts[0].name: Not found: "data"'),
    ({"containers": [{"name": "c", "image": "x"}], "restartPolicy": "Sometimes"},
     'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never", "OnFailure"'),
    ({"containers": [{"name": "c", "image": "x"}], "dnsPolicy": "None"},
     "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None"),
    ({"containers": [{"name": "c", "image": "x"}], "activeDeadlineSeconds": 0},
     "spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive"),
]


def test_pod_validation_says_what_kubernetes_says(portal):
    """Each rule answers 422 Invalid with Kubernetes' field path and words
    (issue 19); nothing is stored."""
    core = portal.core()
    for spec, message in POD_SPEC_RULES:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": spec}
        # Raw: the Python client would refuse some of these itself.
        code, status = raw(portal, "POST", "/api/v1/namespaces/default/pods", json.dumps(body).encode())
        assert code == 422, (spec, status)
        assert status["reason"] == "Invalid"
        shown = [f'{c["field"]}: {c["message"]}' for c in status["details"]["causes"]]
        assert any(s.startswith(message) for s in shown), (message, shown)
        assert status["message"].startswith('Pod "bad" is invalid: '), status["message"]
    assert not core.list_namespaced_pod("default").items


def test_a_pod_update_may_change_only_what_kubernetes_allows(portal):
    core = portal.core()
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}})
    # The image, the deadline, labels: fine.
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}, "spec": {"activeDeadlineSeconds": 30, "containers": [{"name": "c", "image": "x:2"}]}})
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "c", "command": ["sh"]}]}})
    assert refused.value.status == 422
    assert "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`" in refused.value.body
    assert core.read_namespaced_pod("p", "default").spec.containers[0].command is None


def get_as(portal, path, accept):
    context = ssl.create_default_context(cafile=None)
    context.load_verify_locations(cadata=portal_ca(portal))
    request = urllib.request.Request(portal.server + path, headers={"Authorization": f"Bearer {portal.token}", "Accept": accept})
    return urllib.request.urlopen(request, context=context, timeout=20)


def test_partial_object_metadata_for_get_list_and_watch(portal):
    """`as=PartialObjectMetadata(List)`: only metadata, as kube-rs'
    metadata_watcher and garbage collectors ask (issue 19)."""
    core = portal.core()
    core.create_namespaced_service("default", service("meta", labels={"a": "b"}))
    meta_list = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    with get_as(portal, "/api/v1/namespaces/default/services", meta_list) as response:
        listed = json.loads(response.read())
    assert (listed["kind"], listed["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    item = next(i for i in listed["items"] if i["metadata"]["name"] == "meta")
    assert set(item) == {"kind", "apiVersion", "metadata"} and item["kind"] == "PartialObjectMetadata"
    assert item["metadata"]["labels"] == {"a": "b"} and item["metadata"]["uid"]

    one_meta = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    with get_as(portal, "/api/v1/namespaces/default/services/meta", one_meta) as response:
        one = json.loads(response.read())
    assert one["kind"] == "PartialObjectMetadata" and "spec" not in one

    rv = listed["metadata"]["resourceVersion"]
    with get_as(portal, f"/api/v1/namespaces/default/services?watch=1&resourceVersion={rv}", one_meta) as stream:
        core.patch_namespaced_service("meta", "default", {"metadata": {"labels": {"a": "c"}}})
        event = json.loads(stream.readline())
    assert event["type"] == "MODIFIED"
    assert event["object"]["kind"] == "PartialObjectMetadata" and event["object"]["metadata"]["labels"] == {"a": "c"}
    assert "spec" not in event["object"]


def test_streaming_lists_send_the_state_then_a_bookmark(portal):
    """`sendInitialEvents=true` (client-go's WatchList, Helm 4): the current
    objects as ADDED, a BOOKMARK annotated `k8s.io/initial-events-end` at
    the state's revision, then changes; contradictory options are 422 in
    upstream's words."""
    core = portal.core()
    core.create_namespace({"metadata": {"name": "streamed"}})
    try:
        streaming_lists(portal, core)
    finally:
        core.delete_namespace("streamed")


def streaming_lists(portal, core):
    for name in ("s1", "s2"):
        core.create_namespaced_service("streamed", service(name))
    written = core.list_namespaced_service("streamed").metadata.resource_version
    path = ("/api/v1/namespaces/streamed/services?watch=1&sendInitialEvents=true"
            "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
    with get_as(portal, f"{path}&resourceVersion={written}", "application/json") as stream:
        events = [json.loads(stream.readline()) for _ in range(3)]
        core.create_namespaced_service("streamed", service("s3"))
        later = json.loads(stream.readline())
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events[:2]] == [("ADDED", "s1"), ("ADDED", "s2")]
    bookmark = events[2]
    assert bookmark["type"] == "BOOKMARK", bookmark
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(written)
    assert (later["type"], later["object"]["metadata"]["name"]) == ("ADDED", "s3")

    # A plain watch from no position is defaulted to the same: the state,
    # then (bookmarks allowed) the end bookmark, as upstream's.
    with get_as(portal, "/api/v1/namespaces/streamed/services?watch=1&allowWatchBookmarks=true", "application/json") as stream:
        plain = [json.loads(stream.readline()) for _ in range(4)]
    assert [e["type"] for e in plain] == ["ADDED", "ADDED", "ADDED", "BOOKMARK"], plain
    assert plain[3]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}

    # Without a position, `sendInitialEvents=false`: changes only.
    with get_as(portal, path.replace("sendInitialEvents=true", "sendInitialEvents=false"), "application/json") as stream:
        core.delete_namespaced_service("s1", "streamed")
        only = json.loads(stream.readline())
    assert (only["type"], only["object"]["metadata"]["name"]) == ("DELETED", "s1")

    code, status = raw(portal, "GET", "/api/v1/namespaces/streamed/services?watch=1&sendInitialEvents=true")
    assert code == 422 and status["message"] == ('ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                                 'sendInitialEvents requires setting resourceVersionMatch to NotOlderThan'), status
    code, status = raw(portal, "GET", "/api/v1/namespaces/streamed/services?sendInitialEvents=true")
    assert code == 422 and status["details"]["causes"][0]["field"] == "sendInitialEvents", status


def test_delete_collection_takes_its_options_from_the_body(portal):
    """client-go sends a collection delete's DeleteOptions as its body: a
    dry run there deletes nothing and answers what it would delete."""
    core = portal.core()
    for name in ("keep-1", "keep-2"):
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": {"set": "dry"}}})
    options = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}).encode()
    code, listed = raw(portal, "DELETE", "/api/v1/namespaces/default/configmaps?labelSelector=set%3Ddry", options)
    assert code == 200 and sorted(i["metadata"]["name"] for i in listed["items"]) == ["keep-1", "keep-2"], listed
    assert len(core.list_namespaced_config_map("default", label_selector="set=dry").items) == 2
    code, _ = raw(portal, "DELETE", "/api/v1/namespaces/default/configmaps?labelSelector=set%3Ddry", b"")
    assert code == 200 and not core.list_namespaced_config_map("default", label_selector="set=dry").items


def test_eviction_answers_like_kubernetes(portal):
    """pods/eviction: 201 and the pod deleted; a missing pod 404; a body
    that is not an Eviction, or names another pod, 400 (never a 500)."""
    core = portal.core()
    core.create_namespaced_pod("default", {"metadata": {"name": "evictee"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    path = "/api/v1/namespaces/default/pods/{}/eviction"
    eviction = lambda name: json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}}).encode()
    code, status = raw(portal, "POST", path.format("evictee"), b"{not json")
    assert code == 400 and status["reason"] == "BadRequest", status
    code, status = raw(portal, "POST", path.format("evictee"), eviction("other"))
    assert code == 400 and "does not match" in status["message"], status
    code, status = raw(portal, "POST", path.format("missing"), eviction("missing"))
    assert code == 404 and status["reason"] == "NotFound", status
    code, status = raw(portal, "POST", path.format("evictee"), eviction("evictee"))
    assert (code, status["status"]) == (201, "Success"), status
    assert not core.list_namespaced_pod("default").items


def test_status_bodies_are_byte_for_byte_kubernetes_shaped(portal):
    context = ssl.create_default_context(cafile=None)
    context.load_verify_locations(cadata=portal_ca(portal))
    request = urllib.request.Request(portal.server + "/api/v1/namespaces/default/pods/nope", headers={"Authorization": f"Bearer {portal.token}"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, context=context, timeout=20)
    body = missing.value.read().decode()
    assert body.startswith('{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"nope\\" not found","reason":"NotFound","details":'), body
    assert body.endswith(',"code":404}\n'), body


def test_a_replication_controller_template_is_validated_as_a_pod(portal):
    body = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "bad"}, "spec": {
        "replicas": 1, "selector": {"app": "bad"},
        "template": {"metadata": {"labels": {"app": "bad"}}, "spec": {"containers": [{"name": "c"}]}}}}
    code, status = raw(portal, "POST", "/api/v1/namespaces/default/replicationcontrollers", json.dumps(body).encode())
    assert code == 422, status
    assert status["details"]["causes"][0]["field"] == "spec.template.spec.containers[0].image", status


def test_protobuf_round_trip_through_the_server(portal):
    """A client that prefers protobuf gets one (`k8s\\0` + envelope); sent
    back as a protobuf PUT it is the same object (issue 19)."""
    core = portal.core()
    # (Labels given: an empty map has no protobuf form, as in Kubernetes,
    # where `labels: {}` is never stored either.)
    core.create_namespaced_service("default", service("pb", labels={"app": "pb"}))
    context = ssl.create_default_context()
    context.load_verify_locations(cadata=portal_ca(portal))
    path = "/api/v1/namespaces/default/services/pb"
    get = urllib.request.Request(portal.server + path, headers={
        "Authorization": f"Bearer {portal.token}",
        "Accept": "application/vnd.kubernetes.protobuf, application/json",
    })
    with urllib.request.urlopen(get, context=context, timeout=20) as response:
        assert response.headers["Content-Type"] == "application/vnd.kubernetes.protobuf"
        body = response.read()
    assert body.startswith(b"k8s\x00") and b"pb" in body
    before = core.read_namespaced_service("pb", "default")
    code, answer = raw(portal, "PUT", path, body, content_type="application/vnd.kubernetes.protobuf")
    assert code == 200, answer
    assert answer["metadata"]["uid"] == before.metadata.uid
    assert answer["spec"]["clusterIP"] == before.spec.cluster_ip
    assert answer["spec"]["ports"][0]["port"] == before.spec.ports[0].port
    # Nothing changed: the same resourceVersion (no write).
    assert answer["metadata"]["resourceVersion"] == before.metadata.resource_version
