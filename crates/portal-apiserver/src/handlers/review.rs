//! The review APIs: questions asked by POSTing an object and answered in
//! its `status`, never stored. Who am I (`SelfSubjectReview`, `kubectl
//! auth whoami`), who does this token belong to (`TokenReview`), may I or
//! may they (`SelfSubjectAccessReview`, `SubjectAccessReview`,
//! `LocalSubjectAccessReview`, `kubectl auth can-i`), and what may I do
//! here (`SelfSubjectRulesReview`, `kubectl auth can-i --list`).

use std::collections::BTreeMap;

use http::{Method, Response, StatusCode};
use portal_api::Status;
use serde_json::{json, Value};

use crate::security::auth;
use crate::security::rbac::rule::strings;
use crate::security::rbac::Request;
use crate::security::user::{self, User};
use crate::server::http::{json_response, read_body, Body, RequestBody};
use crate::ApiState;

pub(crate) const AUTHENTICATION: &str = "authentication.k8s.io";
pub(crate) const AUTHORIZATION: &str = "authorization.k8s.io";

/// The review resources, for discovery: group, plural, kind, namespaced.
pub(crate) const REVIEWS: [(&str, &str, &str, bool); 6] = [
    (
        AUTHENTICATION,
        "selfsubjectreviews",
        "SelfSubjectReview",
        false,
    ),
    (AUTHENTICATION, "tokenreviews", "TokenReview", false),
    (
        AUTHORIZATION,
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        true,
    ),
    (
        AUTHORIZATION,
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
    ),
    (
        AUTHORIZATION,
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        false,
    ),
    (
        AUTHORIZATION,
        "subjectaccessreviews",
        "SubjectAccessReview",
        false,
    ),
];

/// The review a path names: group, plural and the namespace of a local
/// one.
pub(crate) fn parse(path: &str) -> Option<(&'static str, &'static str, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, namespace, plural) = match parts.as_slice() {
        ["apis", group, "v1", plural] => (*group, None, *plural),
        ["apis", group, "v1", "namespaces", ns, plural] => {
            (*group, Some((*ns).to_owned()), *plural)
        }
        _ => return None,
    };
    let &(group, plural, _, namespaced) = REVIEWS
        .iter()
        .find(|(g, p, _, _)| *g == group && *p == plural)?;
    (namespaced == namespace.is_some()).then_some((group, plural, namespace))
}

/// A request body that is not a stored kind's (JSON, YAML or protobuf):
/// the message `kind` of `group`/v1.
pub(crate) fn decode_request(
    body: &[u8],
    content_type: &str,
    group: &str,
    kind: &str,
) -> Result<Value, Status> {
    let invalid = |e: &dyn std::fmt::Display| Status::bad_request(format!("invalid {kind}: {e}"));
    let value: Value = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        let package = group.split('.').next().unwrap_or(group);
        portal_api::protobuf::decode_message(
            &format!("io.k8s.api.{package}.v1.{kind}"),
            kind,
            &format!("{group}/v1"),
            body,
        )
        .map_err(|e| invalid(&e))?
    } else if content_type.starts_with("application/yaml") {
        serde_yaml_ng::from_slice(body).map_err(|e| invalid(&e))?
    } else {
        serde_json::from_slice(body).map_err(|e| invalid(&e))?
    };
    if !value.is_object() {
        return Err(invalid(&"not an object"));
    }
    Ok(value)
}

pub(crate) async fn serve(
    state: &ApiState,
    user: &User,
    method: &Method,
    (group, plural, namespace): (&'static str, &'static str, Option<String>),
    content_type: &str,
    body: RequestBody,
) -> Result<Response<Body>, Status> {
    if method != Method::POST {
        return Err(Status::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {plural})"
        )));
    }
    let asked = Request::Resource {
        verb: "create",
        group,
        resource: plural,
        subresource: None,
        name: None,
    };
    if !auth::allowed(state, user, namespace.as_deref(), &asked) {
        let scope = match &namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_owned(),
        };
        return Err(Status::forbidden(format!(
            "{plural}.{group} is forbidden: User {:?} cannot create resource {plural:?} in API group {group:?} {scope}",
            user.name
        )));
    }
    let body = read_body(body).await?;
    let kind = REVIEWS
        .iter()
        .find(|(_, p, ..)| *p == plural)
        .map_or("", |(_, _, kind, _)| *kind);
    let mut review = decode_request(&body, content_type, group, kind)?;
    review["apiVersion"] = json!(format!("{group}/v1"));
    review["kind"] = json!(kind);
    let status = match plural {
        "selfsubjectreviews" => json!({"userInfo": user.info()}),
        "tokenreviews" => token_review(state, &review["spec"]),
        "selfsubjectaccessreviews" => access(state, user, &review["spec"], None)?,
        "subjectaccessreviews" => access(state, &subject(&review["spec"]), &review["spec"], None)?,
        "localsubjectaccessreviews" => access(
            state,
            &subject(&review["spec"]),
            &review["spec"],
            namespace.as_deref(),
        )?,
        _ => rules_review(state, user, &review["spec"]),
    };
    review["status"] = status;
    review["metadata"]["creationTimestamp"] = Value::Null;
    Ok(json_response(
        StatusCode::CREATED,
        serde_json::to_vec(&review).unwrap_or_default(),
    ))
}

/// Who a token belongs to, for the audiences the reviewer names (the
/// server's own unless given).
fn token_review(state: &ApiState, spec: &Value) -> Value {
    let token = spec["token"].as_str().unwrap_or("");
    let wanted: Vec<String> = spec["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let signer = &state.authn.signer;
    let audiences = if wanted.is_empty() {
        signer.audiences.clone()
    } else {
        wanted
    };
    let checked = if signer.is_ours(token) {
        user::service_account_user_for(state, token, &audiences)
            .map(|user| (user, audiences.clone()))
    } else {
        // Other tokens (static ones, the admin's) are for this server.
        let mut headers = http::HeaderMap::new();
        match http::HeaderValue::from_str(&format!("Bearer {token}")) {
            Ok(value) if !token.is_empty() => {
                headers.insert(http::header::AUTHORIZATION, value);
                user::authenticate(state, &headers, None)
                    .map(|user| (user, signer.audiences.clone()))
                    .map_err(|_| "invalid bearer token".to_owned())
            }
            _ => Err("invalid bearer token".to_owned()),
        }
    };
    match checked {
        Ok((user, audiences)) if user.name != user::ANONYMOUS => json!({
            "authenticated": true,
            "user": &user.info(),
            "audiences": audiences,
        }),
        Ok(_) => json!({"authenticated": false}),
        Err(error) => json!({"authenticated": false, "error": error}),
    }
}

/// The user a SubjectAccessReview asks about, exactly as given.
fn subject(spec: &Value) -> User {
    let extra: BTreeMap<String, Vec<String>> = spec["extra"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
        .unwrap_or_default();
    User {
        name: spec["user"].as_str().unwrap_or("").to_owned(),
        uid: spec["uid"].as_str().unwrap_or("").to_owned(),
        groups: strings(&spec["groups"]),
        extra,
    }
}

/// Whether `user` may do what `spec` describes; a local review's
/// namespace is the path's.
fn access(
    state: &ApiState,
    user: &User,
    spec: &Value,
    local: Option<&str>,
) -> Result<Value, Status> {
    let resource = &spec["resourceAttributes"];
    let path = &spec["nonResourceAttributes"];
    let text = |v: &Value, f: &str| v[f].as_str().unwrap_or("").to_owned();
    let allowed = if resource.is_object() {
        let namespace = local
            .map(str::to_owned)
            .unwrap_or_else(|| text(resource, "namespace"));
        if local.is_some()
            && !text(resource, "namespace").is_empty()
            && text(resource, "namespace") != namespace
        {
            return Err(Status::bad_request(
                "spec.resourceAttributes.namespace must match the namespace of the request",
            ));
        }
        let (verb, group, plural, sub, name) = (
            text(resource, "verb"),
            text(resource, "group"),
            text(resource, "resource"),
            text(resource, "subresource"),
            text(resource, "name"),
        );
        let request = Request::Resource {
            verb: &verb,
            group: &group,
            resource: &plural,
            subresource: (!sub.is_empty()).then_some(sub.as_str()),
            name: (!name.is_empty()).then_some(name.as_str()),
        };
        auth::allowed(
            state,
            user,
            (!namespace.is_empty()).then_some(&namespace),
            &request,
        )
    } else if path.is_object() {
        let (verb, at) = (text(path, "verb"), text(path, "path"));
        auth::allowed(
            state,
            user,
            None,
            &Request::Path {
                verb: &verb,
                path: &at,
            },
        )
    } else {
        return Err(Status::bad_request(
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    Ok(if allowed {
        json!({"allowed": true, "reason": "allowed by the cluster's authorization"})
    } else {
        json!({"allowed": false})
    })
}

/// Every rule the requester holds in the namespace (and cluster-wide).
fn rules_review(state: &ApiState, user: &User, spec: &Value) -> Value {
    let namespace = spec["namespace"].as_str().filter(|n| !n.is_empty());
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for rule in state.rbac.rules_of(user, namespace) {
        if rule.non_resource_urls.is_empty() {
            let mut entry = json!({"verbs": rule.verbs, "apiGroups": rule.api_groups, "resources": rule.resources});
            if !rule.resource_names.is_empty() {
                entry["resourceNames"] = json!(rule.resource_names);
            }
            resource_rules.push(entry);
        } else {
            non_resource_rules
                .push(json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}));
        }
    }
    json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    })
}
