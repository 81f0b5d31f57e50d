"""What the end-to-end tests share: waiting on observable signals
(`waiting`), talking to the API (`api`), kubectl (`kubectl`), the metrics
the processes serve (`metrics`), and the test beds they build (network
namespaces: `nodes`, `lan`; nodes running pods: `agent_bed`; registries:
`registry`; etcd clusters: `etcd`). Test files import from here, never
from each other."""
