//! MutatingWebhookConfigurations (`admissionregistration.k8s.io/v1`):
//! HTTPS endpoints asked to change (by JSON patch) or refuse a write
//! before the server's checks; `reinvocationPolicy: IfNeeded` asks again
//! when a later webhook changed the object.

use super::nothing;
use super::validating_webhook_configuration::{cells, columns, defaults, validate};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};

/// The kind this module defines.
pub const KIND: Kind = Kind::new(
    super::validating_admission_policy::GROUP,
    "MutatingWebhookConfiguration",
);

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "mutatingwebhookconfigurations",
    singular: "mutatingwebhookconfiguration",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &["api-extensions"],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>,
    openapi_schema: openapi_schema::<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    >,
    defaults: |object| defaults(object, true),
    validate: |object, _| validate(object, true),
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: super::validating_webhook_configuration::list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};
