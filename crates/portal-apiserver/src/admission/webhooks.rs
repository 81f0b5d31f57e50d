//! Admission webhooks: the Mutating- and ValidatingWebhookConfigurations in
//! the watch cache, called over HTTPS with an `admission.k8s.io/v1`
//! AdmissionReview for every write their rules, namespace and object
//! selectors and match conditions select. Mutating webhooks run before the
//! server's checks, in order, and may change the object by JSON patch
//! (those with `reinvocationPolicy: IfNeeded` are asked once more when a
//! later one changed it); validating webhooks run after, and may refuse.
//! A webhook that cannot be reached, times out or answers nonsense fails
//! the write under `failurePolicy: Fail` and is skipped under `Ignore`.
//!
//! A Service webhook is reached at a ready endpoint of the Service (as the
//! proxy subresource reaches it), verified as `<service>.<namespace>.svc`
//! against the webhook's `caBundle`; a URL webhook at its host. Without a
//! `caBundle` the cluster CA is trusted (upstream trusts the system roots).

use std::time::Duration;

use base64::Engine as _;
use portal_api::kinds::{
    mutating_webhook_configuration as mutating, validating_webhook_configuration as validating,
};
use portal_api::patch::PatchType;
use portal_api::{Resource, Status};
use serde_json::{json, Value};

use super::policies::{matches, Request};
use crate::registry::webhook_client::post;
use crate::ApiState;

/// One webhook of a configuration, with the configuration it came from.
struct Webhook {
    configuration: String,
    spec: Value,
}

impl Webhook {
    fn name(&self) -> &str {
        self.spec["name"].as_str().unwrap_or("")
    }

    fn fail_closed(&self) -> bool {
        self.spec["failurePolicy"] != "Ignore"
    }
}

/// The webhooks of every configuration of `resource`'s kind, ordered by
/// configuration name, then as listed (as upstream orders them).
fn webhooks(state: &ApiState, resource: &Resource) -> Vec<Webhook> {
    let (configurations, _, _) =
        state
            .cache
            .list(resource, &resource.key_prefix(), None, 0, |_| true);
    let mut all = Vec::new();
    for configuration in configurations {
        let name = configuration.value["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        for spec in configuration.value["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
        {
            all.push(Webhook {
                configuration: name.clone(),
                spec: spec.clone(),
            });
        }
    }
    all
}

/// Whether `webhook` is asked about `request`.
fn selects(
    webhook: &Webhook,
    request: &Request<'_>,
    namespace: Option<&Value>,
) -> Result<bool, Status> {
    let resources = json!({
        "resourceRules": webhook.spec["rules"],
        "namespaceSelector": webhook.spec["namespaceSelector"],
        "objectSelector": webhook.spec["objectSelector"],
    });
    if !matches(&resources, request, namespace, true) {
        return Ok(false);
    }
    for condition in webhook.spec["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let expression = condition["expression"].as_str().unwrap_or("");
        match super::policies::condition_holds(expression, request, namespace) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(error) if webhook.fail_closed() => {
                return Err(Status::internal(format!(
                    "failed calling webhook {:?}: match condition {:?}: {error}",
                    webhook.name(),
                    condition["name"].as_str().unwrap_or("")
                )))
            }
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// The mutating webhooks' say on `object`: it is changed in place; the
/// warnings to return, or the refusal.
pub(crate) async fn mutate(
    state: &ApiState,
    request: &Request<'_>,
    object: &mut Value,
) -> Result<Vec<String>, Status> {
    let hooks = webhooks(state, &mutating::RESOURCE);
    let mut warnings = Vec::new();
    if hooks.is_empty() {
        return Ok(warnings);
    }
    let namespace = super::policies::namespace_object(state, request);
    let mut called: Vec<(usize, Value)> = Vec::new();
    let mut changed_after = vec![false; hooks.len()];
    for (i, hook) in hooks.iter().enumerate() {
        let current = object.clone();
        let view = Request {
            object: &current,
            ..*request
        };
        if !selects(hook, &view, namespace.as_ref())? {
            continue;
        }
        let before = object.clone();
        call_and_patch(state, hook, &view, object, &mut warnings).await?;
        if *object != before {
            // Every webhook called before this one saw an older object.
            for (earlier, _) in &called {
                changed_after[*earlier] = true;
            }
        }
        called.push((i, object.clone()));
    }
    // Reinvocation: once, for those that asked and missed a change.
    for (i, _) in called.clone() {
        let hook = &hooks[i];
        if !changed_after[i] || hook.spec["reinvocationPolicy"] != "IfNeeded" {
            continue;
        }
        let current = object.clone();
        let view = Request {
            object: &current,
            ..*request
        };
        call_and_patch(state, hook, &view, object, &mut warnings).await?;
    }
    Ok(warnings)
}

async fn call_and_patch(
    state: &ApiState,
    hook: &Webhook,
    request: &Request<'_>,
    object: &mut Value,
    warnings: &mut Vec<String>,
) -> Result<(), Status> {
    let Some(response) = call(state, hook, request).await? else {
        return Ok(());
    };
    warnings.extend(response_warnings(&response));
    refuse_unless_allowed(hook, &response)?;
    let Some(patch) = response["patch"].as_str() else {
        return Ok(());
    };
    if response["patchType"] != "JSONPatch" {
        return failed(
            hook,
            format!("unsupported patch type {}", response["patchType"]),
        );
    }
    let patch = match base64::engine::general_purpose::STANDARD.decode(patch) {
        Ok(patch) => patch,
        Err(e) => return failed(hook, format!("the patch is not base64: {e}")),
    };
    let resource = request.scope.resource;
    let patched = match portal_api::patch::apply(resource, PatchType::Json, object, &patch) {
        Ok(patched) => patched,
        Err(e) => return failed(hook, format!("the patch does not apply: {e:?}")),
    };
    // The patched object is read again as a client's would be: wrong
    // types refused, unknown fields dropped, defaults filled in.
    match resource.decode_value(patched) {
        Ok(decoded) => {
            *object = decoded.object;
            resource.apply_defaults(object);
            Ok(())
        }
        Err(e) => failed(hook, format!("the patched object does not decode: {e}")),
    }
}

/// The validating webhooks' say on `request`: the warnings to return, or
/// the refusal. They are asked one after another.
pub(crate) async fn validate(
    state: &ApiState,
    request: &Request<'_>,
) -> Result<Vec<String>, Status> {
    let hooks = webhooks(state, &validating::RESOURCE);
    let mut warnings = Vec::new();
    if hooks.is_empty() {
        return Ok(warnings);
    }
    let namespace = super::policies::namespace_object(state, request);
    for hook in &hooks {
        if !selects(hook, request, namespace.as_ref())? {
            continue;
        }
        if let Some(response) = call(state, hook, request).await? {
            warnings.extend(response_warnings(&response));
            refuse_unless_allowed(hook, &response)?;
        }
    }
    Ok(warnings)
}

fn response_warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// A refusal in upstream's words (`admission webhook "x" denied the
/// request: …`), with the webhook's code when it is an error code.
fn refuse_unless_allowed(hook: &Webhook, response: &Value) -> Result<(), Status> {
    if response["allowed"] == true {
        return Ok(());
    }
    let result = &response["status"];
    let denied = format!("admission webhook {:?} denied the request", hook.name());
    let message = match result["message"].as_str().filter(|m| !m.is_empty()) {
        Some(message) => format!("{denied}: {message}"),
        None => format!("{denied} without explanation"),
    };
    let code = result["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    // The reasons Kubernetes names; anything else reads as BadRequest.
    const REASONS: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    let reason = result["reason"].as_str().unwrap_or("BadRequest");
    let mut status = Status::bad_request(message);
    status.code = code;
    status.reason = REASONS
        .iter()
        .find(|r| **r == reason)
        .copied()
        .unwrap_or("BadRequest");
    Err(status)
}

/// A webhook that could not be asked: refused under `Fail`, skipped under
/// `Ignore`.
fn failed(hook: &Webhook, error: String) -> Result<(), Status> {
    if hook.fail_closed() {
        Err(Status::internal(format!(
            "failed calling webhook {:?}: {error}",
            hook.name()
        )))
    } else {
        tracing::info!(webhook = %hook.name(), configuration = %hook.configuration, %error, "webhook failed; ignored (failurePolicy: Ignore)");
        Ok(())
    }
}

/// Asks one webhook: its `response`, or `None` when it failed and is
/// ignored.
async fn call(
    state: &ApiState,
    hook: &Webhook,
    request: &Request<'_>,
) -> Result<Option<Value>, Status> {
    let uid = uuid::Uuid::new_v4().to_string();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": review_request(&uid, request),
    });
    let timeout = Duration::from_secs(
        hook.spec["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let answer = tokio::time::timeout(
        timeout,
        post(state, &hook.spec["clientConfig"], &review, timeout),
    )
    .await;
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => {
            return failed(hook, format!("failed to call webhook: {error}")).map(|()| None)
        }
        Err(_) => {
            return failed(
                hook,
                format!(
                    "failed to call webhook: the webhook did not answer within {}s",
                    timeout.as_secs()
                ),
            )
            .map(|()| None)
        }
    };
    let response = &answer["response"];
    if !response.is_object() {
        return failed(hook, "the answer has no response".into()).map(|()| None);
    }
    if response["uid"] != uid.as_str() {
        return failed(
            hook,
            format!("expected response.uid={uid:?}, got {}", response["uid"]),
        )
        .map(|()| None);
    }
    Ok(Some(response.clone()))
}

/// The `request` of an AdmissionReview.
fn review_request(uid: &str, request: &Request<'_>) -> Value {
    let resource = request.scope.resource;
    let user = crate::security::user::requester();
    let kind =
        json!({"group": resource.group, "version": resource.version, "kind": resource.kind_name});
    let plural =
        json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
    let options_kind = if request.old.is_some() {
        "UpdateOptions"
    } else {
        "CreateOptions"
    };
    let mut review = json!({
        "uid": uid,
        "kind": kind,
        "resource": plural,
        "requestKind": kind,
        "requestResource": plural,
        "name": request.name(),
        "operation": request.operation(),
        "userInfo": user.map(|u| json!({"username": u.name, "uid": u.uid, "groups": u.groups, "extra": u.extra}))
            .unwrap_or(json!({})),
        "object": request.object,
        "oldObject": request.old.cloned().unwrap_or(Value::Null),
        "dryRun": request.write.dry_run,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    });
    if let Some(namespace) = request.scope.namespace {
        review["namespace"] = json!(namespace);
    }
    if let Some(sub) = request.write.subresource {
        review["subResource"] = json!(sub);
    }
    review
}
