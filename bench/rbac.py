#!/usr/bin/env python3
"""Authorization cost (issue 29), one run, anchor side by side.

One `portal server` (API only) with 1,000 Roles and 1,000 RoleBindings
spread over 100 namespaces (as a shared cluster has them) and 100 pods in
one namespace. The same list of the 100 pods is asked, interleaved, as the
admin (`system:masters`: no RBAC lookup) and as a user whose RoleBinding
grants it (the RBAC path: the index, then the rules of the user's and its
groups' grants), over HTTP/1.1 keep-alive connections, with the Python
client's JSON. Reports p50/p99 of each and the ratio.

Writes a Markdown table to $BENCH_OUT (or stdout).
Usage: bench/rbac.py [--roles 1000] [--requests 2000]
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
os.environ.setdefault("PORTAL_BIN", str(ROOT / "target" / "release" / "portal"))

from kubernetes import client  # noqa: E402

from conftest import Portal  # noqa: E402

NS = "bench"


def api_for(portal, token):
    configuration = client.Configuration()
    configuration.host = portal.server
    configuration.ssl_ca_cert = str(portal.data_dir / "pki" / "ca.crt")
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def fill(portal, roles):
    admin = portal.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    namespaces = [f"team-{i}" for i in range(100)] + [NS]
    for ns in namespaces:
        core.create_namespace({"metadata": {"name": ns}})
    for i in range(roles):
        ns = namespaces[i % 100]
        rbac.create_namespaced_role(ns, {
            "metadata": {"name": f"role-{i}"},
            "rules": [{"verbs": ["get", "list"], "apiGroups": ["", "apps"], "resources": ["configmaps", f"things-{i}"]}],
        })
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": f"binding-{i}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"role-{i}"},
            "subjects": [{"kind": "User", "name": f"user-{i}", "apiGroup": "rbac.authorization.k8s.io"},
                         {"kind": "Group", "name": f"group-{i % 50}", "apiGroup": "rbac.authorization.k8s.io"}],
        })
    rbac.create_namespaced_role(NS, {
        "metadata": {"name": "pod-reader"},
        "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}],
    })
    rbac.create_namespaced_role_binding(NS, {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "User", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"}],
    })
    for i in range(100):
        core.create_namespaced_pod(NS, {"metadata": {"name": f"p-{i}"},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})


def percentile(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--roles", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="portal-bench-rbac-") as tmp:
        tokens = pathlib.Path(tmp) / "tokens.csv"
        tokens.write_text('reader-token,reader,u-reader,"group-1,group-2,group-3"\n')
        data = pathlib.Path(tmp) / "data"
        data.mkdir()
        portal = Portal(data, ["--token-auth-file", str(tokens)]).start()
        try:
            fill(portal, args.roles)
            admin = client.CoreV1Api(api_for(portal, portal.token))
            reader = client.CoreV1Api(api_for(portal, "reader-token"))
            times = {"admin": [], "rbac": []}
            for who, api in (("admin", admin), ("rbac", reader)):  # warm up both paths
                for _ in range(50):
                    assert len(api.list_namespaced_pod(NS, _preload_content=False).data) > 0
            for i in range(args.requests):
                for who, api in ((("admin", admin), ("rbac", reader)) if i % 2 else (("rbac", reader), ("admin", admin))):
                    started = time.perf_counter()
                    api.list_namespaced_pod(NS, _preload_content=False).data
                    times[who].append(time.perf_counter() - started)
        finally:
            portal.stop()
    p50 = {who: statistics.median(t) * 1000 for who, t in times.items()}
    p99 = {who: percentile(t, 0.99) * 1000 for who, t in times.items()}
    table = (
        f"| list of 100 pods, {args.requests} each, interleaved | p50 | p99 |\n|---|---|---|\n"
        f"| admin (`system:masters`, anchor) | {p50['admin']:.2f} ms | {p99['admin']:.2f} ms |\n"
        f"| RBAC user ({args.roles} Roles and RoleBindings in the cluster) | {p50['rbac']:.2f} ms | {p99['rbac']:.2f} ms |\n"
        f"| ratio RBAC / admin | **{p50['rbac'] / p50['admin']:.3f}×** | {p99['rbac'] / p99['admin']:.3f}× |\n"
    )
    out = os.environ.get("BENCH_OUT")
    if out:
        pathlib.Path(out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
