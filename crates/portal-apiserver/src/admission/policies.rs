//! ValidatingAdmissionPolicies: every write that a binding's
//! `matchResources` and its policy's `matchConstraints` select (rules by
//! group, version, resource and operation; namespace and object label
//! selectors; `matchConditions`) is checked by the policy's CEL
//! validations, with `object`, `oldObject`, `request`, `params`,
//! `namespaceObject` and `variables` bound as upstream binds them. A
//! failure does what the binding says: `Deny` refuses the write in
//! upstream's words, `Warn` returns a warning, `Audit` is logged. A
//! policy is compiled once per generation.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use portal_api::expressions::{Activation, Expression};
use portal_api::kinds::{
    namespace, validating_admission_policy as policy_kind,
    validating_admission_policy_binding as binding_kind,
};
use portal_api::selector::LabelSelector;
use portal_api::{Cause, Resource, Status, Target};
use serde_json::{json, Value};

use crate::registry::write::Write;
use crate::{ApiState, Scope};

/// Compiled policies, by UID, with the generation they were compiled at.
#[derive(Debug, Default)]
pub(crate) struct Policies {
    compiled: Mutex<HashMap<String, (i64, Arc<Compiled>)>>,
}

#[derive(Debug)]
struct Compiled {
    name: String,
    fail_closed: bool,
    conditions: Vec<(String, Expression)>,
    variables: Vec<(String, Expression)>,
    validations: Vec<Validation>,
    param_kind: Option<(String, String)>,
}

#[derive(Debug)]
struct Validation {
    expression: Expression,
    message: Option<String>,
    message_expression: Option<Expression>,
    reason: String,
}

/// The write being admitted.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) scope: &'a Scope<'a>,
    pub(crate) write: Write<'a>,
    /// The object written (null for a delete).
    pub(crate) object: &'a Value,
    /// The stored object, on updates and deletes.
    pub(crate) old: Option<&'a Value>,
}

impl Request<'_> {
    pub(crate) fn operation(&self) -> &'static str {
        self.write.operation
    }

    pub(crate) fn name(&self) -> &str {
        self.object["metadata"]["name"]
            .as_str()
            .or_else(|| self.old.and_then(|o| o["metadata"]["name"].as_str()))
            .unwrap_or("")
    }
}

impl Policies {
    /// Checks `request` against every bound policy: the warnings to
    /// return, or the refusal.
    pub(crate) fn validate(
        &self,
        state: &ApiState,
        request: &Request<'_>,
    ) -> Result<Vec<String>, Status> {
        let bindings_resource = &binding_kind::RESOURCE;
        let (bindings, _, _) = state.cache.list(
            bindings_resource,
            &bindings_resource.key_prefix(),
            None,
            0,
            |_| true,
        );
        let mut warnings = Vec::new();
        if bindings.is_empty() {
            return Ok(warnings);
        }
        // The policy kinds themselves are not checked by policies (as
        // upstream exempts them, so a bad policy can always be fixed).
        let kind = request.scope.resource.kind();
        if kind == policy_kind::KIND || kind == binding_kind::KIND {
            return Ok(warnings);
        }
        let namespace_object = namespace_object(state, request);
        for binding in &bindings {
            let binding = &binding.value;
            let policy_name = binding["spec"]["policyName"].as_str().unwrap_or("");
            let resource = &policy_kind::RESOURCE;
            let Some(policy) = state.cache.get(resource, &resource.key(None, policy_name)) else {
                continue;
            };
            let Some(compiled) = self.compiled(&policy.value) else {
                continue;
            };
            let namespace_object = namespace_object.as_ref();
            let matched = matches(
                &policy.value["spec"]["matchConstraints"],
                request,
                namespace_object,
                true,
            ) && (binding["spec"]["matchResources"].is_null()
                || matches(
                    &binding["spec"]["matchResources"],
                    request,
                    namespace_object,
                    false,
                ));
            if !matched {
                continue;
            }
            let binding_name = binding["metadata"]["name"].as_str().unwrap_or("");
            let actions: Vec<&str> = binding["spec"]["validationActions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let mut failures = Vec::new();
            match params(state, &compiled, binding, request) {
                Err(message) => failures.push(Failure::invalid(message)),
                Ok(all) => {
                    for params in all {
                        match evaluate(&compiled, request, namespace_object, &params) {
                            Ok(broken) => failures.extend(broken),
                            Err(error) if compiled.fail_closed => {
                                failures.push(Failure::invalid(error))
                            }
                            Err(error) => {
                                tracing::debug!(policy = %compiled.name, %error, "policy error ignored (failurePolicy: Ignore)")
                            }
                        }
                    }
                }
            }
            for failure in failures {
                act(
                    &actions,
                    &compiled.name,
                    binding_name,
                    request,
                    failure,
                    &mut warnings,
                )?;
            }
        }
        Ok(warnings)
    }

    /// The policy compiled (once per generation); `None` if it does not
    /// compile (its validation keeps that from being stored).
    fn compiled(&self, policy: &Value) -> Option<Arc<Compiled>> {
        let uid = policy["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        let generation = policy["metadata"]["generation"].as_i64().unwrap_or(0);
        let mut compiled = self.compiled.lock();
        if let Some((at, done)) = compiled.get(&uid) {
            if *at == generation {
                return Some(done.clone());
            }
        }
        let done = Arc::new(compile(policy).ok()?);
        // Policies deleted long ago would linger: keep the map to the
        // policies seen lately.
        if compiled.len() > 1024 {
            compiled.clear();
        }
        compiled.insert(uid, (generation, done.clone()));
        Some(done)
    }
}

/// The Namespace a namespaced write is in (`namespaceObject`).
pub(crate) fn namespace_object(state: &ApiState, request: &Request<'_>) -> Option<Value> {
    let name = request.scope.namespace?;
    let resource = &namespace::RESOURCE;
    state
        .cache
        .get(resource, &resource.key(None, name))
        .map(|n| n.value.clone())
}

/// Whether a match condition holds for `request` (a webhook's; policies
/// compile theirs once).
pub(crate) fn condition_holds(
    expression: &str,
    request: &Request<'_>,
    namespace: Option<&Value>,
) -> Result<bool, String> {
    let expression = Expression::compile(expression)?;
    let activation = activation(request, namespace, &Value::Null)?;
    expression.holds(&activation)
}

fn compile(policy: &Value) -> Result<Compiled, String> {
    let spec = &policy["spec"];
    let named = |list: &str| -> Result<Vec<(String, Expression)>, String> {
        spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| {
                let name = item["name"].as_str().unwrap_or("").to_owned();
                Expression::compile(item["expression"].as_str().unwrap_or("")).map(|e| (name, e))
            })
            .collect()
    };
    let validations = spec["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            Ok(Validation {
                expression: Expression::compile(v["expression"].as_str().unwrap_or(""))?,
                message: v["message"].as_str().map(str::to_owned),
                message_expression: v["messageExpression"]
                    .as_str()
                    .map(Expression::compile)
                    .transpose()?,
                reason: v["reason"].as_str().unwrap_or("Invalid").to_owned(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let param_kind = spec["paramKind"]["kind"].as_str().map(|kind| {
        (
            spec["paramKind"]["apiVersion"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            kind.to_owned(),
        )
    });
    Ok(Compiled {
        name: policy["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        fail_closed: spec["failurePolicy"] != "Ignore",
        conditions: named("matchConditions")?,
        variables: named("variables")?,
        validations,
        param_kind,
    })
}

/// Whether `request` is among the `matchResources` (a policy's
/// constraints, whose rules say what it applies to; or a binding's, which
/// narrow the policy's and may leave the rules out).
pub(crate) fn matches(
    resources: &Value,
    request: &Request<'_>,
    namespace: Option<&Value>,
    rules_required: bool,
) -> bool {
    let rule_matches = |rule: &Value| rule_matches(rule, request);
    let included = match resources["resourceRules"].as_array() {
        Some(rules) if !rules.is_empty() => rules.iter().any(rule_matches),
        _ => !rules_required,
    };
    let excluded = resources["excludeResourceRules"]
        .as_array()
        .is_some_and(|rules| rules.iter().any(rule_matches));
    if !included || excluded {
        return false;
    }
    let selects = |selector: &Value, object: Option<&Value>| {
        if selector.is_null() {
            return true;
        }
        LabelSelector::from_api(selector, "selector").is_ok_and(|s| has_labels(&s, object))
    };
    // Namespace selectors apply to namespaced objects (and Namespaces).
    let resource = request.scope.resource;
    let namespace_selected = if resource.kind() == namespace::KIND {
        // A Namespace is selected by its own labels (the stored ones when
        // it is deleted).
        let this = if request.object.is_null() {
            request.old
        } else {
            Some(request.object)
        };
        selects(&resources["namespaceSelector"], this)
    } else if resource.namespaced {
        selects(&resources["namespaceSelector"], namespace)
    } else {
        true
    };
    // A side that is not there (the object of a delete) does not match.
    let object_selected = (!request.object.is_null()
        && selects(&resources["objectSelector"], Some(request.object)))
        || request
            .old
            .is_some_and(|old| selects(&resources["objectSelector"], Some(old)));
    namespace_selected && object_selected
}

/// Whether `object`'s labels satisfy `selector` (no object: no labels).
fn has_labels(selector: &LabelSelector, object: Option<&Value>) -> bool {
    let labels = object.and_then(|o| o["metadata"]["labels"].as_object());
    selector.matches(|key| labels.and_then(|l| l.get(key)).and_then(Value::as_str))
}

fn rule_matches(rule: &Value, request: &Request<'_>) -> bool {
    let resource = request.scope.resource;
    let listed = |field: &str, value: &str| {
        rule[field]
            .as_array()
            .is_some_and(|values| values.iter().any(|v| v == "*" || v == value))
    };
    let name = match request.write.subresource {
        Some(sub) => format!("{}/{sub}", resource.plural),
        None => resource.plural.to_owned(),
    };
    let resource_listed = rule["resources"].as_array().is_some_and(|values| {
        values.iter().filter_map(Value::as_str).any(|v| {
            v == name
                || match request.write.subresource {
                    None => v == "*",
                    Some(sub) => {
                        v == "*/*"
                            || v == format!("{}/*", resource.plural)
                            || v == format!("*/{sub}")
                    }
                }
        })
    });
    let scope_fits = match rule["scope"].as_str().unwrap_or("*") {
        "Namespaced" => resource.namespaced,
        "Cluster" => !resource.namespaced,
        _ => true,
    };
    listed("operations", request.operation())
        && listed("apiGroups", resource.group)
        && listed("apiVersions", resource.version)
        && resource_listed
        && scope_fits
}

/// The parameter objects a binding names (one evaluation each), `[Null]`
/// for a policy without parameters.
fn params(
    state: &ApiState,
    policy: &Compiled,
    binding: &Value,
    request: &Request<'_>,
) -> Result<Vec<Value>, String> {
    let Some((api_version, kind)) = &policy.param_kind else {
        return Ok(vec![Value::Null]);
    };
    let reference = &binding["spec"]["paramRef"];
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let registry = portal_api::registry::current();
    let resource = registry
        .iter()
        .find(|r| r.group == group && r.version == version && r.kind_name == kind)
        .ok_or_else(|| {
            format!("failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'")
        })?;
    // A namespaced parameter kind without a namespace: the request's.
    let namespace = reference["namespace"]
        .as_str()
        .or(request.scope.namespace.filter(|_| resource.namespaced));
    let found: Vec<Value> = match reference["name"].as_str() {
        Some(name) => state
            .cache
            .get(resource, &resource.key(namespace, name))
            .map(|p| vec![p.value.clone()])
            .unwrap_or_default(),
        None => {
            let selector = LabelSelector::from_api(&reference["selector"], "paramRef.selector")
                .map_err(|e| e.to_string())?;
            let (listed, _, _) =
                state
                    .cache
                    .list(resource, &resource.list_prefix(namespace), None, 0, |p| {
                        has_labels(&selector, Some(&p.value))
                    });
            listed.iter().map(|p| p.value.clone()).collect()
        }
    };
    if found.is_empty() {
        return match reference["parameterNotFoundAction"].as_str() {
            Some("Allow") => Ok(Vec::new()),
            _ => {
                Err("no params found for policy binding with `Deny` parameterNotFoundAction".into())
            }
        };
    }
    Ok(found)
}

/// A broken validation: its message and reason.
struct Failure {
    message: String,
    reason: String,
}

impl Failure {
    /// A failure to evaluate, reported as upstream reports it (Invalid).
    fn invalid(message: String) -> Failure {
        Failure {
            message,
            reason: "Invalid".into(),
        }
    }
}

/// The validations `request` breaks under one parameter object (none when
/// a match condition is false), or an evaluation error.
fn evaluate(
    policy: &Compiled,
    request: &Request<'_>,
    namespace: Option<&Value>,
    params: &Value,
) -> Result<Vec<Failure>, String> {
    let mut activation = activation(request, namespace, params)?;
    for (name, condition) in &policy.conditions {
        let holds = condition
            .holds(&activation)
            .map_err(|e| format!("failed to evaluate matchCondition {name:?}: {e}"))?;
        if !holds {
            return Ok(Vec::new());
        }
    }
    let mut variables = serde_json::Map::new();
    for (name, expression) in &policy.variables {
        let value = expression
            .evaluate(&activation)
            .map_err(|e| format!("variable {name:?}: {e}"))?;
        variables.insert(name.clone(), value);
        activation.set("variables", &Value::Object(variables.clone()))?;
    }
    failures(policy, &activation)
}

/// What expressions about a write see.
fn activation(
    request: &Request<'_>,
    namespace: Option<&Value>,
    params: &Value,
) -> Result<Activation, String> {
    let mut activation = Activation::default();
    let resource = request.scope.resource;
    let user = crate::security::user::requester();
    let request_value = json!({
        "kind": {"group": resource.group, "version": resource.version, "kind": resource.kind_name},
        "resource": {"group": resource.group, "version": resource.version, "resource": resource.plural},
        "subResource": request.write.subresource.unwrap_or(""),
        "name": request.name(),
        "namespace": request.scope.namespace.unwrap_or(""),
        "operation": request.operation(),
        "userInfo": user.map(|u| json!({"username": u.name, "uid": u.uid, "groups": u.groups})).unwrap_or(json!({})),
        "dryRun": request.write.dry_run,
    });
    activation.set("object", request.object)?;
    activation.set("oldObject", request.old.unwrap_or(&Value::Null))?;
    activation.set("request", &request_value)?;
    activation.set("params", params)?;
    activation.set("namespaceObject", namespace.unwrap_or(&Value::Null))?;
    activation.set("variables", &json!({}))?;
    Ok(activation)
}

/// The validations a write breaks.
fn failures(policy: &Compiled, activation: &Activation) -> Result<Vec<Failure>, String> {
    let mut failures = Vec::new();
    for validation in &policy.validations {
        let source = validation.expression.source();
        let holds = validation
            .expression
            .holds(activation)
            .map_err(|e| format!("expression '{source}' resulted in error: {e}"))?;
        if holds {
            continue;
        }
        let from_expression = validation
            .message_expression
            .as_ref()
            .and_then(|e| e.evaluate(activation).ok())
            .and_then(|m| m.as_str().map(str::to_owned))
            .filter(|m| !m.trim().is_empty());
        let message = from_expression
            .or_else(|| validation.message.clone())
            .unwrap_or_else(|| format!("failed expression: {source}"));
        failures.push(Failure {
            message,
            reason: validation.reason.clone(),
        });
    }
    Ok(failures)
}

/// What a binding's actions do with a failure.
fn act(
    actions: &[&str],
    policy: &str,
    binding: &str,
    request: &Request<'_>,
    failure: Failure,
    warnings: &mut Vec<String>,
) -> Result<(), Status> {
    if actions.contains(&"Warn") {
        warnings.push(format!(
            "Validation failed for ValidatingAdmissionPolicy '{policy}' with binding '{binding}': {}",
            failure.message
        ));
    }
    if actions.contains(&"Audit") {
        tracing::info!(%policy, %binding, message = %failure.message, "validation failure (Audit)");
    }
    if !actions.contains(&"Deny") {
        return Ok(());
    }
    let message = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {}",
        failure.message
    );
    Err(refusal(
        request.scope.resource,
        request.name(),
        &failure.reason,
        message,
    ))
}

/// The refusal for a reason, as upstream words it.
fn refusal(resource: &Resource, name: &str, reason: &str, message: String) -> Status {
    match reason {
        "Forbidden" => Status::forbidden(format!(
            "{} \"{name}\" is forbidden: {message}",
            qualified(resource)
        )),
        "Unauthorized" => {
            let mut status = Status::unauthorized();
            status.message = message;
            status
        }
        "RequestEntityTooLarge" => Status::too_large(message),
        _ => {
            let target = Target {
                group: resource.group,
                resource: resource.plural,
                kind: resource.plural,
            };
            Status::invalid(
                target,
                name,
                vec![Cause {
                    reason: "".into(),
                    message,
                    field: "".into(),
                }],
            )
        }
    }
}

fn qualified(resource: &Resource) -> String {
    if resource.group.is_empty() {
        resource.plural.to_owned()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}
