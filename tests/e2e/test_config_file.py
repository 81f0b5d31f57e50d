"""The configuration file (issue 34), as k3s's: every flag of a command by
its long name in YAML, from `--config FILE` or `$PORTAL_CONFIG_FILE`; the
command line wins; a misspelt key stops the start with its name."""

import base64
import json
import os
import pathlib
import ssl
import subprocess
import urllib.error
import urllib.request

from conftest import BINARY, Portal


def service_ip(server):
    core = server.core()
    created = core.create_namespaced_service("default", {"metadata": {"name": "probe"}, "spec": {"ports": [{"port": 80}]}})
    return created.spec.cluster_ip


def test_flags_from_the_file_and_the_command_line_wins(data_dir):
    config = data_dir / "config.yaml"
    config.write_text(
        "# as /etc/portal/config.yaml would hold it\n"
        "service-cluster-ip-range: 10.55.0.0/16\n"
        "service-node-port-range: 31000-31100\n"
        "api-bind: 127.0.0.1:1\n"  # the command line's (Portal's :0) wins
        "api-audiences: [first.example, second.example]\n"  # a list
        "anonymous-auth: false\n"  # a flag taking true/false
        "kubeconfig: /not/used/by/server\n"  # `portal proxy`'s and others': left out
    )
    server = Portal(data_dir, ["--config", str(config)]).start()
    try:
        assert service_ip(server).startswith("10.55."), "the file's range"
        node_port = server.core().create_namespaced_service(
            "default", {"metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}
        ).spec.ports[0].node_port
        assert 31000 <= node_port <= 31100
        # Tokens are for the file's audiences.
        token = subprocess.run(["kubectl", "--kubeconfig", server.kubeconfig, "create", "token", "default"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        assert claims["aud"] == ["first.example", "second.example"], claims
        # No anonymous requests: 401, not the 200 of /version.
        address = server.api_client().configuration.host
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            urllib.request.urlopen(f"{address}/version", context=context, timeout=10)
            raise AssertionError("an anonymous request was served")
        except urllib.error.HTTPError as error:
            assert error.code == 401
    finally:
        server.stop()


def test_the_file_named_by_the_environment(data_dir):
    config = data_dir / "env.yaml"
    config.write_text("service-cluster-ip-range: 10.66.0.0/16\n")
    os.environ["PORTAL_CONFIG_FILE"] = str(config)
    try:
        server = Portal(data_dir).start()
    finally:
        del os.environ["PORTAL_CONFIG_FILE"]
    try:
        assert service_ip(server).startswith("10.66.")
    finally:
        server.stop()


def test_a_misspelt_setting_stops_the_start(data_dir):
    config = data_dir / "bad.yaml"
    config.write_text("servce-cluster-ip-range: 10.77.0.0/16\n")
    result = subprocess.run(
        [BINARY, "server", "--config", str(config), "--data-dir", str(data_dir), "--disable", "agent,proxy"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode != 0
    assert "`servce-cluster-ip-range` is not a flag of any portal command" in result.stderr, result.stderr


def test_the_systemd_unit_in_docs_is_valid(tmp_path):
    """docs/systemd/portal.service: systemd accepts it, its command runs
    on the configuration file, and stopping it leaves the containers."""
    unit = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "systemd" / "portal.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["KillMode"] == "process"
    command = settings["ExecStart"].split()
    assert command[1:] == ["server"], command
    # The unit's command line, with the binary under test, parses.
    help_text = subprocess.run([BINARY, *command[1:], "--help"], capture_output=True, text=True, timeout=30)
    assert help_text.returncode == 0 and "--config <FILE>" in help_text.stdout
    copy = tmp_path / "portal.service"
    copy.write_text(unit.replace(settings["ExecStart"], f"{BINARY} server"))
    verified = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stderr
