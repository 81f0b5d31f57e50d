"""What the end-to-end tests share: waiting on observable signals
(`waiting`), talking to the API (`api`), and the test beds they build
(network namespaces, nodes, registries, etcd clusters). Test files import
from here, never from each other."""
