"""Reading Prometheus metrics the processes under test serve: the API
server's /metrics (with the proxy's and the node agent's, in `portal
server`), or a `portal agent` / `portal node` metrics address. Tests wait
on these counters (a sync done, a request seen) instead of sleeping."""

import re
import ssl
import urllib.request

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(portal):
    """The API server's /metrics text (its CA is not checked: loopback)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(portal.server + "/metrics", headers={"Authorization": f"Bearer {portal.token}"})
    return urllib.request.urlopen(request, context=context, timeout=10).read().decode()


def scrape_url(url):
    """A plain-HTTP metrics endpoint (`portal agent --metrics-bind`, …)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(url, timeout=10).read().decode()


def value(text, name, **labels):
    """The sum of the samples of `name` whose labels include `labels`; None
    when there is none (the metric is not registered yet)."""
    total = None
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        have = dict(_LABEL.findall(match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total = (total or 0) + float(match.group(3))
    return total


def proxy_syncs(portal):
    """How many proxy syncs this server process has completed."""
    return int(value(scrape(portal), "kubeproxy_sync_proxy_rules_duration_seconds_count") or 0)
