"""Stock kubectl against Portal: every kubectl the machine has (KUBECTLS:
the machine's and, when `scripts/setup` unpacked it, Debian's kubectl
1.20), run against one server with a cache directory of its own."""

import json
import os
import pathlib
import subprocess
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[3]


def available_kubectls():
    found = []
    for candidate in ["/usr/bin/kubectl", "kubectl"]:
        path = candidate if os.path.isabs(candidate) else next(
            (str(pathlib.Path(d) / candidate) for d in os.environ.get("PATH", "").split(":") if (pathlib.Path(d) / candidate).exists()),
            None,
        )
        if path and os.path.exists(path):
            found.append(path)
            break
    old = ROOT / ".cache" / "kubectl-1.20" / "usr" / "bin" / "kubectl"
    if old.exists():
        found.append(str(old))
    return found


KUBECTLS = available_kubectls()


class Kubectl:
    def __init__(self, binary, portal, tmp_path):
        self.binary = binary
        self.portal = portal
        self.tmp = tmp_path
        self.cache = tmp_path / "kube-cache"

    def __call__(self, *args, input=None, check=True, env=None):
        command = [self.binary, "--kubeconfig", self.portal.kubeconfig, "--cache-dir", str(self.cache), *args]
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        return result

    def out(self, *args, **kwargs):
        return self(*args, **kwargs).stdout

    def run_to_completion(self, name, image, *command, timeout=120):
        """`kubectl run` of a pod (named `name-<random>`) that runs `command`
        once; its whole output, read from its log once it has finished
        (`kubectl run -i` loses what a quick command prints before kubectl
        attaches). The pod is deleted afterwards."""
        from support.waiting import wait_for
        name = f"{name}-{uuid.uuid4().hex[:6]}"
        self("run", name, f"--image={image}", "--restart=Never", "--", *command)
        try:
            wait_for(lambda: self.out("get", "pod", name, "-o", "jsonpath={.status.phase}") in ("Succeeded", "Failed"),
                     f"pod {name} to finish", timeout=timeout, interval=0.2)
            return self.out("logs", name)
        finally:
            self("delete", "pod", name, "--grace-period=0", "--wait=false", check=False)

    def json(self, *args):
        return json.loads(self.out(*args, "-o", "json"))

    def apply(self, text):
        path = self.tmp / "manifest.yaml"
        path.write_text(text)
        return self.out("apply", "-f", str(path))


def client_minor(binary):
    out = subprocess.run([binary, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30).stdout
    return int("".join(c for c in json.loads(out)["clientVersion"]["minor"] if c.isdigit()))
