"""Objects survive restarts and kill -9 (issue 2: "objects survive")."""

import http.client
import json
import ssl
import threading
import urllib.parse

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from conftest import Portal
from support.api import portal_ca, service
from support.waiting import wait_for


def test_restart_keeps_objects_and_versions(data_dir):
    portal = Portal(data_dir).start()
    core = portal.core()
    before = {}
    for i in range(20):
        created = core.create_namespaced_service("default", service(f"r{i}", {"i": str(i)}))
        before[created.metadata.name] = (created.metadata.uid, created.metadata.resource_version)
    list_rv = core.list_namespaced_service("default").metadata.resource_version
    core.delete_namespaced_service("r0", "default")
    after_delete = core.read_namespaced_service("r1", "default")
    after_delete.metadata.labels = {"changed": "yes"}
    core.replace_namespaced_service("r1", "default", after_delete)
    portal.stop()

    portal.start()
    core = portal.core()
    after = {s.metadata.name: (s.metadata.uid, s.metadata.resource_version) for s in core.list_namespaced_service("default").items}
    assert "r0" not in after
    for name, (uid, rv) in before.items():
        if name in ("r0", "r1"):
            continue
        assert after[name] == (uid, rv), name
    assert int(after["r1"][1]) > int(before["r1"][1])

    # A watch from before the restart replays what happened since.
    events = []
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_service, "default", resource_version=list_rv, timeout_seconds=10):
        events.append((event["type"], event["object"].metadata.name))
        if len(events) == 2:
            w.stop()
    assert events == [("DELETED", "r0"), ("MODIFIED", "r1")]
    portal.stop()


def test_watch_before_history_is_410(data_dir):
    portal = Portal(data_dir, ["--history-revisions", "5"]).start()
    core = portal.core()
    first = core.create_namespaced_service("default", service("h0")).metadata.resource_version
    for i in range(1, 30):
        core.create_namespaced_service("default", service(f"h{i}"))
    portal.stop()
    portal.start()
    core = portal.core()
    with pytest.raises(ApiException) as exc:
        for _ in watch.Watch().stream(core.list_namespaced_service, "default", resource_version=first, timeout_seconds=5):
            pass
    assert exc.value.status == 410
    portal.stop()


class Writer(threading.Thread):
    """Creates objects as fast as it can and remembers what was acknowledged."""

    def __init__(self, portal, index, stop):
        super().__init__(daemon=True)
        self.index = index
        self.stop_event = stop
        self.acknowledged = []
        url = urllib.parse.urlparse(portal.server)
        self.host, self.port = url.hostname, url.port
        self.context = ssl.create_default_context()
        self.context.load_verify_locations(cadata=portal_ca(portal))
        self.headers = {"Authorization": f"Bearer {portal.token}", "Content-Type": "application/json"}

    def run(self):
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=10)
        n = 0
        while not self.stop_event.is_set():
            name = f"w{self.index}-{n}"
            body = json.dumps({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}})
            try:
                conn.request("POST", "/api/v1/namespaces/default/services", body, self.headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                return  # the server died: this write was never acknowledged
            if response.status == 201:
                self.acknowledged.append(name)
            n += 1


@pytest.mark.parametrize("round_", range(10))
def test_kill_9_loses_no_acknowledged_write(data_dir, round_):
    portal = Portal(data_dir).start()
    stop = threading.Event()
    writers = [Writer(portal, i, stop) for i in range(16)]
    for w in writers:
        w.start()
    # Each round kills at another point of the write stream: once the
    # writers have had more writes acknowledged than in the round before.
    wanted = 50 * (round_ + 1)
    wait_for(lambda: sum(len(w.acknowledged) for w in writers) >= wanted, f"{wanted} acknowledged writes")
    portal.kill()
    stop.set()
    for w in writers:
        w.join(10)
    acknowledged = {name for w in writers for name in w.acknowledged}
    assert acknowledged, "the writers got nothing done before the kill"
    print(f"round {round_}: {len(acknowledged)} acknowledged writes before kill -9")

    portal.start()
    stored = {s.metadata.name for s in portal.core().list_namespaced_service("default").items}
    missing = acknowledged - stored
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:5]}"
    # The store is usable after the crash.
    portal.core().create_namespaced_service("default", service("after-crash"))
    portal.stop()
