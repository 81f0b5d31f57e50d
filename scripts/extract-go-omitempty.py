#!/usr/bin/env python3
"""Writes scripts/data/go-omitempty.json: for every Kubernetes API struct, the
JSON names of the fields whose zero value Go's JSON encoder leaves out but
Go's protobuf encoder still sends.

Why: kubectl sends protobuf bodies, which Portal turns into JSON. The gogo
marshallers in k8s.io/api (generated.pb.go) write every non-pointer scalar
field (bool, string, intN, floatN and named types over them such as
`type Protocol string`) even when it is zero, and pointer fields (`*bool`,
`*int32`, ...) only when non-nil. encoding/json drops a zero value only when
the field's json tag says `omitempty`. So, to produce the JSON Kubernetes
itself would, Portal must drop a decoded false / 0 / 0.0 / "" exactly for
fields that are (a) not pointers, (b) scalars or named scalars, (c) tagged
`omitempty` -- the fields this file lists. Pointer zeros are kept; fields
without `omitempty` always appear.

Output: `{"io.k8s.api.core.v1.Container": ["image", ...], ...}`, keys are
OpenAPI definition names (Go import path with `k8s.io/` -> `io.k8s.`, `/` ->
`.`, plus the type name), sorted, each list sorted. Structs with no such field
are left out. Fields of an embedded `json:",inline"` struct are listed under
the embedded type's own name, not the embedder's.

Generated from the tags v0.33.0 (Kubernetes v1.33.0) of k8s.io/api
(82c0029eaa2f5bdbfbbbce9305349a893e6c86dc), k8s.io/apimachinery
(955939ffb8198b47fe11e4e53121d529ee6f946b) and k8s.io/apiextensions-apiserver
(1b7ab0f38c5b874936fb6cea84d68632bdd5ee44). To regenerate:

    for r in api apimachinery apiextensions-apiserver; do
      git clone -q --depth 1 --branch v0.33.0 \\
        https://github.com/kubernetes/$r /tmp/k8s/$r; done
    python3 scripts/extract-go-omitempty.py /tmp/k8s/api /tmp/k8s/apimachinery \\
      /tmp/k8s/apiextensions-apiserver > scripts/data/go-omitempty.json

Each argument is the root of one module checkout (its go.mod names it). The
parser is line-based and relies on gofmt'd source.
"""

import json
import re
import sys
from pathlib import Path

# Package directories read, per module. k8s.io/apimachinery/pkg/types is read
# only for its named scalars (types.UID, types.NodeName, ...).
PACKAGES = {
    "k8s.io/api": [g + "/v1" for g in (
        "core apps batch policy autoscaling discovery coordination networking "
        "rbac storage events scheduling node certificates admissionregistration "
        "authentication authorization flowcontrol").split()] + ["autoscaling/v2"],
    "k8s.io/apimachinery": ["pkg/apis/meta/v1", "pkg/runtime", "pkg/util/intstr",
                            "pkg/api/resource", "pkg/version", "pkg/types"],
    "k8s.io/apiextensions-apiserver": ["pkg/apis/apiextensions/v1"],
}
SCALARS = set("bool string byte rune int int8 int16 int32 int64 uint uint8 "
              "uint16 uint32 uint64 uintptr float32 float64".split())
SKIP = re.compile(r"(_test|generated.*|\.pb)\.go$")


def strip_comments(src):
    """Removes // and /* */ comments, leaving string, raw-string and rune
    literals (struct tags included) untouched."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            out.append("\n" * src.count("\n", i, j))
            i = j + 2
        elif c in "\"'`":
            j = i + 1
            while src[j] != c:
                j += 2 if c != "`" and src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def imports(src, modpkg):
    """Maps each import's name (alias or last path element) to its path."""
    names = {"": modpkg}
    block = re.search(r"^import \((.*?)^\)", src, re.M | re.S)
    lines = block.group(1).splitlines() if block else []
    lines += re.findall(r"^import (.*)$", src, re.M)
    for line in lines:
        m = re.match(r'\s*(\w+\s+)?"([^"]+)"', line)
        if m:
            names[(m.group(1) or m.group(2).rsplit("/", 1)[-1]).strip()] = m.group(2)
    return names


def type_decls(src):
    """Yields (name, rest-of-line, following lines) for each top-level type,
    including those in `type ( ... )` groups."""
    lines = src.splitlines()
    group = False
    for i, line in enumerate(lines):
        if line.startswith("type ("):
            group = True
        elif group and line.startswith(")"):
            group = False
        m = re.match(r"type (\w+)\s+(.*)$", line) or (
            group and re.match(r"\t(\w+)\s+(.*)$", line))
        if m:
            yield m.group(1), m.group(2).lstrip("= ").strip(), lines[i + 1:]


def struct_fields(body):
    """Yields (names, type, tag) for the fields of a struct whose `{` ended
    the previous line; nested anonymous structs become type `struct`."""
    depth = 0
    for line in body:
        line = line.strip()
        if depth == 0 and line.startswith("}"):
            return
        opened = line.count("{") - line.count("}")
        if depth == 0 and line:
            tag = re.search(r"`([^`]*)`\s*$", line)
            decl = line[:tag.start()] if tag else line
            decl = re.sub(r"struct\s*\{.*", "struct", decl).strip()
            m = re.match(r"([\w, ]+?)\s+(\S+)$", decl)
            names, typ = ([n.strip() for n in m.group(1).split(",")], m.group(2)) \
                if m and not decl.startswith("*") else ([], decl)  # [] = embedded
            yield names, typ, tag.group(1) if tag else ""
        depth += opened


def main(roots):
    structs = {}   # (pkg, Name) -> [(json name, type, import map)]
    named = {}     # (pkg, Name) -> (underlying type, import map)
    for root in map(Path, roots):
        module = re.search(r"^module (\S+)", (root / "go.mod").read_text(), re.M).group(1)
        for sub in PACKAGES[module]:
            pkg = f"{module}/{sub}"
            for path in sorted((root / sub).glob("*.go")):
                if SKIP.search(path.name):
                    continue
                src = strip_comments(path.read_text())
                imp = imports(src, pkg)
                for name, rest, body in type_decls(src):
                    if not rest.startswith("struct"):
                        named[(pkg, name)] = (rest.split()[0], imp)
                        continue
                    fields = structs.setdefault((pkg, name), [])
                    if rest.startswith("struct{}") or not name[0].isupper():
                        continue
                    for names, typ, tag in struct_fields(body):
                        j = re.search(r'json:"([^"]*)"', tag)
                        jname, *opts = (j.group(1) if j else "").split(",")
                        if not names and jname and not typ.startswith("*"):
                            names = [typ.rsplit(".", 1)[-1]]  # embedded, named by tag
                        if not names or jname == "-":  # inlined, or ignored
                            continue
                        for n in filter(lambda n: n[0].isupper(), names):
                            if "omitempty" in opts:
                                fields.append((jname or n, typ, imp))

    def scalar(typ, imp, seen=()):
        if typ in SCALARS:
            return True
        m = re.fullmatch(r"(?:(\w+)\.)?(\w+)", typ)
        key = m and (imp.get(m.group(1) or ""), m.group(2))
        if not m or key in seen:
            return False
        if key not in named and key not in structs and typ != "struct":
            print(f"warning: unknown type {typ} ({key[0]}), taken as non-scalar",
                  file=sys.stderr)
        return key in named and scalar(*named[key], seen + (key,))

    out = {}
    for (pkg, name), fields in structs.items():
        keep = sorted({j for j, typ, imp in fields if scalar(typ, imp)})
        if keep:
            out["io.k8s." + pkg[len("k8s.io/"):].replace("/", ".") + "." + name] = keep
    json.dump(dict(sorted(out.items())), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
