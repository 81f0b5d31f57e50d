"""A real multi-layer Debian image, made the way users' images are made:
an `mmdebstrap --variant=minbase` layer, an `apt-get install nginx-light`
layer (the difference umoci computes between the two trees), and a small
hand-made layer as a Dockerfile step leaves one: a directory under
`var/run` (a symlink to `/run` in the base), an opaque whiteout, a
whiteout and a hard link to a file of the layer below. Assembled with
`umoci` into an OCI layout cached under `.cache/images` (Debian's packages
come from the machine's apt sources; nothing is pulled from an image
registry), pushed with `skopeo`, and compared with `umoci unpack`."""

import fcntl
import hashlib
import io
import os
import pathlib
import shutil
import stat
import subprocess
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[3]
CACHE = ROOT / ".cache" / "images"
NGINX = CACHE / "debian-nginx-v2"
PYTHON = CACHE / "debian-python-kubernetes-v1"
TAG = "nginx"
# Reproducible trees: files both runs share are the same bytes and times,
# so the nginx layer holds only what the install changed.
EPOCH = "1700000000"
MIRROR = "http://deb.debian.org/debian"


def run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=900, **kwargs)


def nginx_layout():
    """The OCI layout of the image (tag `nginx`), built once."""
    return cached(NGINX, lambda out: build(out, ["nginx-light"], site_layer(), [
        "--config.cmd", "nginx", "--config.cmd", "-g", "--config.cmd", "daemon off;",
        "--config.exposedports", "80/tcp"]))


def python_layout():
    """A Debian image with Python and its Kubernetes client (`python3-kubernetes`),
    as an in-cluster client's image is made (tag `nginx` too: one tag per layout)."""
    return cached(PYTHON, lambda out: build(out, ["python3-kubernetes"], None, ["--config.cmd", "python3"]))


def cached(layout, make):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (layout / "index.json").exists():
            make(layout)
    return layout


def build(out, packages, top_layer, config):
    """A minbase layer, a layer with `packages` installed, then `top_layer`
    (tar bytes) if any."""
    with tempfile.TemporaryDirectory(prefix="portal-debian-", dir=CACHE) as tmp:
        tmp = pathlib.Path(tmp)
        env = {**os.environ, "SOURCE_DATE_EPOCH": EPOCH}
        run("mmdebstrap", "--variant=minbase", "--quiet", "bookworm", str(tmp / "base.tar"), MIRROR, env=env)
        run("mmdebstrap", "--variant=minbase", "--quiet", "--include=" + ",".join(packages), "bookworm",
            str(tmp / "packages.tar"), MIRROR, env=env)
        layout = tmp / "oci"
        image = f"{layout}:{TAG}"
        run("umoci", "init", "--layout", str(layout))
        run("umoci", "new", "--image", image)
        for tree in ["base.tar", "packages.tar"]:
            bundle = tmp / "bundle"
            run("umoci", "unpack", "--image", image, str(bundle))
            rootfs = bundle / "rootfs"
            for entry in rootfs.iterdir():
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            run("tar", "-C", str(rootfs), "-xf", str(tmp / tree))
            run("umoci", "repack", "--image", image, str(bundle))
            shutil.rmtree(bundle)
        if top_layer is not None:
            (tmp / "top.tar").write_bytes(top_layer)
            run("umoci", "raw", "add-layer", "--image", image, str(tmp / "top.tar"))
        run("umoci", "config", "--image", image, *config,
            "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--architecture", "amd64", "--os", "linux")
        run("umoci", "gc", "--layout", str(layout))
        layout.rename(out)


def site_layer():
    """What a `RUN`/`COPY` step on top of the nginx layer leaves."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, linkname=""):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, int(EPOCH), linkname
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        # Below the base's `var/run -> /run`: lands in /run/nginx.
        add("var/run/nginx/", tarfile.DIRTYPE, mode=0o755)
        add("var/run/nginx/ready", data=b"made by the site layer\n")
        # The lower layers' logrotate rules are gone, this layer's stay.
        add("etc/logrotate.d/.wh..wh..opq")
        add("etc/logrotate.d/site", data=b"/var/log/site.log {}\n")
        add("etc/.wh.motd")
        # A hard link to the nginx layer's binary (with its mode, as tar
        # records a link: the entry's metadata is the shared inode's).
        add("usr/local/bin/nginx-hardlink", tarfile.LNKTYPE, linkname="usr/sbin/nginx", mode=0o755)
    return buffer.getvalue()


def push(layout, registry_host, repository="debian-nginx", tag="1"):
    """Pushes the image with skopeo; returns its reference."""
    reference = f"{registry_host}/{repository}:{tag}"
    run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:{TAG}", f"docker://{reference}")
    return reference


def reference_tree(layout, into):
    """`umoci unpack` of the image: the tree the agent's unpack must equal."""
    run("umoci", "unpack", "--image", f"{layout}:{TAG}", str(into))
    return pathlib.Path(into) / "rootfs"


def describe_tree(root):
    """Every entry of a tree but device nodes (which unprivileged unpacks
    leave out): type, mode, owner, contents or target, extended attributes,
    and which paths share an inode (hard links)."""
    root = pathlib.Path(root)
    entries, inodes = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = pathlib.Path(dirpath) / name
            info = os.lstat(path)
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                continue
            relative = str(path.relative_to(root))
            if stat.S_ISREG(info.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
                inodes.setdefault(info.st_ino, []).append(relative)
            elif stat.S_ISLNK(info.st_mode):
                what = os.readlink(path)
            else:
                what = ""
            xattrs = {}
            if not stat.S_ISLNK(info.st_mode):
                for key in os.listxattr(path, follow_symlinks=False):
                    xattrs[key] = os.getxattr(path, key, follow_symlinks=False).hex()
            entries[relative] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid, what,
                                 tuple(sorted(xattrs.items())))
    links = sorted(tuple(sorted(paths)) for paths in inodes.values() if len(paths) > 1)
    return entries, links
