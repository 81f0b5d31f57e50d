"""Secrets encrypted at rest (issue 28): with `--encryption-provider-config`
(Kubernetes' EncryptionConfiguration) no Secret's plaintext reaches the
store's files or etcd's keys, while clients read them as ever; ConfigMaps,
not named in the file, stay plain (the check can fail); keys rotate by
putting the new key first and re-writing; a server without the key cannot
read what was sealed."""

import base64
import json
import pathlib
import subprocess
import uuid

import pytest

from conftest import Portal
from support.etcd import EtcdCluster
from support.kubectl import KUBECTLS, Kubectl

AES = base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
BOX = base64.b64encode(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef").decode()


def write_config(path, providers):
    path.write_text("apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
                    "- resources: [secrets]\n  providers:\n" + providers)
    return path


def stored_bytes(data_dir):
    return b"".join(p.read_bytes() for p in (pathlib.Path(data_dir) / "store").rglob("*") if p.is_file())


def test_secrets_are_sealed_in_the_embedded_store_and_keys_rotate(tmp_path):
    marker = f"plain-{uuid.uuid4().hex}"
    config = write_config(tmp_path / "enc.yaml", f"  - aescbc: {{keys: [{{name: k1, secret: {AES}}}]}}\n  - identity: {{}}\n")
    data = tmp_path / "data"
    data.mkdir()
    server = Portal(data, ["--encryption-provider-config", str(config)]).start()
    try:
        kubectl = Kubectl(KUBECTLS[0], server, tmp_path)
        kubectl.out("create", "secret", "generic", "db", f"--from-literal=password={marker}")
        kubectl.out("create", "configmap", "visible", f"--from-literal=note={marker}")
        got = kubectl.json("get", "secret", "db")
        assert base64.b64decode(got["data"]["password"]).decode() == marker
    finally:
        server.stop()
    raw = stored_bytes(data)
    encoded = base64.b64encode(marker.encode())
    assert marker.encode() in raw, "the ConfigMap is stored plain: the check can see plaintext"
    assert encoded not in raw, "the Secret's value (base64, as a Secret holds it) is not in the store"
    assert b"k8s:enc:aescbc:v1:k1:" in raw

    # A server without the key cannot read it.
    wrong = write_config(tmp_path / "wrong.yaml", f"  - secretbox: {{keys: [{{name: k2, secret: {BOX}}}]}}\n")
    server = Portal(data, ["--encryption-provider-config", str(wrong)]).start()
    try:
        kubectl = Kubectl(KUBECTLS[0], server, tmp_path)
        assert kubectl("get", "secret", "db", check=False).returncode != 0
    finally:
        server.stop()

    # Rotation: the new key first, the old one still listed; re-writing seals with the new one.
    rotated = write_config(tmp_path / "rotated.yaml", f"  - secretbox: {{keys: [{{name: k2, secret: {BOX}}}]}}\n"
                           f"  - aescbc: {{keys: [{{name: k1, secret: {AES}}}]}}\n")
    server = Portal(data, ["--encryption-provider-config", str(rotated)]).start()
    try:
        kubectl = Kubectl(KUBECTLS[0], server, tmp_path)
        listed = kubectl.out("get", "secrets", "-o", "json")
        kubectl("replace", "-f", "-", input=listed)
        got = kubectl.json("get", "secret", "db")
        assert base64.b64decode(got["data"]["password"]).decode() == marker
    finally:
        server.stop()
    assert b"k8s:enc:secretbox:v1:k2:" in stored_bytes(data)


def test_secrets_are_sealed_in_etcd(tmp_path):
    marker = f"plain-{uuid.uuid4().hex}"
    config = write_config(tmp_path / "enc.yaml", f"  - secretbox: {{keys: [{{name: k1, secret: {BOX}}}]}}\n")
    etcd = EtcdCluster(1).start()
    try:
        (tmp_path / "data").mkdir()
        server = Portal(tmp_path / "data", ["--encryption-provider-config", str(config),
                                            "--datastore-endpoint", etcd.endpoint]).start()
        try:
            core = server.core()
            core.create_namespaced_secret("default", {"metadata": {"name": "db"}, "stringData": {"password": marker}})
            assert base64.b64decode(core.read_namespaced_secret("db", "default").data["password"]).decode() == marker
        finally:
            server.stop()
        endpoint = f"127.0.0.1:{etcd.members[0]['client']}"
        dump = subprocess.run(["etcdctl", f"--endpoints={endpoint}", "get", "--prefix", "/registry/core/secrets/", "-w", "json"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        values = [base64.b64decode(kv["value"]) for kv in json.loads(dump).get("kvs", [])]
        assert values and all(v.startswith(b"k8s:enc:secretbox:v1:k1:") for v in values), values[:1]
        assert not any(marker.encode() in v or base64.b64encode(marker.encode()) in v for v in values)
    finally:
        etcd.stop()
