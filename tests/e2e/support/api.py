"""Talking to a Portal API server directly: its CA, a minimal Service."""

import base64

from kubernetes import client


def portal_ca(portal):
    """The cluster CA (PEM) from the server's admin kubeconfig."""
    return base64.b64decode(portal.config()["clusters"][0]["cluster"]["certificate-authority-data"]).decode()


def service(name, labels=None, port=80):
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1ServiceSpec(selector={"app": name}, ports=[client.V1ServicePort(port=port)]),
    )
