"""Real images (issue 28): a multi-layer Debian nginx image built as users
build theirs (support.debian_images) runs and serves Debian's default
page; the agent's unpacked tree is the one `umoci unpack` makes (lower
layers' symlinks followed inside the root, opaque whiteouts, hard links
across layers, modes, owners, file capabilities); a malicious layer is
refused with nothing outside the root touched. Pods run for real in a node
namespace the test makes."""

import gzip
import hashlib
import io
import json
import pathlib
import tarfile
import urllib.request
import uuid

import pytest

from support import debian_images, registry
from support.agent_bed import NS, AgentNode, pod_manifest
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def layout():
    # Built before the node namespace is entered: Debian's packages come
    # from the machine's apt sources.
    return debian_images.nginx_layout()


@pytest.fixture(scope="module")
def node(tmp_path_factory, layout):
    with AgentNode(tmp_path_factory.mktemp("images")) as node:
        node.nginx = debian_images.push(layout, node.registry.host)
        yield node


def unpacked_root(node, marker):
    """The agent's unpacked tree of the image holding `marker`."""
    for rootfs in (node.data_dir / "agent").glob("**/unpacked/*/rootfs"):
        if (rootfs / marker).exists():
            return rootfs
    raise AssertionError(f"no unpacked image holds {marker}")


def test_debian_nginx_runs_and_unpacks_as_umoci_does(node, layout, tmp_path):
    node.core.create_namespaced_pod(NS, pod_manifest("nginx", node.nginx))
    pod = node.wait_running("nginx", timeout=180)
    page = urllib.request.urlopen(f"http://{pod.status.pod_ip}/", timeout=10).read().decode()
    assert "Welcome to nginx!" in page, page
    # The site layer's var/run/nginx is the base's /run/nginx.
    ready = node.kubectl("-n", NS, "exec", "nginx", "--", "cat", "/run/nginx/ready")
    assert ready == "made by the site layer\n"

    ours = debian_images.describe_tree(unpacked_root(node, "usr/local/bin/nginx-hardlink"))
    theirs = debian_images.describe_tree(debian_images.reference_tree(layout, tmp_path / "umoci"))
    assert ours[1] == theirs[1], "hard links differ"
    missing = sorted(set(theirs[0]) - set(ours[0]))
    extra = sorted(set(ours[0]) - set(theirs[0]))
    differ = sorted(p for p in set(ours[0]) & set(theirs[0]) if ours[0][p] != theirs[0][p])
    assert (missing, extra, differ[:5]) == ([], [], []), [(p, ours[0][p], theirs[0][p]) for p in differ[:5]]
    entries = ours[0]
    assert "etc/motd" not in entries and "etc/logrotate.d/apt" not in entries and "etc/logrotate.d/site" in entries
    assert "run/nginx/ready" in entries and ("usr/local/bin/nginx-hardlink", "usr/sbin/nginx") in ours[1]
    node.core.delete_namespaced_pod("nginx", NS, grace_period_seconds=0)


def gzip_layer(entries):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, linkname in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, linkname, 0o644
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return gzip.compress(buffer.getvalue())


@pytest.mark.parametrize("entries", [
    [("../../../../../../tmp/{victim}", tarfile.REGTYPE, "")],
    [("etc/", tarfile.DIRTYPE, ""), ("etc/shadow-link", tarfile.LNKTYPE, "/tmp/{victim}")],
], ids=["dot-dot-path", "absolute-hard-link"])
def test_malicious_layers_are_refused(node, entries):
    victim = f"portal-victim-{uuid.uuid4().hex}"
    pathlib.Path("/tmp", victim).write_text("keep\n")
    try:
        layer = gzip_layer([(name.format(victim=victim), kind, link.format(victim=victim)) for name, kind, link in entries])
        tag = uuid.uuid4().hex[:8]
        node.registry.push_image("evil", tag, [layer], {"Cmd": ["/bin/true"]})
        name = f"evil-{tag}"
        node.core.create_namespaced_pod(NS, pod_manifest(name, f"{node.registry.host}/evil:{tag}"))

        def pull_failed():
            statuses = node.pod(name).status.container_statuses or []
            waiting = statuses[0].state.waiting if statuses and statuses[0].state else None
            return waiting if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff") else None
        waiting = wait_for(pull_failed, "the pull to fail")
        failed = [e[2] for e in node.events(name) if e[1] == "Failed"]
        assert failed and any("refused" in m or "out of the image root" in m for m in failed), (waiting.message, failed)
        assert pathlib.Path("/tmp", victim).read_text() == "keep\n"
        assert pathlib.Path("/tmp", victim).stat().st_nlink == 1
        node.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    finally:
        pathlib.Path("/tmp", victim).unlink()


def test_private_registry_needs_the_pods_pull_secret(node):
    """A registry that requires a login: without `imagePullSecrets` the
    pull fails with the registry's reason; with a `docker-registry` Secret
    made by kubectl it works, named by the pod or by its service account."""
    with registry.Registry(users={"deployer": "s3cret-pass"}) as private:
        registry.push_busybox(private, "private", "1")
        image = f"{private.host}/private:1"
        node.core.create_namespaced_pod(NS, pod_manifest("anonymous", image, ["sleep", "100000"]))

        def pull_failed():
            statuses = node.pod("anonymous").status.container_statuses or []
            waiting = statuses[0].state.waiting if statuses and statuses[0].state else None
            return waiting if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff") else None
        wait_for(pull_failed, "the anonymous pull to fail")
        failed = [e[2] for e in node.events("anonymous") if e[1] == "Failed" and "Failed to pull" in e[2]]
        assert failed and "Not authorized" in failed[0], failed

        node.kubectl("-n", NS, "create", "secret", "docker-registry", "private-login", f"--docker-server={private.host}",
                     "--docker-username=deployer", "--docker-password=s3cret-pass")
        node.core.create_namespaced_pod(NS, pod_manifest("logged-in", image, ["sleep", "100000"],
                                                         imagePullSecrets=[{"name": "private-login"}]))
        node.wait_running("logged-in")
        # Or through the pod's service account: its pull secrets are the
        # pod's when the pod names none (ServiceAccount admission).
        node.kubectl("-n", NS, "create", "serviceaccount", "deployer")
        node.kubectl("-n", NS, "patch", "serviceaccount", "deployer", "-p",
                     '{"imagePullSecrets": [{"name": "private-login"}]}')
        node.core.create_namespaced_pod(NS, pod_manifest("by-account", image, ["sleep", "100000"],
                                                         serviceAccountName="deployer"))
        assert [s.name for s in node.pod("by-account").spec.image_pull_secrets] == ["private-login"]
        node.wait_running("by-account")
        for name in ["anonymous", "logged-in", "by-account"]:
            node.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_unused_images_are_garbage_collected(tmp_path):
    """Past the disk's high mark (0 % here, so always), images no container
    uses go, least recently used first; one a pod runs stays."""
    args = ["--image-gc-high-threshold", "0", "--image-gc-low-threshold", "0",
            "--image-minimum-gc-age", "1s", "--image-gc-period", "1s"]
    (tmp_path / "gc").mkdir()
    with AgentNode(tmp_path / "gc", extra_args=args) as node:
        registry.push_busybox(node.registry, "kept", "1")
        registry.push_busybox(node.registry, "dropped", "1", files={"marker": b"dropped\n"})
        for name in ["kept", "dropped"]:
            node.core.create_namespaced_pod(NS, pod_manifest(name, f"{node.registry.host}/{name}:1", ["sleep", "100000"]))
            node.wait_running(name)
        unpacked = node.data_dir / "agent" / "images" / "unpacked"
        assert len(list(unpacked.iterdir())) == 2
        node.core.delete_namespaced_pod("dropped", NS, grace_period_seconds=0)
        wait_for(lambda: len(list(unpacked.iterdir())) == 1, "the unused image to be collected", timeout=60)
        remaining = next(unpacked.iterdir())
        assert not (remaining / "rootfs" / "marker").exists(), "the image in use is kept"
        assert node.kubectl("-n", NS, "exec", "kept", "--", "true") == ""


def test_indexes_docker_manifests_and_digests(node):
    """An OCI image index (linux/amd64 picked out of several platforms), a
    Docker schema 2 manifest, and `image@sha256:` references all run."""
    layer = registry.busybox_layer()
    config = {"Env": ["PATH=/bin"], "Cmd": ["sleep", "100000"]}
    amd64, size = node.registry.push_image("multi", "amd64-only", [layer], config)
    # The other platform's manifest has a layer that is no layer: picking it would fail.
    garbage = node.registry.push_blob("multi", b"not a layer")
    config_blob = json.dumps({"architecture": "arm64", "os": "linux", "config": config,
                              "rootfs": {"type": "layers", "diff_ids": [garbage]}}).encode()
    arm64_manifest = json.dumps({"schemaVersion": 2, "mediaType": registry.MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": node.registry.push_blob("multi", config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": garbage, "size": 11}]}).encode()
    node.registry._request("PUT", "/v2/multi/manifests/arm64-only", data=arm64_manifest,
                           headers={"Content-Type": registry.MANIFEST_TYPE}).read()
    arm64 = "sha256:" + hashlib.sha256(arm64_manifest).hexdigest()
    node.registry.push_index("multi", "1", [(arm64, len(arm64_manifest), "linux", "arm64"), (amd64, size, "linux", "amd64")])
    docker_digest, _ = node.registry.push_image("dockerish", "1", [layer], config, docker=True)
    images = {
        "from-index": f"{node.registry.host}/multi:1",
        "docker-v2": f"{node.registry.host}/dockerish:1",
        "by-digest": f"{node.registry.host}/dockerish@{docker_digest}",
    }
    for name, image in images.items():
        node.core.create_namespaced_pod(NS, pod_manifest(name, image))
    ids = {name: node.wait_running(name).status.container_statuses[0].image_id for name in images}
    assert ids["from-index"].startswith(f"{node.registry.host}/multi@sha256:"), ids
    assert ids["docker-v2"] == ids["by-digest"] == f"{node.registry.host}/dockerish@{docker_digest}", ids
    for name in images:
        node.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
