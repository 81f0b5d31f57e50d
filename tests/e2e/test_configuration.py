"""ConfigMaps and Secrets through stock kubectl and the Python client, as
users make them (issue 28): `kubectl create configmap|secret generic|tls|
docker-registry` from literals and files, `stringData`, `immutable`, the
1 MiB bound, the per-type required keys, field selectors on `type`, and
the tables kubectl prints."""

import base64
import json
import subprocess

import kubernetes
import pytest

from support.kubectl import KUBECTLS, Kubectl


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("binary", KUBECTLS)
def test_kubectl_creates_config_maps_and_secrets(portal, tmp_path, binary):
    kubectl = Kubectl(binary, portal, tmp_path)
    (tmp_path / "app.properties").write_text("color=blue\n")
    kubectl.out("create", "configmap", "app", "--from-literal=mode=fast",
                f"--from-file={tmp_path / 'app.properties'}")
    cm = kubectl.json("get", "cm", "app")
    assert cm["data"] == {"mode": "fast", "app.properties": "color=blue\n"}

    kubectl.out("create", "secret", "generic", "creds", "--from-literal=user=admin", "--from-literal=pass=s3cret")
    secret = kubectl.json("get", "secret", "creds")
    assert secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["pass"]).decode() == "s3cret"

    # A real certificate and key, as `kubectl create secret tls` reads them.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=web",
                    "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    kubectl.out("create", "secret", "tls", "web-tls", f"--cert={tmp_path / 'tls.crt'}", f"--key={tmp_path / 'tls.key'}")
    tls = kubectl.json("get", "secret", "web-tls")
    assert tls["type"] == "kubernetes.io/tls"
    assert base64.b64decode(tls["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")

    kubectl.out("create", "secret", "docker-registry", "pull", "--docker-server=registry.local:5000",
                "--docker-username=bob", "--docker-password=hunter2")
    pull = kubectl.json("get", "secret", "pull")
    assert pull["type"] == "kubernetes.io/dockerconfigjson"
    auths = json.loads(base64.b64decode(pull["data"][".dockerconfigjson"]))["auths"]
    assert auths["registry.local:5000"]["username"] == "bob"

    table = kubectl.out("get", "secrets")
    assert table.split("\n")[0].split() == ["NAME", "TYPE", "DATA", "AGE"], table
    assert any(line.split()[:3] == ["creds", "Opaque", "2"] for line in table.splitlines()), table
    cms = kubectl.out("get", "configmaps")
    assert any(line.split()[:2] == ["app", "2"] for line in cms.splitlines()), cms
    only_tls = kubectl.out("get", "secrets", "--field-selector=type=kubernetes.io/tls", "-o", "name")
    assert only_tls.split() == ["secret/web-tls"], only_tls
    described = kubectl.out("describe", "secret", "creds")
    assert "pass:  6 bytes" in described and "s3cret" not in described, described


def test_secret_rules(portal):
    core = portal.core()
    # stringData is merged into data and never stored.
    made = core.create_namespaced_secret("default", {
        "metadata": {"name": "mixed"}, "data": {"a": b64("1"), "b": b64("old")}, "stringData": {"b": "new"}})
    assert made.data == {"a": b64("1"), "b": b64("new")} and made.string_data is None
    raw = json.loads(core.read_namespaced_secret("mixed", "default", _preload_content=False).data)
    assert "stringData" not in raw

    def refused(body, status=422):
        with pytest.raises(kubernetes.client.ApiException) as caught:
            core.create_namespaced_secret("default", body)
        assert caught.value.status == status, caught.value.body
        return json.loads(caught.value.body)

    tls = refused({"metadata": {"name": "bad-tls"}, "type": "kubernetes.io/tls", "data": {"tls.crt": b64("x")}})
    assert [c["field"] for c in tls["details"]["causes"]] == ["data[tls.key]"]
    docker = refused({"metadata": {"name": "bad-docker"}, "type": "kubernetes.io/dockerconfigjson",
                      "data": {".dockerconfigjson": b64("{not json")}})
    assert "secret contents redacted" in docker["message"]
    big = refused({"metadata": {"name": "big"}, "stringData": {"blob": "x" * (1024 * 1024 + 1)}})
    assert "may not be more than 1048576 bytes" in big["message"], big["message"]
    key = refused({"metadata": {"name": "bad-key"}, "stringData": {"../etc": "x"}})
    assert "a valid config key" in key["message"]
    # Not base64: refused as a bad request, as Kubernetes decodes `data`.
    refused({"metadata": {"name": "not-b64"}, "data": {"a": "%%%"}}, status=400)

    # The type never changes; an immutable Secret's data neither.
    core.create_namespaced_secret("default", {"metadata": {"name": "frozen"}, "immutable": True,
                                              "stringData": {"k": "v"}})
    for patch in [{"stringData": {"k": "w"}}, {"immutable": False}, {"type": "kubernetes.io/basic-auth"}]:
        with pytest.raises(kubernetes.client.ApiException) as caught:
            core.patch_namespaced_secret("frozen", "default", patch)
        assert caught.value.status == 422, caught.value.body
    # Its labels still may.
    core.patch_namespaced_secret("frozen", "default", {"metadata": {"labels": {"tier": "db"}}})


def test_config_map_rules(portal):
    core = portal.core()
    core.create_namespaced_config_map("default", {"metadata": {"name": "both"}, "data": {"text": "hi"},
                                                  "binaryData": {"bin": b64("\x00\x01")}})
    got = core.read_namespaced_config_map("both", "default")
    assert got.data == {"text": "hi"} and got.binary_data == {"bin": b64("\x00\x01")}
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.create_namespaced_config_map("default", {"metadata": {"name": "dup"}, "data": {"a": "x"},
                                                      "binaryData": {"a": b64("x")}})
    assert caught.value.status == 422 and "duplicate of key present in binaryData" in caught.value.body
    core.create_namespaced_config_map("default", {"metadata": {"name": "frozen"}, "immutable": True,
                                                  "data": {"a": "1"}})
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.patch_namespaced_config_map("frozen", "default", {"data": {"a": "2"}})
    assert caught.value.status == 422
    assert "field is immutable when `immutable` is set" in caught.value.body
    core.delete_namespaced_config_map("frozen", "default")


def test_volumes_a_node_cannot_set_up_are_refused(portal):
    """Never a pod silently running without a volume it asked for."""
    core = portal.core()
    with pytest.raises(kubernetes.client.ApiException) as caught:
        core.create_namespaced_pod("default", {"metadata": {"name": "nfs"}, "spec": {
            "containers": [{"name": "c", "image": "busybox", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "nfs": {"server": "nfs.local", "path": "/export"}}]}})
    assert caught.value.status == 422
    assert "spec.volumes[0].nfs: Forbidden: nfs volumes are not supported" in caught.value.body
