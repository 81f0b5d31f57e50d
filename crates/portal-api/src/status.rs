//! Kubernetes `Status` errors: every failed API call answers with one, with
//! the reason and code clients switch on.

use serde::{Deserialize, Serialize};

/// One field-level problem, as in `details.causes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    /// `Invalid value: <value>: <detail>` on `field`; strings are quoted and
    /// numbers are not, as Kubernetes prints them.
    pub fn invalid(field: &str, value: impl Into<serde_json::Value>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {}: {detail}", value.into()),
            field: field.into(),
        }
    }

    /// Like [`Cause::invalid`] with the value already rendered (Go's
    /// `%#v` forms such as `[]string{"10.96.0.6"}`).
    pub fn invalid_rendered(field: &str, rendered: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {rendered}: {detail}"),
            field: field.into(),
        }
    }

    pub fn required(field: &str, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_owned()
        } else {
            format!("Required value: {detail}")
        };
        Cause {
            reason: "FieldValueRequired".into(),
            message,
            field: field.into(),
        }
    }

    pub fn forbidden(field: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden".into(),
            message: format!("Forbidden: {detail}"),
            field: field.into(),
        }
    }

    /// `Unsupported value: "x": supported values: "a", "b"` (values
    /// rendered as JSON, as Kubernetes quotes them).
    pub fn unsupported(
        field: &str,
        value: impl Into<serde_json::Value>,
        supported: &[&str],
    ) -> Self {
        let supported: Vec<String> = supported
            .iter()
            .map(|s| serde_json::Value::from(*s).to_string())
            .collect();
        Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                value.into(),
                supported.join(", ")
            ),
            field: field.into(),
        }
    }

    pub fn duplicate(field: &str, value: impl Into<serde_json::Value>) -> Self {
        Cause {
            reason: "FieldValueDuplicate".into(),
            message: format!("Duplicate value: {}", value.into()),
            field: field.into(),
        }
    }

    /// `Too many: 4: must have at most 3 items`.
    pub fn too_many(field: &str, actual: usize, max: u64) -> Self {
        Cause {
            reason: "FieldValueTooMany".into(),
            message: format!("Too many: {actual}: must have at most {max} items"),
            field: field.into(),
        }
    }

    pub fn too_long(field: &str, max: usize) -> Self {
        Cause {
            reason: "FieldValueTooLong".into(),
            message: format!("Too long: may not be more than {max} bytes"),
            field: field.into(),
        }
    }

    /// `field: message` as kubectl prints it.
    pub fn display(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// A failed call, ready to serialize as `{"kind":"Status",...}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct Status {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// Boxed: keeps `Result<_, Status>` small on the happy path.
    pub details: Option<Box<Details>>,
}

/// What a resource is called in messages: kind (or plural) and group.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub group: &'a str,
    /// The resource's plural (`services`) for NotFound/AlreadyExists, like
    /// Kubernetes' `GroupResource` strings.
    pub resource: &'a str,
    /// The kind (`Service`) for Invalid.
    pub kind: &'a str,
}

impl Target<'_> {
    fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_owned()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, name: &str) -> Details {
        Details {
            name: Some(name.to_owned()),
            group: (!self.group.is_empty()).then(|| self.group.to_owned()),
            kind: Some(self.resource.to_owned()),
            ..Details::default()
        }
    }
}

impl Status {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Status {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Status::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Status::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Status::new(403, "Forbidden", message)
    }

    pub fn not_found(target: Target<'_>, name: &str) -> Self {
        let mut status = Status::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", target.qualified_resource()),
        );
        status.details = Some(Box::new(target.details(name)));
        status
    }

    /// A path or resource that does not exist at all.
    pub fn no_route() -> Self {
        Status::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Status::new(405, "MethodNotAllowed", message)
    }

    pub fn already_exists(target: Target<'_>, name: &str) -> Self {
        let mut status = Status::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", target.qualified_resource()),
        );
        status.details = Some(Box::new(target.details(name)));
        status
    }

    /// A write based on a stale `resourceVersion`.
    pub fn conflict(target: Target<'_>, name: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            target.qualified_resource()
        );
        let mut status = Status::new(409, "Conflict", message);
        status.details = Some(Box::new(target.details(name)));
        status
    }

    /// A history position that no longer exists.
    pub fn expired(message: impl Into<String>) -> Self {
        Status::new(410, "Expired", message)
    }

    /// 429: try again later, with why (an eviction a disruption budget
    /// refuses: `reason` `DisruptionBudget`).
    pub fn too_many_requests(message: impl Into<String>, causes: Vec<Cause>) -> Self {
        let mut status = Status::new(429, "TooManyRequests", message);
        if !causes.is_empty() {
            status.details = Some(Box::new(Details {
                causes,
                ..Details::default()
            }));
        }
        status
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Status::new(413, "RequestEntityTooLarge", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Status::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"))
    }

    /// 422 with one cause per problem: kubectl prints
    /// `The Service "x" is invalid: spec.ports[0].port: ...`.
    pub fn invalid(target: Target<'_>, name: &str, causes: Vec<Cause>) -> Self {
        let listed: Vec<String> = causes.iter().map(Cause::display).collect();
        let summary = if listed.len() == 1 {
            listed[0].clone()
        } else {
            format!("[{}]", listed.join(", "))
        };
        let kind = if target.group.is_empty() {
            target.kind.to_owned()
        } else {
            format!("{}.{}", target.kind, target.group)
        };
        let mut status = Status::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {summary}"),
        );
        status.details = Some(Box::new(Details {
            name: Some(name.to_owned()),
            group: (!target.group.is_empty()).then(|| target.group.to_owned()),
            kind: Some(target.kind.to_owned()),
            causes,
            retry_after_seconds: None,
        }));
        status
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Status::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Status::new(504, "Timeout", message)
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Status::new(503, "ServiceUnavailable", message)
    }

    /// The response body: Kubernetes' field order (`kind`, `apiVersion`,
    /// `metadata`, `status`, `message`, `reason`, `details`, `code`) and
    /// its trailing newline, byte for byte what kube-apiserver sends.
    pub fn to_body(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Empty {}
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            kind: &'static str,
            api_version: &'static str,
            metadata: Empty,
            status: &'static str,
            message: &'a str,
            reason: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            details: Option<&'a Details>,
            code: u16,
        }
        let wire = Wire {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details: self.details.as_deref(),
            code: self.code,
        };
        let mut body = serde_json::to_vec(&wire).unwrap_or_default();
        body.push(b'\n');
        body
    }

    /// The wire form, as a value (a watch's ERROR event carries it).
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            value["details"] = serde_json::to_value(details).unwrap_or_default();
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: Target<'static> = Target {
        group: "",
        resource: "services",
        kind: "Service",
    };

    #[test]
    fn the_body_is_in_kubernetes_field_order_with_a_newline() {
        let body = String::from_utf8(Status::not_found(SVC, "web").to_body()).unwrap();
        assert!(body.starts_with(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"services \"web\" not found","reason":"NotFound","details":{"#), "{body}");
        assert!(body.ends_with("\"code\":404}\n"), "{body}");
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value, Status::not_found(SVC, "web").to_json());
    }

    #[test]
    fn invalid_reads_like_kubernetes() {
        let status = Status::invalid(
            SVC,
            "x",
            vec![Cause::invalid(
                "spec.ports[0].port",
                0,
                "must be between 1 and 65535, inclusive",
            )],
        );
        assert_eq!(status.message, "Service \"x\" is invalid: spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive");
        let json = status.to_json();
        assert_eq!(json["code"], 422);
        assert_eq!(json["details"]["causes"][0]["field"], "spec.ports[0].port");
    }

    #[test]
    fn not_found_names_the_resource() {
        let status = Status::not_found(SVC, "web");
        assert_eq!(status.message, "services \"web\" not found");
        assert_eq!(status.to_json()["details"]["kind"], "services");
        let slices = Target {
            group: "discovery.k8s.io",
            resource: "endpointslices",
            kind: "EndpointSlice",
        };
        assert_eq!(
            Status::already_exists(slices, "a").message,
            "endpointslices.discovery.k8s.io \"a\" already exists"
        );
    }
}
