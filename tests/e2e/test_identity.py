"""Who may do what (issue 29): every namespace's `default` ServiceAccount
and root CA; a pod's token volume, with which the Python client's
`load_incluster_config()` (a real Debian image) lists pods once a
RoleBinding lets it and is refused in Kubernetes' words before; tokens from
`kubectl create token` that verify against the published JWKS and die with
the pod they are bound to; RBAC seen through `kubectl auth can-i` and
`--as`; no escalation through roles; static tokens and `whoami`."""

import base64
import json
import ssl
import subprocess
import textwrap
import urllib.error
import urllib.request
import uuid

import jwt
import pytest

from conftest import Portal
from support import debian_images
from support.agent_bed import AgentNode, pod_manifest
from support.waiting import wait_for

MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def https(portal, path, token=None, body=None, method="GET"):
    """One request with the cluster CA; (status, parsed body)."""
    context = ssl.create_default_context(cafile=str(portal.data_dir / "pki" / "ca.crt"))
    context.check_hostname = False
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(portal.server + path, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """A server without nodes, with a static token file (alice, in `dev`)."""
    data_dir = tmp_path_factory.mktemp("identity-api")
    tokens = data_dir / "tokens.csv"
    tokens.write_text('alice-token,alice,u-alice,"dev,qa"\n')
    portal = Portal(data_dir, ["--token-auth-file", str(tokens)]).start()
    yield portal
    portal.stop()


def test_every_namespace_gets_a_default_account_and_the_root_ca(api):
    ns = f"team-{uuid.uuid4().hex[:6]}"
    kubectl(api, "create", "namespace", ns)
    ca = (api.data_dir / "pki" / "ca.crt").read_text()

    def published():
        accounts = kubectl(api, "-n", ns, "get", "serviceaccount", "default", "-o", "name", check=False)
        root = kubectl(api, "-n", ns, "get", "configmap", "kube-root-ca.crt", "-o", "json", check=False)
        return root.returncode == 0 and accounts.returncode == 0 and json.loads(root.stdout)["data"]["ca.crt"]
    assert wait_for(published, "the default account and the root CA") == ca
    # Deleted, they come back; changed, the CA is put back.
    kubectl(api, "-n", ns, "delete", "serviceaccount", "default")
    kubectl(api, "-n", ns, "patch", "configmap", "kube-root-ca.crt", "-p", '{"data": {"ca.crt": "nope"}}')
    assert wait_for(published, "the default account and the root CA again") == ca


def test_create_token_verifies_against_the_published_keys(api):
    token = kubectl(api, "create", "token", "default", "--audience", "x", "--duration", "15m").stdout.strip()
    code, discovery = https(api, "/.well-known/openid-configuration", api.token)
    assert code == 200 and discovery["issuer"] == "https://kubernetes.default.svc.cluster.local"
    code, keys = https(api, "/openid/v1/jwks", api.token)
    assert code == 200 and keys["keys"][0]["alg"] == "ES256"
    key = jwt.PyJWK(keys["keys"][0])
    claims = jwt.decode(token, key.key, algorithms=["ES256"], audience="x", issuer=discovery["issuer"])
    assert claims["sub"] == "system:serviceaccount:default:default"
    assert claims["exp"] - claims["iat"] == 900
    with pytest.raises(jwt.InvalidAudienceError):
        jwt.decode(token, key.key, algorithms=["ES256"], audience="y")
    # Not for this server's audience: refused here.
    code, _ = https(api, "/api/v1/namespaces/default/pods", token)
    assert code == 401
    # Service accounts may read the issuer's documents (and nothing else).
    own = kubectl(api, "create", "token", "default").stdout.strip()
    assert https(api, "/openid/v1/jwks", own)[0] == 200
    code, body = https(api, "/api/v1/namespaces/default/pods", own)
    assert code == 403 and body["message"] == (
        'pods is forbidden: User "system:serviceaccount:default:default" cannot list resource "pods" '
        'in API group "" in the namespace "default"')
    # A TokenReview says whose it is.
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, "audiences": ["x"]}}
    code, answer = https(api, "/apis/authentication.k8s.io/v1/tokenreviews", api.token, review, "POST")
    assert code == 201 and answer["status"]["authenticated"] is True, answer
    assert answer["status"]["user"]["username"] == "system:serviceaccount:default:default"
    assert "system:serviceaccounts:default" in answer["status"]["user"]["groups"]
    review["spec"]["audiences"] = ["other"]
    assert https(api, "/apis/authentication.k8s.io/v1/tokenreviews", api.token, review, "POST")[1]["status"]["authenticated"] is False
    # Too short a life is refused as Kubernetes refuses it.
    result = kubectl(api, "create", "token", "default", "--duration", "1m", check=False)
    assert result.returncode != 0 and "may not specify a duration less than 10 minutes" in result.stderr


def test_tokens_bound_to_a_secret_die_with_it(api):
    kubectl(api, "create", "secret", "generic", "binder", "--from-literal", "k=v")
    token = kubectl(api, "create", "token", "default", "--bound-object-kind", "Secret",
                    "--bound-object-name", "binder").stdout.strip()
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    path = "/apis/authentication.k8s.io/v1/tokenreviews"
    answer = https(api, path, api.token, review, "POST")[1]
    assert answer["status"]["authenticated"] is True, answer
    assert https(api, "/version", token)[0] == 200
    kubectl(api, "delete", "secret", "binder")
    assert wait_for(lambda: https(api, "/version", token)[0] == 401, "the bound token refused")
    assert https(api, path, api.token, review, "POST")[1]["status"]["authenticated"] is False


def test_can_i_as_a_service_account_matches_its_role(api):
    ns = f"team-{uuid.uuid4().hex[:6]}"
    kubectl(api, "create", "namespace", ns)
    kubectl(api, "-n", ns, "create", "serviceaccount", "app")
    kubectl(api, "-n", ns, "create", "role", "reader", "--verb=get,list,watch", "--resource=pods,configmaps")
    kubectl(api, "-n", ns, "create", "rolebinding", "app-reads", "--role=reader", f"--serviceaccount={ns}:app")
    user = f"system:serviceaccount:{ns}:app"

    def listed():
        out = kubectl(api, "auth", "can-i", "--list", "--as", user, "-n", ns).stdout
        return out if "pods " in out else None
    out = wait_for(listed, "the binding to take effect")
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert "[get list watch]" in rows["pods"] and "[get list watch]" in rows["configmaps"], out
    assert "secrets" not in rows
    assert kubectl(api, "auth", "can-i", "list", "pods", "--as", user, "-n", ns).stdout.strip() == "yes"
    result = kubectl(api, "auth", "can-i", "delete", "pods", "--as", user, "-n", ns, check=False)
    assert result.stdout.strip() == "no"
    result = kubectl(api, "auth", "can-i", "list", "pods", "--as", user, "-n", "default", check=False)
    assert result.stdout.strip() == "no"


def test_users_get_only_what_is_bound_and_cannot_escalate(api):
    ns = f"team-{uuid.uuid4().hex[:6]}"
    kubectl(api, "create", "namespace", ns)
    refused = kubectl(api, "--as", "alice", "-n", ns, "get", "secrets", check=False)
    assert refused.returncode != 0
    assert f'secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "{ns}"' in refused.stderr
    # alice may manage roles and bindings here, and read pods; no more.
    kubectl(api, "-n", ns, "create", "role", "role-admin", "--verb=get,list,create,update,patch,delete",
            "--resource=roles,rolebindings")  # not "*", which includes escalate and bind
    kubectl(api, "-n", ns, "create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    kubectl(api, "-n", ns, "create", "rolebinding", "alice-roles", "--role=role-admin", "--user=alice")
    kubectl(api, "-n", ns, "create", "rolebinding", "alice-pods", "--role=pod-reader", "--user=alice")
    wait_for(lambda: kubectl(api, "--as", "alice", "-n", ns, "get", "pods", check=False).returncode == 0,
             "alice's bindings to take effect")
    # What she holds she may grant.
    kubectl(api, "--as", "alice", "-n", ns, "create", "role", "small", "--verb=get", "--resource=pods")
    # More than she holds she may not.
    big = kubectl(api, "--as", "alice", "-n", ns, "create", "role", "big", "--verb=get,delete", "--resource=secrets",
                  check=False)
    assert big.returncode != 0
    assert "is attempting to grant RBAC permissions not currently held" in big.stderr, big.stderr
    assert 'Resources:["secrets"]' in big.stderr and 'Verbs:["delete"]' in big.stderr, big.stderr
    # Nor bind a role that grants more (unless she may `bind` it).
    kubectl(api, "-n", ns, "create", "role", "secret-reader", "--verb=get", "--resource=secrets")
    bind = kubectl(api, "--as", "alice", "-n", ns, "create", "rolebinding", "sneaky", "--role=secret-reader",
                   "--user=alice", check=False)
    assert bind.returncode != 0 and "not currently held" in bind.stderr, bind.stderr
    kubectl(api, "-n", ns, "create", "role", "binder", "--verb=bind", "--resource=roles", "--resource-name=secret-reader")
    kubectl(api, "-n", ns, "create", "rolebinding", "alice-binds", "--role=binder", "--user=alice")
    wait_for(lambda: kubectl(api, "--as", "alice", "-n", ns, "create", "rolebinding", "allowed", "--role=secret-reader",
                             "--user=bob", check=False).returncode == 0, "bind permission to take effect")
    # Her own static token gets the same.
    assert https(api, f"/api/v1/namespaces/{ns}/pods", "alice-token")[0] == 200
    assert https(api, f"/api/v1/namespaces/{ns}/secrets", "alice-token")[0] == 403


def test_static_tokens_and_whoami(api):
    config = api.data_dir / "alice.kubeconfig"
    config.write_text(pathlib_kubeconfig(api, "alice-token"))
    result = subprocess.run(["kubectl", "--kubeconfig", str(config), "auth", "whoami", "-o", "json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)["status"]["userInfo"]
    assert info["username"] == "alice" and info["uid"] == "u-alice"
    assert info["groups"] == ["dev", "qa", "system:authenticated"]
    admin = json.loads(kubectl(api, "auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]
    assert "system:masters" in admin["groups"]
    # Impersonation needs the `impersonate` verb.
    result = subprocess.run(["kubectl", "--kubeconfig", str(config), "--as", "bob", "get", "pods"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert 'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group ""' in result.stderr


def pathlib_kubeconfig(portal, token):
    ca = base64.b64encode((portal.data_dir / "pki" / "ca.crt").read_bytes()).decode()
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: c, cluster: {{server: "{portal.server}", certificate-authority-data: {ca}}}}}]
        users: [{{name: u, user: {{token: {token}}}}}]
        contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
        current-context: x
        """)


# Pods: in a node namespace of the test's own.
IN_CLUSTER = textwrap.dedent("""\
    import sys, time
    from kubernetes import client, config
    config.load_incluster_config()
    namespace = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    for attempt in range(600):
        try:
            pods = client.CoreV1Api().list_namespaced_pod(namespace)
            print("listed", sorted(p.metadata.name for p in pods.items), flush=True)
            time.sleep(3600)
        except client.ApiException as error:
            print("refused", error.status, __import__("json").loads(error.body)["message"], flush=True)
        time.sleep(0.5)
    """)


@pytest.fixture(scope="module")
def python_layout():
    # Built before the node namespace is entered (Debian's packages).
    return debian_images.python_layout()


@pytest.mark.root
@pytest.mark.netns
def test_an_in_cluster_client_lists_pods_once_bound(tmp_path_factory, python_layout):
    with AgentNode(tmp_path_factory.mktemp("identity-node")) as node:
        image = debian_images.push(python_layout, node.registry.host, "python-kubernetes")
        ns = "team-a"
        node.kubectl("create", "namespace", ns)
        manifest = pod_manifest("lister", image, ["python3", "-c", IN_CLUSTER], restartPolicy="Never")
        node.core.create_namespaced_pod(ns, manifest)
        pod = node.core.read_namespaced_pod("lister", ns)
        assert pod.spec.service_account_name == "default"
        volume = next(v for v in pod.spec.volumes if v.name.startswith("kube-api-access-"))
        assert [s.service_account_token.path for s in volume.projected.sources if s.service_account_token] == ["token"]

        def log():
            return node.kubectl("-n", ns, "logs", "lister", check=False)
        refused = wait_for(lambda: "refused 403" in log() and log(), "the client to be refused", timeout=240,
                           interval=0.5)
        assert ('pods is forbidden: User "system:serviceaccount:team-a:default" cannot list resource "pods" '
                'in API group "" in the namespace "team-a"') in refused, refused
        files = node.kubectl("-n", ns, "exec", "lister", "--", "ls", MOUNT)
        assert files.split() == ["ca.crt", "namespace", "token"]
        node.kubectl("-n", ns, "create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
        node.kubectl("-n", ns, "create", "rolebinding", "default-reads", "--role=pod-reader",
                     f"--serviceaccount={ns}:default")
        listed = wait_for(lambda: "listed" in log() and log(), "the client to list pods", timeout=60, interval=0.5)
        assert "listed ['lister']" in listed, listed
        # Its token is bound to the pod: gone with it.
        token = node.kubectl("-n", ns, "exec", "lister", "--", "cat", f"{MOUNT}/token")
        assert https(node.portal, "/version", token)[0] == 200
        node.core.delete_namespaced_pod("lister", ns, grace_period_seconds=0)
        wait_for(lambda: https(node.portal, "/version", token)[0] == 401, "the pod's token refused")


def test_an_approved_request_gives_a_certificate_kubectl_signs_in_with(api, tmp_path):
    key, request = tmp_path / "bob.key", tmp_path / "bob.csr"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(request), "-subj", "/CN=bob/O=devs/O=ops"],
                   check=True, capture_output=True, timeout=60)
    csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
           "metadata": {"name": "bob"},
           "spec": {"request": base64.b64encode(request.read_bytes()).decode(), "usages": ["client auth"],
                    "signerName": "kubernetes.io/kube-apiserver-client", "expirationSeconds": 86400,
                    "username": "someone-else"}}
    kubectl(api, "apply", "-f", "-", stdin=json.dumps(csr))
    stored = json.loads(kubectl(api, "get", "csr", "bob", "-o", "json").stdout)
    assert stored["spec"]["username"] == "admin", "the requester is recorded, not what the body says"
    assert "Pending" in kubectl(api, "get", "csr", "bob").stdout
    # Approving needs `approve` on the signer: alice has none.
    refused = kubectl(api, "--as", "alice", "certificate", "approve", "bob", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
    kubectl(api, "certificate", "approve", "bob")

    def issued():
        out = json.loads(kubectl(api, "get", "csr", "bob", "-o", "json").stdout)
        return out["status"].get("certificate")
    certificate = base64.b64decode(wait_for(issued, "the certificate to be issued")).decode()
    assert "Approved,Issued" in kubectl(api, "get", "csr", "bob").stdout
    ca = base64.b64encode((api.data_dir / "pki" / "ca.crt").read_bytes()).decode()
    config = tmp_path / "bob.kubeconfig"
    config.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: c, cluster: {{server: "{api.server}", certificate-authority-data: {ca}}}}}]
        users: [{{name: bob, user: {{client-certificate-data: {base64.b64encode(certificate.encode()).decode()},
                                     client-key-data: {base64.b64encode(key.read_bytes()).decode()}}}}}]
        contexts: [{{name: x, context: {{cluster: c, user: bob}}}}]
        current-context: x
        """))
    result = subprocess.run(["kubectl", "--kubeconfig", str(config), "auth", "whoami", "-o", "json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)["status"]["userInfo"]
    assert info["username"] == "bob" and info["groups"] == ["devs", "ops", "system:authenticated"]
    # Rights granted to a group reach its members by their certificates.
    as_bob = ["kubectl", "--kubeconfig", str(config), "get", "pods", "-A"]
    refused = subprocess.run(as_bob, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and 'User "bob" cannot list resource "pods"' in refused.stderr, refused.stderr
    kubectl(api, "create", "clusterrolebinding", "ops-view", "--clusterrole=view", "--group=ops")
    wait_for(lambda: subprocess.run(as_bob, capture_output=True, timeout=60).returncode == 0,
             "the group's binding to apply to bob")
    # A request for a server certificate from this signer fails, as upstream.
    csr["metadata"]["name"] = "bob-server"
    csr["spec"]["usages"] = ["server auth"]
    kubectl(api, "apply", "-f", "-", stdin=json.dumps(csr))
    kubectl(api, "certificate", "approve", "bob-server")
    wait_for(lambda: "Failed" in kubectl(api, "get", "csr", "bob-server").stdout, "the request to fail")


def test_the_audit_log_records_each_stage_at_the_policys_level(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(textwrap.dedent("""\
        apiVersion: audit.k8s.io/v1
        kind: Policy
        rules:
        - level: Metadata
          resources: [{group: "", resources: [secrets]}]
        - level: RequestResponse
          resources: [{group: "", resources: [configmaps]}]
        - level: None
        """))
    log = tmp_path / "audit" / "audit.log"
    (tmp_path / "data").mkdir()
    portal = Portal(tmp_path / "data", ["--audit-policy-file", str(policy), "--audit-log-path", str(log)]).start()
    try:
        kubectl(portal, "create", "secret", "generic", "db", "--from-literal", "password=hunter2")
        kubectl(portal, "create", "configmap", "settings", "--from-literal", "mode=fast")
        kubectl(portal, "get", "configmap", "settings", "-o", "name")

        def events():
            lines = log.read_text().splitlines() if log.exists() else []
            return [json.loads(line) for line in lines]
        wait_for(lambda: sum(e["stage"] == "ResponseComplete" for e in events()) >= 3, "the audit events")
        text = log.read_text()
        assert "hunter2" not in text and base64.b64encode(b"hunter2").decode() not in text
        secrets = [e for e in events() if e.get("objectRef", {}).get("resource") == "secrets"]
        assert all(e["level"] == "Metadata" and "requestObject" not in e and "responseObject" not in e
                   for e in secrets)
        secret = [e for e in secrets if e["verb"] == "create"]
        assert [e["stage"] for e in secret] == ["RequestReceived", "ResponseComplete"], secret
        done = secret[1]
        assert done["verb"] == "create" and done["objectRef"]["namespace"] == "default"
        assert done["user"]["username"] == "admin" and done["responseStatus"]["code"] == 201
        assert done["auditID"] == secret[0]["auditID"] and done["sourceIPs"] == ["127.0.0.1"]
        # kubectl's (the controllers read and write each namespace's root CA).
        maps = [e for e in events() if e.get("objectRef", {}).get("resource") == "configmaps"
                and e["userAgent"].startswith("kubectl")]
        created = [e for e in maps if e["verb"] == "create"]
        assert [e["stage"] for e in created] == ["RequestReceived", "ResponseComplete"]
        assert created[1]["level"] == "RequestResponse"
        assert created[1]["requestObject"]["data"] == {"mode": "fast"}
        assert created[1]["responseObject"]["metadata"]["name"] == "settings"
        read = [e for e in maps if e["verb"] == "get" and e["stage"] == "ResponseComplete"]
        assert read and read[0]["responseObject"]["data"] == {"mode": "fast"}
        # Everything else is at level None: not recorded.
        assert {e["objectRef"]["resource"] for e in events() if "objectRef" in e} == {"secrets", "configmaps"}
    finally:
        portal.stop()


def test_legacy_token_secrets_are_filled_only_when_asked_for(api):
    ns = f"legacy-{uuid.uuid4().hex[:6]}"
    kubectl(api, "create", "namespace", ns)
    kubectl(api, "-n", ns, "create", "serviceaccount", "robot")
    # Accounts get no token Secret of their own (Kubernetes ≥ 1.24)...
    assert kubectl(api, "-n", ns, "get", "secrets", "-o", "name").stdout.strip() == ""
    # ...unless one is asked for.
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
              "metadata": {"name": "robot-token", "annotations": {"kubernetes.io/service-account.name": "robot"}}}
    kubectl(api, "-n", ns, "apply", "-f", "-", stdin=json.dumps(secret))

    def filled():
        data = json.loads(kubectl(api, "-n", ns, "get", "secret", "robot-token", "-o", "json").stdout).get("data", {})
        return data if "token" in data else None
    data = wait_for(filled, "the token to be filled in")
    assert base64.b64decode(data["namespace"]).decode() == ns
    assert base64.b64decode(data["ca.crt"]) == (api.data_dir / "pki" / "ca.crt").read_bytes()
    token = base64.b64decode(data["token"]).decode()
    assert jwt.decode(token, options={"verify_signature": False})["iss"] == "kubernetes/serviceaccount"
    code, body = https(api, f"/api/v1/namespaces/{ns}/pods", token)
    assert code == 403 and f'User "system:serviceaccount:{ns}:robot"' in body["message"]
    # It lives as long as its Secret.
    kubectl(api, "-n", ns, "delete", "secret", "robot-token")
    wait_for(lambda: https(api, "/version", token)[0] == 401, "the legacy token refused")


def test_pods_get_their_account_and_token_volume_unless_told_not_to(api):
    ns = f"mount-{uuid.uuid4().hex[:6]}"
    kubectl(api, "create", "namespace", ns)
    core = api.core()

    def pod(name, **spec):
        body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}
        return core.create_namespaced_pod(ns, body)

    def token_volumes(p):
        return [v for v in p.spec.volumes or [] if v.name.startswith("kube-api-access-")]
    plain = pod("plain")
    assert plain.spec.service_account_name == "default" and len(token_volumes(plain)) == 1
    mount = plain.spec.containers[0].volume_mounts[0]
    assert (mount.mount_path, mount.read_only) == (MOUNT, True)
    assert token_volumes(pod("opted-out", automountServiceAccountToken=False)) == []
    kubectl(api, "-n", ns, "create", "serviceaccount", "quiet")
    kubectl(api, "-n", ns, "patch", "serviceaccount", "quiet", "-p", '{"automountServiceAccountToken": false}')
    assert token_volumes(pod("quiet", serviceAccountName="quiet")) == []
    assert len(token_volumes(pod("loud", serviceAccountName="quiet", automountServiceAccountToken=True))) == 1
    missing = kubectl(api, "-n", ns, "run", "nobody", "--image=busybox", "--overrides",
                      '{"spec": {"serviceAccountName": "ghost"}}', check=False)
    assert missing.returncode != 0
    assert f'error looking up service account {ns}/ghost: serviceaccount "ghost" not found' in missing.stderr


def test_the_bootstrap_policy_is_reconciled_at_every_start(data_dir, start_portal):
    portal = start_portal()
    # A deleted bootstrap role, a binding made again with another role, a
    # rule a user added, and a binding its owner pinned.
    kubectl(portal, "delete", "clusterrole", "system:discovery")
    kubectl(portal, "delete", "clusterrolebinding", "system:basic-user")
    kubectl(portal, "create", "clusterrolebinding", "system:basic-user", "--clusterrole=view", "--user=carol")
    extra = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    kubectl(portal, "patch", "clusterrole", "system:public-info-viewer", "--type=json",
            "-p", json.dumps([{"op": "add", "path": "/rules/-", "value": extra}]))
    kubectl(portal, "annotate", "clusterrolebinding", "system:public-info-viewer", "--overwrite",
            "rbac.authorization.kubernetes.io/autoupdate=false")
    kubectl(portal, "patch", "clusterrolebinding", "system:public-info-viewer", "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/subjects/1"}]))
    portal.stop()
    portal = start_portal()

    def get(kind, name):
        return json.loads(kubectl(portal, "get", kind, name, "-o", "json").stdout)
    assert get("clusterrole", "system:discovery")["rules"], "a deleted role is made again"
    binding = get("clusterrolebinding", "system:basic-user")
    assert binding["roleRef"]["name"] == "system:basic-user", "the policy's role, in a binding made again"
    assert {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "carol"} in binding["subjects"]
    assert any(s["name"] == "system:authenticated" for s in binding["subjects"])
    assert extra in get("clusterrole", "system:public-info-viewer")["rules"], "a user's additions stay"
    pinned = get("clusterrolebinding", "system:public-info-viewer")
    assert [s["name"] for s in pinned["subjects"]] == ["system:authenticated"], "a pinned binding is left alone"
