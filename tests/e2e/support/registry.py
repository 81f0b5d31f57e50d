"""A real OCI registry on loopback for the node agent's tests (Debian's
`docker-registry`), and images built offline from Debian's busybox-static,
pushed over the distribution API. Nothing is pulled from outside the
machine.
"""

import base64
import gzip
import hashlib
import io
import json
import pathlib
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """`with Registry() as r:` runs docker-registry on 127.0.0.1:PORT."""

    def __init__(self, bind="127.0.0.1", users=None):
        """`bind`: the address it listens on (`0.0.0.0` inside a test-made
        network namespace, for other test nodes); `host` is its loopback name.
        `users` ({name: password}): the registry then requires a login
        (htpasswd, bcrypt), and pushes log in as the first one."""
        self.users = users or {}
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="portal-registry-"))
        self.port = free_port()
        self.bind = bind
        self.host = f"127.0.0.1:{self.port}"
        self.process = None

    def __enter__(self):
        config = self.dir / "config.yml"
        auth = ""
        if self.users:
            import bcrypt
            htpasswd = self.dir / "htpasswd"
            htpasswd.write_text("".join(
                f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                for user, password in self.users.items()))
            auth = f"auth: {{htpasswd: {{realm: portal-test, path: {htpasswd}}}}}\n"
        config.write_text(
            "version: 0.1\n"
            "log: {level: error}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.dir / 'data'}}}, delete: {{enabled: true}}}}\n"
            f"http: {{addr: '{self.bind}:{self.port}'}}\n"
            + auth
        )
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=open(self.dir / "log", "wb"))
        deadline = time.monotonic() + 20
        while True:
            try:
                self._request("GET", "/v2/").read()
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"docker-registry did not start: {(self.dir / 'log').read_text()}")
                time.sleep(0.05)

    def __exit__(self, *exc):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _headers(self, headers=None):
        headers = dict(headers or {})
        if self.users:
            user, password = next(iter(self.users.items()))
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return headers

    def _request(self, method, path, data=None, headers=None):
        request = urllib.request.Request(f"http://{self.host}{path}", data=data, method=method, headers=self._headers(headers))
        return urllib.request.urlopen(request, timeout=30)

    def push_blob(self, repository, blob):
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        try:
            self._request("HEAD", f"/v2/{repository}/blobs/{digest}")
            return digest
        except urllib.error.HTTPError:
            pass
        upload = self._request("POST", f"/v2/{repository}/blobs/uploads/").headers["Location"]
        if upload.startswith("/"):
            upload = f"http://{self.host}{upload}"
        separator = "&" if "?" in upload else "?"
        request = urllib.request.Request(f"{upload}{separator}digest={digest}", data=blob, method="PUT",
                                         headers=self._headers({"Content-Type": "application/octet-stream"}))
        urllib.request.urlopen(request, timeout=30).read()
        return digest

    def push_image(self, repository, tag, layers, config, docker=False):
        """Pushes gzip layers and a config document as an OCI manifest (or
        Docker's schema 2 with `docker`); returns the manifest digest."""
        layer_type = ("application/vnd.docker.image.rootfs.diff.tar.gzip" if docker
                      else "application/vnd.oci.image.layer.v1.tar+gzip")
        layer_descriptors = []
        diff_ids = []
        for layer in layers:
            digest = self.push_blob(repository, layer)
            layer_descriptors.append({"mediaType": layer_type, "digest": digest, "size": len(layer)})
            diff_ids.append("sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest())
        document = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        config_blob = json.dumps(document).encode()
        config_digest = self.push_blob(repository, config_blob)
        manifest_type = DOCKER_MANIFEST_TYPE if docker else MANIFEST_TYPE
        config_type = ("application/vnd.docker.container.image.v1+json" if docker
                       else "application/vnd.oci.image.config.v1+json")
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {"mediaType": config_type, "digest": config_digest, "size": len(config_blob)},
            "layers": layer_descriptors,
        }).encode()
        self._request("PUT", f"/v2/{repository}/manifests/{tag}", data=manifest, headers={"Content-Type": manifest_type}).read()
        return "sha256:" + hashlib.sha256(manifest).hexdigest(), len(manifest)

    def push_index(self, repository, tag, manifests):
        """Pushes an OCI image index of (manifest digest, size, os, arch)."""
        index = json.dumps({
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [{"mediaType": MANIFEST_TYPE, "digest": digest, "size": size,
                           "platform": {"os": os_name, "architecture": arch}}
                          for digest, size, os_name, arch in manifests],
        }).encode()
        self._request("PUT", f"/v2/{repository}/manifests/{tag}", data=index, headers={"Content-Type": INDEX_TYPE}).read()
        return "sha256:" + hashlib.sha256(index).hexdigest()


def _add(archive, name, data=b"", mode=0o644, kind=tarfile.REGTYPE, target=None):
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.type = kind
    info.mtime = 0
    if target is not None:
        info.linkname = target
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    else:
        archive.addfile(info)


def busybox_layer(files=None):
    """A gzip layer: busybox with every applet in /bin, /etc/passwd and
    /etc/group, /tmp, and `files` ({path: bytes})."""
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for directory in ["bin", "etc", "tmp", "var", "var/www", "root", "proc", "sys", "dev"]:
            _add(archive, directory, kind=tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755)
        _add(archive, "bin/busybox", pathlib.Path(BUSYBOX).read_bytes(), mode=0o755)
        for applet in applets:
            if applet != "busybox":
                _add(archive, f"bin/{applet}", kind=tarfile.SYMTYPE, target="busybox")
        _add(archive, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        _add(archive, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        for path, data in (files or {}).items():
            _add(archive, path.lstrip("/"), data, mode=0o755)
    return gzip.compress(raw.getvalue(), compresslevel=1, mtime=0)


def push_busybox(registry, repository="busybox", tag="1.36", entrypoint=None, cmd=None, env=None, files=None, workdir="",
                 docker=False):
    config = {
        "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Cmd": cmd if cmd is not None else ["sh"],
        "WorkingDir": workdir,
    }
    if entrypoint is not None:
        config["Entrypoint"] = entrypoint
    return registry.push_image(repository, tag, [busybox_layer(files)], config, docker=docker)[0]
