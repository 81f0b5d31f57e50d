"""Talking to a Portal API server directly: its CA, a minimal Service, a
ReplicationController and the pods it owns."""

import base64

from kubernetes import client

NS = "default"


def portal_ca(portal):
    """The cluster CA (PEM) from the server's admin kubeconfig."""
    return base64.b64decode(portal.config()["clusters"][0]["cluster"]["certificate-authority-data"]).decode()


def service(name, labels=None, port=80):
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1ServiceSpec(selector={"app": name}, ports=[client.V1ServicePort(port=port)]),
    )


def rc_body(name, replicas):
    """A ReplicationController `name` whose pods are labelled app=name."""
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"app": name},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "registry.local/app:1"}]}},
        },
    }


def owned_pods(core, name):
    """The pods labelled app=name that have an owner (in NS)."""
    return [p for p in core.list_namespaced_pod(NS, label_selector=f"app={name}").items if p.metadata.owner_references]
