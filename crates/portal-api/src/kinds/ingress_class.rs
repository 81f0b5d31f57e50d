//! IngressClasses (`networking.k8s.io/v1`, cluster-scoped): which
//! controller serves the Ingresses naming the class. The one annotated
//! `ingressclass.kubernetes.io/is-default-class: "true"` serves Ingresses
//! that name none (the newest if several, as upstream's admission picks).
//! Portal's own is `portal`, controller [`CONTROLLER`].

use serde_json::{json, Value};

use super::replace_lists;
use crate::name::{dns1123_label, dns1123_subdomain};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("networking.k8s.io", "IngressClass");

/// The annotation that makes a class the default.
pub const DEFAULT_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// The controller name of Portal's built-in layer-7 proxy (the same as
/// `portal_ingress::CONTROLLER`; that crate does not depend on this one).
pub const CONTROLLER: &str = "portal.dev/ingress";

const MAX_CONTROLLER: usize = 250;

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "ingressclasses",
    singular: "ingressclass",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::networking::v1::IngressClass>,
    openapi_schema: openapi_schema::<k8s_openapi::api::networking::v1::IngressClass>,
    defaults,
    validate,
    prepare_create: super::nothing,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// Whether a class is annotated as the default.
pub fn is_default(class: &Value) -> bool {
    class["metadata"]["annotations"][DEFAULT_ANNOTATION].as_str() == Some("true")
}

/// Parameters without a scope are cluster-scoped (`SetDefaults_IngressClass`).
fn defaults(object: &mut Value) {
    if let Some(parameters) = object["spec"]["parameters"].as_object_mut() {
        parameters
            .entry("scope")
            .or_insert_with(|| json!("Cluster"));
    }
}

/// Upstream's `ValidateIngressClass` and `ValidateIngressClassUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    let controller = spec["controller"].as_str().unwrap_or("");
    if let Some(old) = old {
        if old["spec"]["controller"] != spec["controller"] {
            causes.push(Cause::invalid(
                "spec.controller",
                controller,
                "field is immutable",
            ));
        }
    }
    if controller.len() > MAX_CONTROLLER {
        causes.push(Cause::too_long("spec.controller", MAX_CONTROLLER));
    }
    domain_prefixed_path(controller, &mut causes);
    let parameters = &spec["parameters"];
    if parameters.is_object() {
        super::ingress::typed_reference(parameters, "spec.parameters", &mut causes);
        let namespace = parameters["namespace"].as_str();
        match parameters["scope"].as_str() {
            None => causes.push(Cause::required("spec.parameters.scope", "")),
            Some("Namespace") => match namespace {
                None | Some("") => causes.push(Cause::required(
                    "spec.parameters.namespace",
                    "`parameters.scope` is set to 'Namespace'",
                )),
                Some(ns) => {
                    for problem in dns1123_label(ns) {
                        causes.push(Cause::invalid("spec.parameters.namespace", ns, &problem));
                    }
                }
            },
            Some("Cluster") => {
                if namespace.is_some() {
                    causes.push(Cause::forbidden(
                        "spec.parameters.namespace",
                        "`parameters.scope` is set to 'Cluster'",
                    ));
                }
            }
            Some(other) => causes.push(Cause::unsupported(
                "spec.parameters.scope",
                other,
                &["Cluster", "Namespace"],
            )),
        }
    }
    causes
}

/// `IsDomainPrefixedPath`: `acme.io/foo`.
fn domain_prefixed_path(value: &str, causes: &mut Vec<Cause>) {
    const FIELD: &str = "spec.controller";
    if value.is_empty() {
        causes.push(Cause::required(FIELD, ""));
        return;
    }
    let Some((domain, path)) = value
        .split_once('/')
        .filter(|(d, p)| !d.is_empty() && !p.is_empty())
    else {
        causes.push(Cause::invalid(
            FIELD,
            value,
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        ));
        return;
    };
    for problem in dns1123_subdomain(domain) {
        causes.push(Cause::invalid(FIELD, domain, &problem));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c);
    if !path.chars().all(allowed) {
        causes.push(Cause::invalid(
            FIELD,
            path,
            "Invalid path (regex used for validation is '[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+')",
        ));
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col(
            "Controller",
            "Controller that is responsible for handling this class.",
            0,
        ),
        col(
            "Parameters",
            "A reference to a resource with additional parameters.",
            0,
        ),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let parameters = &object["spec"]["parameters"];
    let shown = if parameters.is_object() {
        let mut text = parameters["kind"].as_str().unwrap_or("").to_owned();
        if let Some(group) = parameters["apiGroup"].as_str() {
            text = format!("{text}.{group}");
        }
        format!("{text}/{}", parameters["name"].as_str().unwrap_or(""))
    } else {
        "<none>".to_owned()
    };
    vec![
        name(object),
        json!(object["spec"]["controller"].as_str().unwrap_or("")),
        json!(shown),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(spec: Value) -> Value {
        let mut object = json!({"metadata": {"name": "c"}, "spec": spec});
        defaults(&mut object);
        object
    }

    fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
        validate(object, old).iter().map(Cause::display).collect()
    }

    #[test]
    fn controllers_and_parameters() {
        assert!(messages(&class(json!({"controller": CONTROLLER})), None).is_empty());
        assert_eq!(
            messages(&class(json!({"controller": "nginx"})), None),
            ["spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")"]
        );
        let scoped =
            class(json!({"controller": CONTROLLER, "parameters": {"kind": "Params", "name": "p"}}));
        assert_eq!(scoped["spec"]["parameters"]["scope"], "Cluster");
        assert!(messages(&scoped, None).is_empty());
        let namespaced = class(
            json!({"controller": CONTROLLER, "parameters": {"kind": "P", "name": "p", "scope": "Namespace"}}),
        );
        assert_eq!(
            messages(&namespaced, None),
            ["spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'"]
        );
        let moved = class(json!({"controller": "example.com/other"}));
        assert_eq!(
            messages(&moved, Some(&class(json!({"controller": CONTROLLER})))),
            ["spec.controller: Invalid value: \"example.com/other\": field is immutable"]
        );
    }

    #[test]
    fn printed_as_kubectl_does() {
        let object = class(
            json!({"controller": CONTROLLER, "parameters": {"apiGroup": "k8s.example.com", "kind": "IngressParameters", "name": "external-lb"}}),
        );
        assert_eq!(
            cells(&object, 0)[2],
            json!("IngressParameters.k8s.example.com/external-lb")
        );
        assert_eq!(
            cells(&class(json!({"controller": CONTROLLER})), 0)[2],
            json!("<none>")
        );
    }
}
