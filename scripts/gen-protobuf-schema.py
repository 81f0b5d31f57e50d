#!/usr/bin/env python3
"""Writes crates/portal-api/src/protobuf/schema.rs: the protobuf layout of
every message the served kinds are made of (field numbers and wire types,
from the `k8s-pb` crate Portal depends on) joined to the JSON field names
(from `k8s-openapi`, whose deserializers name them exactly: `clusterIP`,
`hostIPC`, `Port`). Run it again after upgrading either crate:

    python3 scripts/gen-protobuf-schema.py          (--check: fail if stale)

The generic decoder in `protobuf/mod.rs` reads Kubernetes protobuf bodies
with this table, for every kind, without a hand-written conversion each.
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "crates/portal-api/src/protobuf/schema.rs"
# The served kinds' messages, by OpenAPI name (as `portal-api/src/kinds`).
ROOTS = [
    "io.k8s.api.core.v1.Namespace",
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.core.v1.Service",
    "io.k8s.api.core.v1.Endpoints",
    "io.k8s.api.core.v1.ReplicationController",
    "io.k8s.api.core.v1.Node",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.ServiceAccount",
    "io.k8s.api.core.v1.PersistentVolume",
    "io.k8s.api.core.v1.PersistentVolumeClaim",
    "io.k8s.api.storage.v1.StorageClass",
    "io.k8s.api.core.v1.Event",
    "io.k8s.api.discovery.v1.EndpointSlice",
    "io.k8s.api.coordination.v1.Lease",
    "io.k8s.api.apps.v1.ReplicaSet",
    "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.apps.v1.DaemonSet",
    "io.k8s.api.apps.v1.StatefulSet",
    "io.k8s.api.apps.v1.ControllerRevision",
    "io.k8s.api.batch.v1.Job",
    "io.k8s.api.batch.v1.CronJob",
    "io.k8s.api.policy.v1.PodDisruptionBudget",
    "io.k8s.api.networking.v1.NetworkPolicy",
    "io.k8s.api.networking.v1.ServiceCIDR",
    "io.k8s.api.networking.v1.IPAddress",
    "io.k8s.api.networking.v1.Ingress",
    "io.k8s.api.networking.v1.IngressClass",
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler",
    "io.k8s.api.autoscaling.v1.HorizontalPodAutoscaler",
    "io.k8s.api.rbac.v1.Role",
    "io.k8s.api.rbac.v1.ClusterRole",
    "io.k8s.api.rbac.v1.RoleBinding",
    "io.k8s.api.rbac.v1.ClusterRoleBinding",
    "io.k8s.api.certificates.v1.CertificateSigningRequest",
    "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicy",
    "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicyBinding",
    "io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration",
    "io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration",
    # Request bodies that are not stored.
    "io.k8s.api.authentication.v1.TokenRequest",
    "io.k8s.api.authentication.v1.TokenReview",
    "io.k8s.api.authentication.v1.SelfSubjectReview",
    "io.k8s.api.authorization.v1.SubjectAccessReview",
    "io.k8s.api.authorization.v1.SelfSubjectAccessReview",
    "io.k8s.api.authorization.v1.LocalSubjectAccessReview",
    "io.k8s.api.authorization.v1.SelfSubjectRulesReview",
    "io.k8s.api.policy.v1.Eviction",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
]
# Messages with a JSON form of their own, decoded by hand in `protobuf/mod.rs`.
SPECIAL = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    "io.k8s.apimachinery.pkg.runtime.RawExtension",
}
SCALARS = {"string", "bool", "int32", "int64", "uint32", "uint64", "double", "float", "bytes"}


def package_dir(name):
    meta = json.loads(subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--locked"], cwd=ROOT))
    for package in meta["packages"]:
        if package["name"] == name:
            return pathlib.Path(package["manifest_path"]).parent
    sys.exit(f"{name} is not a dependency")


def openapi_name(module):
    """`api::core::v1` → `io.k8s.api.core.v1` (apimachinery likewise)."""
    return "io.k8s." + ".".join(module)


def prost_messages(src):
    """{openapi name: [(tag, rust field, kind, label, target)]} from k8s-pb."""
    messages = {}
    for path in src.rglob("mod.rs"):
        module = list(path.relative_to(src).parent.parts)
        text = path.read_text()
        for struct in re.finditer(r"pub struct (\w+) \{(.*?)\n\}", text, re.S):
            name, body = struct.groups()
            fields = []
            for field in re.finditer(r"#\[prost\(([^\]]*)\)\]\s*pub (r#)?(\w+):", body, re.S):
                attrs, _, rust_name = field.groups()
                rust_type = field_type(body, field.end())
                tag = int(re.search(r'tag = "(\d+)"', attrs).group(1))
                rust_type = re.sub(r"\s+", "", rust_type).replace(",>", ">")
                label = "repeated" if "repeated" in attrs else "optional"
                map_match = re.match(r'(btree_map|map)\s*=\s*"(\w+),\s*(\w+)"', attrs)
                if map_match:
                    value_kind = map_match.group(3)
                    target = resolve(module, rust_type[rust_type.index("<") + 1 : -1].split(",")[-1]) if value_kind == "message" else None
                    fields.append((tag, rust_name, "map_" + value_kind, "map", target))
                    continue
                kind = attrs.split(",")[0].strip().split()[0]
                if kind.startswith("bytes"):
                    kind = "bytes"
                target = None
                if kind == "message":
                    inner = re.search(r"(?:Option|Vec)<(.*)>$", rust_type).group(1)
                    target = resolve(module, inner)
                elif kind not in SCALARS:
                    sys.exit(f"unknown field kind {kind} in {name}.{rust_name}")
                fields.append((tag, rust_name, kind, label, target))
            messages[f"{openapi_name(module)}.{name}"] = fields
    return messages


def field_type(text, start):
    """The Rust type from `start` to the first comma outside `<…>`."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "," and depth == 0:
            return text[start:i]
    return text[start:]


def resolve(module, rust_path):
    """A message type as written in `module` → its OpenAPI name."""
    rust_path = rust_path.replace("::prost::alloc::", "").strip(":")
    parts = rust_path.split("::")
    here = list(module)
    while parts and parts[0] == "super":
        parts.pop(0)
        here.pop()
    return openapi_name(here + parts[:-1]) + "." + parts[-1]


def json_names(src):
    """{openapi name: [json field names]} from k8s-openapi's deserializers."""
    names = {}
    for path in (src / "v1_33").rglob("*.rs"):
        text = path.read_text()
        schema = re.search(r'fn schema_name\(\)[^{]*\{\s*"([\w.]+)"\.into\(\)', text)
        if schema:
            names[schema.group(1)] = re.findall(r'"([^"]+)" => Field::Key_', text)
    return names


def flat(name):
    return name.replace("_", "").lower()


def main():
    # Fields whose zero value Go's JSON leaves out (see the data file's
    # generator, scripts/extract-go-omitempty.py).
    omit_zero = json.loads((ROOT / "scripts/data/go-omitempty.json").read_text())
    messages = prost_messages(package_dir("k8s-pb") / "src")
    fields_json = json_names(package_dir("k8s-openapi") / "src")
    # Struct names differ in case between the crates (`Aws…` / `AWS…`).
    by_lower = {name.lower(): fields for name, fields in fields_json.items()}
    # Fields k8s-pb has and the served Kubernetes version (k8s-openapi's
    # v1_33) does not: left out, so a body carrying them decodes as the
    # served version's JSON would (unknown fields skipped).
    skipped = []

    # Messages Go embeds in another (`ProbeHandler` in `Probe`) have no
    # JSON schema of their own: their fields are named in the embedder's.
    inherited = {}

    def known_names(name):
        return by_lower.get(name.lower(), inherited.get(name))

    def json_name(name, rust_name, kind, target):
        known = known_names(name)
        if known is None:
            return None
        matches = [j for j in known if flat(j) == flat(rust_name)]
        target_fields = [flat(r) for (_, r, _, _, _) in messages.get(target, [])]
        if not matches and kind == "message" and (
            target.lower() in by_lower or (target_fields and all(any(flat(j) == f for j in known) for f in target_fields[:1]))
        ):
            # An embedded Go struct (`json:",inline"`): its fields are the
            # parent's in JSON. Written as an empty name.
            return ""
        if len(matches) > 1:
            sys.exit(f"{name}.{rust_name}: ambiguous JSON name {matches}")
        return matches[0] if matches else None

    wanted, fields, queue = [], {}, list(ROOTS)
    while queue:
        name = queue.pop()
        if name in wanted:
            continue
        if name not in messages:
            sys.exit(f"{name} is not in k8s-pb")
        wanted.append(name)
        fields[name] = []
        if name in SPECIAL:
            continue
        for tag, rust_name, kind, label, target in messages[name]:
            json_field = json_name(name, rust_name, kind, target or "")
            if json_field is None:
                skipped.append(f"{name}.{rust_name}")
                continue
            fields[name].append((tag, json_field, kind, label, target))
            if json_field == "" and target.lower() not in by_lower:
                inherited[target] = known_names(name)
            if target:
                queue.append(target)
    wanted.sort()
    index = {name: i for i, name in enumerate(wanted)}
    lines = [
        "//! Generated by `scripts/gen-protobuf-schema.py` from the `k8s-pb` and",
        "//! `k8s-openapi` crates: the protobuf layout of every message the served",
        "//! kinds are made of, with each field's JSON name (empty: an embedded",
        "//! struct whose fields are the parent's) and whether Go's JSON leaves",
        "//! out its zero value (`scripts/data/go-omitempty.json`). Do not edit by",
        "//! hand.",
        "",
        "use super::{Field, Message, Type};",
        "",
        "pub(super) static MESSAGES: &[Message] = &[",
    ]
    for name in wanted:
        lines.append(f"    Message {{ name: {json.dumps(name)}, fields: &[")
        for tag, json_field, kind, label, target in sorted(fields[name]):
            if kind == "message":
                ty = f"Type::Message({index[target]})"
            elif kind == "map_message":
                ty = f"Type::MapOf({index[target]})"
            elif kind == "map_string":
                ty = "Type::MapOfStrings"
            elif kind == "map_bytes":
                ty = "Type::MapOfBytes"
            else:
                ty = f"Type::{kind.capitalize()}"
            repeated = "true" if label == "repeated" else "false"
            omits = "true" if json_field in omit_zero.get(name, []) else "false"
            lines.append(
                f"        Field {{ tag: {tag}, json: {json.dumps(json_field)}, ty: {ty}, repeated: {repeated}, omit_zero: {omits} }},"
            )
        lines.append("    ] },")
    lines.append("];")
    lines.append("")
    lines.append("// Left out (newer than the served Kubernetes version):")
    lines.extend(f"// - {field}" for field in sorted(skipped))
    lines.append("")
    lines.append("/// The served kinds' messages (index into [`MESSAGES`]), by OpenAPI name.")
    lines.append("pub(super) static KINDS: &[(&str, usize)] = &[")
    for name in ROOTS:
        lines.append(f"    ({json.dumps(name)}, {index[name]}),")
    lines.append("];")
    text = "\n".join(lines) + "\n"
    # Formatted as `cargo fmt` leaves it, so the check compares like with like.
    text = subprocess.run(
        ["rustfmt", "--edition", "2021", "--emit", "stdout", "--config-path", str(ROOT)],
        input=text, capture_output=True, text=True, check=True,
    ).stdout
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            sys.exit(f"{OUT.relative_to(ROOT)} is stale: run scripts/gen-protobuf-schema.py")
        return
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(wanted)} messages, {len(skipped)} newer fields left out")


if __name__ == "__main__":
    main()
