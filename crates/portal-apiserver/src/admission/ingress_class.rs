//! Upstream's DefaultIngressClass admission plugin: an Ingress created
//! naming no class (neither `ingressClassName` nor the older annotation)
//! gets the default IngressClass, the newest if several are marked so.
//! Also the warning upstream gives for the deprecated annotation.

use portal_api::kinds::ingress::CLASS_ANNOTATION;
use portal_api::kinds::ingress_class::{self, is_default};
use serde_json::{json, Value};

use crate::ApiState;

/// Sets the default class on a new Ingress; the warnings for the client.
pub(super) fn admit(state: &ApiState, object: &mut Value) -> Vec<String> {
    let annotated = object["metadata"]["annotations"]
        .get(CLASS_ANNOTATION)
        .is_some();
    if !object["spec"]["ingressClassName"].is_null() {
        return Vec::new();
    }
    if annotated {
        return vec![format!(
            "annotation \"{CLASS_ANNOTATION}\" is deprecated, please use 'spec.ingressClassName' instead"
        )];
    }
    let resource = &ingress_class::RESOURCE;
    let (classes, _, _) = state
        .cache
        .list(resource, &resource.key_prefix(), None, 0, |_| true);
    let newest = classes
        .iter()
        .map(|c| &c.value)
        .filter(|c| is_default(c))
        .min_by(|a, b| {
            let created = |c: &Value| {
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            };
            let name = |c: &Value| c["metadata"]["name"].as_str().unwrap_or("").to_owned();
            created(b)
                .cmp(&created(a))
                .then_with(|| name(a).cmp(&name(b)))
        });
    if let Some(class) = newest {
        if !object["spec"].is_object() {
            object["spec"] = json!({});
        }
        object["spec"]["ingressClassName"] = class["metadata"]["name"].clone();
    }
    Vec::new()
}
