//! ServiceCIDRs (`networking.k8s.io/v1`, cluster-scoped): the ranges
//! Service cluster IPs come from. The API server keeps one named
//! `kubernetes` for `--service-cluster-ip-range`; more extend the ranges
//! at run time. Each holds one CIDR or two of different families; a
//! single-stack one may gain the other family, nothing else changes.

use std::net::IpAddr;

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::ip_text::cidr_problem;
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::families::go_strings;
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("networking.k8s.io", "ServiceCIDR");

/// The ServiceCIDR of `--service-cluster-ip-range`.
pub const DEFAULT_NAME: &str = "kubernetes";

/// Held until no cluster IP depends on the range alone.
pub const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "servicecidrs",
    singular: "servicecidr",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::networking::v1::ServiceCIDR>,
    openapi_schema: openapi_schema::<k8s_openapi::api::networking::v1::ServiceCIDR>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
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

/// Whether a ServiceCIDR holds its finalizer (only then does it give
/// addresses, and only then can it be kept while they are in use).
pub fn holds_finalizer(range: &Value) -> bool {
    range["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// The CIDRs of a ServiceCIDR as written.
pub fn cidrs(object: &Value) -> Vec<&str> {
    object["spec"]["cidrs"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// Upstream's `ValidateServiceCIDR` and `ValidateServiceCIDRUpdate`.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let new = cidrs(object);
    let rendered = go_strings(&new);
    if let Some(old) = old.map(cidrs) {
        let path = |i: usize| format!("spec.cidrs[{i}]");
        if old.len() == new.len() {
            let changed: Vec<Cause> = (0..new.len())
                .filter(|i| old[*i] != new[*i])
                .map(|i| Cause::invalid(&path(i), new[i], "field is immutable"))
                .collect();
            if !changed.is_empty() {
                return changed;
            }
        } else if old.len() == 1 && new.len() == 2 {
            // Single to dual stack: the first range stays.
            if old[0] != new[0] {
                return vec![Cause::invalid(&path(0), new[0], "field is immutable")];
            }
        } else {
            return vec![Cause::invalid_rendered(
                "spec.cidrs",
                &rendered,
                "field is immutable",
            )];
        }
    }
    match new.len() {
        0 => return vec![Cause::required("spec.cidrs", "at least one CIDR required")],
        1 | 2 => {}
        _ => {
            return vec![Cause::invalid_rendered(
                "spec.cidrs",
                &rendered,
                "may only hold up to 2 values",
            )]
        }
    }
    let mut causes: Vec<Cause> = new
        .iter()
        .enumerate()
        .filter_map(|(i, cidr)| {
            let problem = cidr_problem(cidr)?;
            Some(Cause::invalid(&format!("spec.cidrs[{i}]"), *cidr, &problem))
        })
        .collect();
    if new.len() == 2 && family(new[0]).is_some() && family(new[0]) == family(new[1]) {
        causes.push(Cause::invalid_rendered(
            "spec.cidrs",
            &rendered,
            "may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64",
        ));
    }
    causes
}

fn family(cidr: &str) -> Option<bool> {
    let address = cidr.split('/').next()?;
    address.parse::<IpAddr>().ok().map(|ip| ip.is_ipv4())
}

fn columns() -> Vec<Column> {
    vec![NAME, col("CIDRs", "The ranges of the ServiceCIDR.", 0), AGE]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(cidrs(object).join(",")),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(cidrs: &[&str]) -> Value {
        json!({"metadata": {"name": "extra"}, "spec": {"cidrs": cidrs}})
    }

    fn messages(object: &Value, old: Option<&Value>) -> Vec<String> {
        validate(object, old).iter().map(Cause::display).collect()
    }

    #[test]
    fn one_range_per_family_at_most_two() {
        assert!(messages(&range(&["10.100.0.0/24", "fd00:100::/112"]), None).is_empty());
        assert_eq!(
            messages(&range(&[]), None),
            ["spec.cidrs: Required value: at least one CIDR required"]
        );
        assert_eq!(
            messages(&range(&["10.100.0.0/24", "10.101.0.0/24"]), None),
            ["spec.cidrs: Invalid value: []string{\"10.100.0.0/24\", \"10.101.0.0/24\"}: may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64"]
        );
        assert_eq!(
            messages(&range(&["a", "b", "c"]), None),
            ["spec.cidrs: Invalid value: []string{\"a\", \"b\", \"c\"}: may only hold up to 2 values"]
        );
        assert_eq!(
            messages(&range(&["10.100.0.1/24"]), None),
            ["spec.cidrs[0]: Invalid value: \"10.100.0.1/24\": must not have bits set beyond the prefix length"]
        );
    }

    #[test]
    fn only_single_to_dual_stack_changes() {
        let single = range(&["10.100.0.0/24"]);
        assert!(messages(&range(&["10.100.0.0/24", "fd00:100::/112"]), Some(&single)).is_empty());
        assert_eq!(
            messages(&range(&["10.200.0.0/24"]), Some(&single)),
            ["spec.cidrs[0]: Invalid value: \"10.200.0.0/24\": field is immutable"]
        );
        assert_eq!(
            messages(&range(&["fd00:100::/112", "10.100.0.0/24"]), Some(&single)),
            ["spec.cidrs[0]: Invalid value: \"fd00:100::/112\": field is immutable"]
        );
        let dual = range(&["10.100.0.0/24", "fd00:100::/112"]);
        assert_eq!(
            messages(&single, Some(&dual)),
            ["spec.cidrs: Invalid value: []string{\"10.100.0.0/24\"}: field is immutable"]
        );
    }

    #[test]
    fn printed_as_kubectl_does() {
        let cells = cells(&range(&["10.100.0.0/24", "fd00:100::/112"]), 0);
        assert_eq!(cells[1], json!("10.100.0.0/24,fd00:100::/112"));
    }
}
