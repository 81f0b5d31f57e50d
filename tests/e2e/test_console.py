"""The web console (issue 34): served by `portal server` at /console/,
signed in with a bearer token so RBAC applies, showing the live graph of
Services, EndpointSlices, pods and nodes, a pod's logs, events and the
data path's charts. The browser half is console/e2e/drive.mjs, run in
Debian's Chromium through Playwright; the screenshot it takes is kept in
target/test-artifacts/ (or $PORTAL_TEST_ARTIFACTS)."""

import os
import pathlib
import subprocess

import base64

import pytest
import requests
import yaml

from conftest import Portal
from support import nodes
from support.agent_bed import NS, AgentNode, web_image

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = pathlib.Path(os.environ.get("PORTAL_TEST_ARTIFACTS", ROOT / "target" / "test-artifacts"))



def ca_file(portal):
    """The cluster CA from the admin kubeconfig, to check the server's certificate."""
    path = portal.data_dir / "console-ca.crt"
    path.write_bytes(base64.b64decode(portal.config()["clusters"][0]["cluster"]["certificate-authority-data"]))
    return str(path)


def test_the_page_is_public_and_guarded_by_its_headers(portal):
    ca = ca_file(portal)
    page = requests.get(f"{portal.server}/console/", verify=ca, timeout=10)
    assert page.status_code == 200 and "/console/console.js" in page.text
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    script = requests.get(f"{portal.server}/console/console.js", verify=ca, timeout=10)
    assert script.headers["Content-Type"].startswith("text/javascript")
    again = requests.get(f"{portal.server}/console/console.js", verify=ca, timeout=10,
                         headers={"If-None-Match": script.headers["ETag"]})
    assert again.status_code == 304
    bare = requests.get(f"{portal.server}/console", verify=ca, timeout=10, allow_redirects=False)
    assert bare.status_code == 308 and bare.headers["Location"] == "/console/"
    notices = requests.get(f"{portal.server}/console/licenses.txt", verify=ca, timeout=10)
    assert "preact" in notices.text and "MIT" in notices.text


def test_an_operator_may_turn_it_off(data_dir):
    server = Portal(data_dir, ["--console=false"]).start()
    try:
        page = requests.get(f"{server.server}/console/", verify=ca_file(server), timeout=10)
        assert page.status_code == 404, page.text
    finally:
        server.stop()


def deployment_and_service(image):
    labels = {"app": "web"}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{
                            "name": "web",
                            "image": image,
                            "command": ["sh", "-c", "echo serving web; exec httpd -f -p 8080"],
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        }],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    ]


# What the console's user may do: read the namespace (view), the nodes and
# /metrics; nothing else, in particular nothing in other namespaces.
def viewer_rbac():
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "console-viewer", "namespace": NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "console-viewer", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
         "subjects": [{"kind": "ServiceAccount", "name": "console-viewer", "namespace": NS}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "console-nodes"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
        *[{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": f"console-viewer-{role}"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [{"kind": "ServiceAccount", "name": "console-viewer", "namespace": NS}]}
          for role in ("console-nodes", "system:monitoring")],
    ]


@pytest.mark.root
@pytest.mark.netns
def test_the_console_shows_what_kubectl_does_live(tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "console.png"
    screenshot.unlink(missing_ok=True)
    with AgentNode(tmp_path) as node:
        image = web_image(node)
        rbac = tmp_path / "rbac.yaml"
        rbac.write_text(yaml.safe_dump_all(viewer_rbac()))
        node.kubectl("apply", "-f", str(rbac))
        token = node.kubectl("create", "token", "console-viewer", "-n", NS).strip()
        manifest = tmp_path / "web.yaml"
        manifest.write_text(yaml.safe_dump_all(deployment_and_service(image)))
        env = {
            **os.environ,
            "CONSOLE_URL": node.portal.server,
            "TOKEN": token,
            "NAMESPACE": NS,
            "KUBECONFIG": str(node.portal.kubeconfig),
            "MANIFEST": str(manifest),
            "SCREENSHOT": str(screenshot),
            "DNS_SERVER": nodes.NODE_IP,
        }
        result = subprocess.run(["node", str(ROOT / "console" / "e2e" / "drive.mjs")], env=env,
                                capture_output=True, text=True, timeout=600)
        print(result.stdout)
        assert result.returncode == 0, result.stderr
        # A real picture of the page, for people to look at.
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert screenshot.stat().st_size > 20_000
