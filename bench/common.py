"""What the benches share: percentiles, and a pod's network namespace on
a node of the e2e cluster bed (tests/e2e/support/cluster_bed.py)."""

from support import agent_bed
from support.cluster_bed import NAMES


def percentile(values, p):
    """The nearest-rank `p`th percentile of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def pod_netns(bed, pod, node_index):
    """The network namespace (under /run/netns) of `pod` on bed node `node_index`."""
    tag = agent_bed.agent_tag(bed.agent_dir(node_index), NAMES[node_index])
    return f"portal-{tag}-{pod.metadata.uid}"
