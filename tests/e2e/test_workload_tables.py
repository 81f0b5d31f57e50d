"""Every workload kind of issue 27 through stock kubectl without a node:
`kubectl get all` lists them with their columns and `kubectl describe`
shows each (Deployment, ReplicaSet, DaemonSet, StatefulSet,
ControllerRevision, Job, CronJob, PodDisruptionBudget). kubectl 1.32 only: 1.20's CronJob
describer asks for `batch/v1beta1`, which is not served."""

from support.kubectl import KUBECTLS, Kubectl
from support.waiting import wait_for

MANIFESTS = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: a, image: registry.local/web:1}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 0
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: d, image: registry.local/db:1}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "*/5 * * * *"
  jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: t, image: registry.local/web:1}]}}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
"""


def test_get_all_and_describe_every_workload_kind(portal, tmp_path):
    kubectl = Kubectl(KUBECTLS[0], portal, tmp_path)
    kubectl.out("create", "deployment", "web", "--image=registry.local/web:1")
    kubectl.apply(MANIFESTS)
    kubectl.out("create", "job", "once", "--image=registry.local/web:1")
    # The controllers have made the ReplicaSet and the revision.
    wait_for(lambda: "web-" in kubectl.out("get", "rs") and "agent-" in (revisions := kubectl.out("get", "controllerrevisions"))
             and "db-" in revisions,
             "the ReplicaSet and the ControllerRevision")
    everything = kubectl.out("get", "all")
    for header in ["deployment.apps/web", "replicaset.apps/web-", "daemonset.apps/agent", "statefulset.apps/db",
                   "job.batch/once", "cronjob.batch/tick"]:
        assert header in everything, everything
    assert "NODE SELECTOR" in everything and "COMPLETIONS" in everything and "LAST SCHEDULE" in everything
    expected = {
        "deployment/web": "StrategyType:           RollingUpdate",
        "replicaset": "Controlled By:  Deployment/web",
        "daemonset/agent": "Desired Number of Nodes Scheduled: 0",
        "sts/db": "Update Strategy:    RollingUpdate",
        "job/once": "Completion Mode:  NonIndexed",
        "cronjob/tick": "Schedule:                      */5 * * * *",
        "pdb/web": "Min available:  1",
        "controllerrevision": "controller-revision-hash=",
    }
    for what, line in expected.items():
        out = kubectl.out("describe", what)
        assert line in out, f"describe {what}:\n{out}"
