"""ValidatingAdmissionPolicies (issue 30): CEL checks of writes where a
binding applies them — Deployments of more than 5 replicas refused in
namespaces labelled env=prod, in upstream's words; Warn as a warning;
parameters from a ConfigMap; match conditions and variables; reasons and
message expressions; failure policies; subresources matched only when
named; policies that do not compile refused."""

import json
import subprocess
import textwrap

import pytest

from conftest import Portal

POLICY = textwrap.dedent("""\
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingAdmissionPolicy
    metadata: {name: max-replicas}
    spec:
      failurePolicy: Fail
      matchConstraints:
        resourceRules:
        - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}
      validations:
      - expression: "object.spec.replicas <= 5"
    ---
    apiVersion: admissionregistration.k8s.io/v1
    kind: ValidatingAdmissionPolicyBinding
    metadata: {name: max-replicas-prod}
    spec:
      policyName: max-replicas
      validationActions: [Deny]
      matchResources:
        namespaceSelector:
          matchLabels: {env: prod}
    """)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    portal = Portal(tmp_path_factory.mktemp("admission-policies")).start()
    yield portal
    portal.stop()


def kubectl(portal, *args, check=True, stdin=None):
    result = subprocess.run(["kubectl", "--kubeconfig", portal.kubeconfig, *args], capture_output=True, text=True,
                            timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def namespace(portal, name, **labels):
    kubectl(portal, "create", "namespace", name)
    if labels:
        kubectl(portal, "label", "namespace", name, *[f"{k}={v}" for k, v in labels.items()])


def test_deployments_over_five_replicas_are_refused_in_prod(api):
    kubectl(api, "apply", "-f", "-", stdin=POLICY)
    namespace(api, "prod", env="prod")
    namespace(api, "dev", env="dev")
    refused = kubectl(api, "-n", "prod", "create", "deployment", "web", "--image=nginx", "--replicas=7", check=False)
    assert refused.returncode != 0
    assert ('deployments.apps "web" is invalid: : ValidatingAdmissionPolicy \'max-replicas\' with binding '
            "'max-replicas-prod' denied request: failed expression: object.spec.replicas <= 5") in refused.stderr
    kubectl(api, "-n", "dev", "create", "deployment", "web", "--image=nginx", "--replicas=7")
    kubectl(api, "-n", "prod", "create", "deployment", "small", "--image=nginx", "--replicas=3")
    grow = kubectl(api, "-n", "prod", "patch", "deployment", "small", "-p", '{"spec":{"replicas":8}}', check=False)
    assert 'The deployments "small" is invalid' in grow.stderr, grow.stderr
    # `kubectl scale` writes the scale subresource, which the rule does not
    # name (as upstream: policies name deployments/scale to cover it).
    kubectl(api, "-n", "prod", "scale", "deployment", "small", "--replicas=6")
    scaled = json.loads(kubectl(api, "-n", "prod", "get", "deployment", "small", "-o", "json",
                                "--show-managed-fields").stdout)
    assert scaled["spec"]["replicas"] == 6
    assert any(m.get("subresource") == "scale" for m in scaled["metadata"]["managedFields"])
    # Labelled prod later: the namespace's labels count at each write.
    kubectl(api, "label", "namespace", "dev", "env=prod", "--overwrite")
    refused = kubectl(api, "-n", "dev", "create", "deployment", "other", "--image=nginx", "--replicas=9", check=False)
    assert "denied request" in refused.stderr


def test_warnings_params_conditions_and_reasons(api):
    kubectl(api, "create", "namespace", "shop")
    kubectl(api, "-n", "shop", "create", "configmap", "limits", "--from-literal=maxReplicas=2")
    policy = textwrap.dedent("""\
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicy
        metadata: {name: limits}
        spec:
          paramKind: {apiVersion: v1, kind: ConfigMap}
          matchConstraints:
            resourceRules:
            - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}
          matchConditions:
          - {name: not-exempt, expression: "!has(object.metadata.labels) || !('exempt' in object.metadata.labels)"}
          variables:
          - {name: limit, expression: "int(params.data.maxReplicas)"}
          validations:
          - expression: "object.spec.replicas <= variables.limit"
            messageExpression: "'at most ' + string(variables.limit) + ' replicas, not ' + string(object.spec.replicas)"
          - expression: "object.metadata.name != 'forbidden'"
            reason: Forbidden
            message: that name is reserved
        ---
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicyBinding
        metadata: {name: limits-shop}
        spec:
          policyName: limits
          paramRef: {name: limits, namespace: shop}
          validationActions: [Warn]
          matchResources:
            namespaceSelector:
              matchLabels: {kubernetes.io/metadata.name: shop}
        """)
    kubectl(api, "apply", "-f", "-", stdin=policy)
    warned = kubectl(api, "-n", "shop", "create", "deployment", "big", "--image=nginx", "--replicas=4")
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'limits' with binding 'limits-shop': "
            "at most 2 replicas, not 4") in warned.stderr
    assert kubectl(api, "-n", "shop", "get", "deployment", "big").returncode == 0, "Warn does not refuse"
    # Deny instead: the reason chooses the status.
    kubectl(api, "patch", "validatingadmissionpolicybinding", "limits-shop", "--type=merge",
            "-p", '{"spec":{"validationActions":["Deny"]}}')
    forbidden = kubectl(api, "-n", "shop", "create", "deployment", "forbidden", "--image=nginx", check=False)
    assert ('deployments.apps "forbidden" is forbidden: ValidatingAdmissionPolicy \'limits\' with binding '
            "'limits-shop' denied request: that name is reserved") in forbidden.stderr
    # A match condition exempts; a parameter change applies at once.
    exempt = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "exempt", "labels": {"exempt": "yes", "app": "x"}},
              "spec": {"replicas": 9, "selector": {"matchLabels": {"app": "x"}},
                       "template": {"metadata": {"labels": {"app": "x"}},
                                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}
    kubectl(api, "-n", "shop", "apply", "-f", "-", stdin=json.dumps(exempt))
    kubectl(api, "-n", "shop", "patch", "configmap", "limits", "-p", '{"data":{"maxReplicas":"10"}}')
    kubectl(api, "-n", "shop", "create", "deployment", "bigger", "--image=nginx", "--replicas=9")
    # Without its parameters, the binding denies.
    kubectl(api, "-n", "shop", "delete", "configmap", "limits")
    missing = kubectl(api, "-n", "shop", "create", "deployment", "lost", "--image=nginx", check=False)
    assert "no params found for policy binding with `Deny` parameterNotFoundAction" in missing.stderr


def test_failure_policies_and_compilation(api):
    kubectl(api, "create", "namespace", "edge")
    broken = textwrap.dedent("""\
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicy
        metadata: {name: needs-team}
        spec:
          failurePolicy: Ignore
          matchConstraints:
            resourceRules:
            - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
          validations:
          - expression: "object.metadata.labels.team != ''"
        ---
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicyBinding
        metadata: {name: needs-team}
        spec:
          policyName: needs-team
          validationActions: [Deny]
          matchResources:
            namespaceSelector:
              matchLabels: {kubernetes.io/metadata.name: edge}
        """)
    kubectl(api, "apply", "-f", "-", stdin=broken)
    # No labels: the expression fails to evaluate; Ignore lets it through.
    kubectl(api, "-n", "edge", "create", "configmap", "unlabelled")
    kubectl(api, "patch", "validatingadmissionpolicy", "needs-team", "--type=merge",
            "-p", '{"spec":{"failurePolicy":"Fail"}}')
    refused = kubectl(api, "-n", "edge", "create", "configmap", "unlabelled-2", check=False)
    assert "expression 'object.metadata.labels.team != ''' resulted in error" in refused.stderr, refused.stderr
    bad = broken.split("---")[0].replace("labels.team != ''", "labels.team !=")
    refused = kubectl(api, "apply", "-f", "-", stdin=bad, check=False)
    assert "spec.validations[0].expression" in refused.stderr and "compilation failed" in refused.stderr
    both = kubectl(api, "patch", "validatingadmissionpolicybinding", "needs-team", "--type=merge",
                   "-p", '{"spec":{"validationActions":["Deny","Warn"]}}', check=False)
    assert "must not contain both Deny and Warn" in both.stderr


def test_deletes_are_admitted_too(api):
    policy = textwrap.dedent("""\
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicy
        metadata: {name: keep-protected}
        spec:
          matchConstraints:
            resourceRules:
            - {apiGroups: [""], apiVersions: [v1], operations: [DELETE], resources: [configmaps]}
          validations:
          - expression: "request.operation == 'DELETE' && object == null"
          - expression: "!has(oldObject.metadata.labels) || !('protected' in oldObject.metadata.labels)"
            messageExpression: "oldObject.metadata.name + ' is protected'"
            reason: Forbidden
        ---
        apiVersion: admissionregistration.k8s.io/v1
        kind: ValidatingAdmissionPolicyBinding
        metadata: {name: keep-protected}
        spec:
          policyName: keep-protected
          validationActions: [Deny]
        """)
    kubectl(api, "apply", "-f", "-", stdin=policy)
    kubectl(api, "create", "namespace", "vault")
    kubectl(api, "-n", "vault", "create", "configmap", "keys")
    kubectl(api, "-n", "vault", "label", "configmap", "keys", "protected=yes")
    kubectl(api, "-n", "vault", "create", "configmap", "scratch")
    refused = kubectl(api, "-n", "vault", "delete", "configmap", "keys", check=False)
    assert 'configmaps "keys" is forbidden: ValidatingAdmissionPolicy \'keep-protected\'' in refused.stderr, \
        refused.stderr
    assert "keys is protected" in refused.stderr
    kubectl(api, "-n", "vault", "delete", "configmap", "scratch")
    # A collection delete asks about each object.
    refused = kubectl(api, "-n", "vault", "delete", "configmaps", "--all", check=False)
    assert "keys is protected" in refused.stderr
    assert kubectl(api, "-n", "vault", "get", "configmap", "keys").returncode == 0
