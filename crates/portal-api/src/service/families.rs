//! The cluster IP fields of a Service (`clusterIP`, `clusterIPs`,
//! `ipFamilies`, `ipFamilyPolicy`): what Kubernetes checks whatever the
//! cluster's configuration (`ValidateServiceClusterIPsRelatedFields`), and
//! what an update may change (a secondary family added or released, never
//! the primary). The defaults that depend on the cluster's families are
//! the API server's (its allocator).

use std::net::IpAddr;

use serde_json::{json, Value};

use crate::cidr::IpFamily;
use crate::Cause;

use crate::ip_text::IP_HINT;
const POLICIES: [&str; 3] = ["PreferDualStack", "RequireDualStack", "SingleStack"];

/// Go's `%#v` of a string slice, as Kubernetes prints `clusterIPs`.
pub fn go_strings<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| json!(s.as_ref()).to_string())
        .collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().map(|v| v.as_str().unwrap_or("")).collect())
        .unwrap_or_default()
}

/// `spec.clusterIPs` of a Service.
pub fn cluster_ips(svc: &Value) -> Vec<&str> {
    strings(&svc["spec"]["clusterIPs"])
}

/// `spec.ipFamilies` of a Service.
pub fn ip_families(svc: &Value) -> Vec<&str> {
    strings(&svc["spec"]["ipFamilies"])
}

/// Go's `%#v` of `[]core.IPFamily`, as Kubernetes prints `ipFamilies`.
fn go_families(families: &[&str]) -> String {
    let quoted: Vec<String> = families.iter().map(|f| json!(f).to_string()).collect();
    format!("[]core.IPFamily{{{}}}", quoted.join(", "))
}

fn is_external_name(svc: &Value) -> bool {
    svc["spec"]["type"].as_str() == Some("ExternalName")
}

/// `clusterIPs` exactly `["None"]`.
fn is_headless(svc: &Value) -> bool {
    cluster_ips(svc) == [super::HEADLESS]
}

fn family_of(ip: &str) -> Option<IpFamily> {
    ip.parse::<IpAddr>().ok().map(IpFamily::of)
}

/// Kubernetes' `ValidateServiceClusterIPsRelatedFields` (not for
/// ExternalName Services, which have none of these fields).
pub fn validate_related_fields(svc: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if is_external_name(svc) {
        return causes;
    }
    let spec = &svc["spec"];
    let ips = cluster_ips(svc);
    let rendered = go_strings(&ips);
    let cluster_ip = spec["clusterIP"].as_str().unwrap_or("");
    if !cluster_ip.is_empty() {
        if ips.is_empty() {
            causes.push(Cause::required("spec.clusterIPs", ""));
        } else if ips[0] != cluster_ip {
            causes.push(Cause::invalid_rendered(
                "spec.clusterIPs",
                &rendered,
                "first value must match `clusterIP`",
            ));
        }
    } else if !ips.is_empty() {
        causes.push(Cause::invalid_rendered(
            "spec.clusterIPs",
            &rendered,
            "must be empty when `clusterIP` is not specified",
        ));
    }
    let families = ip_families(svc);
    for (i, family) in families.iter().enumerate() {
        let field = format!("spec.ipFamilies[{i}]");
        if IpFamily::from_name(family).is_none() {
            causes.push(Cause::unsupported(&field, *family, &["IPv4", "IPv6"]));
        } else if families[..i].contains(family) {
            causes.push(Cause::duplicate(&field, *family));
        }
    }
    if let Some(policy) = spec["ipFamilyPolicy"].as_str() {
        if !matches!(
            policy,
            "SingleStack" | "PreferDualStack" | "RequireDualStack"
        ) {
            causes.push(Cause::unsupported("spec.ipFamilyPolicy", policy, &POLICIES));
        }
    }
    let mut all_valid = true;
    for (i, ip) in ips.iter().enumerate() {
        if *ip == super::HEADLESS {
            if i == 0 && ips.len() > 1 {
                causes.push(Cause::invalid_rendered(
                    "spec.clusterIPs",
                    &rendered,
                    "'None' must be the first and only value",
                ));
            }
            if i == 0 {
                continue;
            }
        }
        if family_of(ip).is_none() {
            all_valid = false;
            causes.push(Cause::invalid(
                &format!("spec.clusterIPs[{i}]"),
                *ip,
                IP_HINT,
            ));
        }
    }
    if ips.len() > 2 {
        causes.push(Cause::invalid_rendered(
            "spec.clusterIPs",
            &rendered,
            "may only hold up to 2 values",
        ));
    }
    if !all_valid {
        return causes;
    }
    if ips.len() == 2 && family_of(ips[0]).is_some() && family_of(ips[0]) == family_of(ips[1]) {
        causes.push(Cause::invalid_rendered(
            "spec.clusterIPs",
            &rendered,
            "may specify no more than one IP for each IP family",
        ));
    }
    if !is_headless(svc) && !families.is_empty() {
        for (i, (ip, family)) in ips.iter().zip(&families).enumerate() {
            let (Some(actual), Some(wanted)) = (family_of(ip), IpFamily::from_name(family)) else {
                continue;
            };
            if actual != wanted {
                causes.push(Cause::invalid(
                    &format!("spec.clusterIPs[{i}]"),
                    *ip,
                    &format!(
                        "expected an {} value as indicated by `ipFamilies[{i}]`",
                        wanted.name()
                    ),
                ));
            }
        }
    }
    causes
}

/// ExternalName Services hold none of the cluster IP fields.
pub fn validate_external_name(svc: &Value) -> Vec<Cause> {
    if !is_external_name(svc) {
        return Vec::new();
    }
    let spec = &svc["spec"];
    let set = |field: &str| match &spec[field] {
        Value::Null => false,
        Value::Array(items) => !items.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    ["clusterIPs", "ipFamilies", "ipFamilyPolicy"]
        .into_iter()
        .filter(|field| set(field))
        .map(|field| {
            Cause::forbidden(
                &format!("spec.{field}"),
                "may not be set for ExternalName services",
            )
        })
        .collect()
}

/// What an update may change (Kubernetes' `validateUpgradeDowngrade*`):
/// the primary cluster IP and family never; the secondary only with the
/// policy that goes with it.
pub fn validate_update(svc: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if is_external_name(svc) || is_external_name(old) {
        return causes;
    }
    let single = svc["spec"]["ipFamilyPolicy"].as_str() == Some("SingleStack");
    let (new_ips, old_ips) = (cluster_ips(svc), cluster_ips(old));
    let rendered = go_strings(&new_ips);
    if !(is_headless(svc) && is_headless(old)) {
        if new_ips.len() == old_ips.len() {
            for (i, (a, b)) in new_ips.iter().zip(&old_ips).enumerate() {
                if a != b {
                    causes.push(Cause::invalid_rendered(
                        &format!("spec.clusterIPs[{i}]"),
                        &rendered,
                        "may not change once set",
                    ));
                }
            }
        } else if new_ips.len() < old_ips.len() {
            if new_ips.is_empty() {
                causes.push(Cause::invalid_rendered(
                    "spec.clusterIPs[0]",
                    &rendered,
                    "primary clusterIP can not be unset",
                ));
            } else if new_ips[0] != old_ips[0] {
                causes.push(Cause::invalid_rendered(
                    "spec.clusterIPs[0]",
                    &rendered,
                    "may not change once set",
                ));
            }
            if new_ips.len() == 1 && !single {
                causes.push(Cause::invalid(
                    "spec.ipFamilyPolicy",
                    svc["spec"]["ipFamilyPolicy"].clone(),
                    "must be set to 'SingleStack' when releasing the secondary clusterIP",
                ));
            }
        } else if !old_ips.is_empty() && new_ips[0] != old_ips[0] {
            causes.push(Cause::invalid_rendered(
                "spec.clusterIPs[0]",
                &rendered,
                "may not change once set",
            ));
        }
    }
    let headless_changed = is_headless(svc) != is_headless(old);
    if !headless_changed && !is_headless(svc) {
        let (new_families, old_families) = (ip_families(svc), ip_families(old));
        let families = go_families(&new_families);
        let first_changed = !new_families.is_empty()
            && !old_families.is_empty()
            && new_families[0] != old_families[0];
        if new_families.len() == old_families.len() {
            if new_families != old_families {
                causes.push(Cause::invalid_rendered(
                    "spec.ipFamilies[0]",
                    &families,
                    "may not change once set",
                ));
            }
        } else if new_families.len() < old_families.len() {
            // Kubernetes checks the cluster IPs here, not the families.
            if new_ips.is_empty() {
                causes.push(Cause::invalid_rendered(
                    "spec.ipFamilies[0]",
                    &families,
                    "primary ipFamily can not be unset",
                ));
            } else if first_changed {
                causes.push(Cause::invalid_rendered(
                    "spec.ipFamilies[0]",
                    &rendered,
                    "may not change once set",
                ));
            }
            if new_families.len() == 1 && !single {
                causes.push(Cause::invalid(
                    "spec.ipFamilyPolicy",
                    svc["spec"]["ipFamilyPolicy"].clone(),
                    "must be set to 'SingleStack' when releasing the secondary ipFamily",
                ));
            }
        } else if first_changed {
            causes.push(Cause::invalid_rendered(
                "spec.ipFamilies[0]",
                &families,
                "may not change once set",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "s"}, "spec": spec})
    }

    fn shown(causes: Vec<Cause>) -> Vec<String> {
        causes.iter().map(Cause::display).collect()
    }

    #[test]
    fn related_fields_as_kubernetes_checks_them() {
        assert!(validate_related_fields(&svc(json!({
            "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00::5"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"
        })))
        .is_empty());
        assert_eq!(
            shown(validate_related_fields(&svc(json!({"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.6"]})))),
            ["spec.clusterIPs: Invalid value: []string{\"10.96.0.6\"}: first value must match `clusterIP`"]
        );
        assert_eq!(
            shown(validate_related_fields(&svc(json!({"clusterIPs": ["10.96.0.6"]})))),
            ["spec.clusterIPs: Invalid value: []string{\"10.96.0.6\"}: must be empty when `clusterIP` is not specified"]
        );
        assert_eq!(
            shown(validate_related_fields(&svc(json!({
                "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "10.96.0.6"],
                "ipFamilies": ["IPv4", "IPv4"], "ipFamilyPolicy": "Sometimes"
            })))),
            [
                "spec.ipFamilies[1]: Duplicate value: \"IPv4\"",
                "spec.ipFamilyPolicy: Unsupported value: \"Sometimes\": supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\"",
                "spec.clusterIPs: Invalid value: []string{\"10.96.0.5\", \"10.96.0.6\"}: may specify no more than one IP for each IP family",
            ]
        );
        assert_eq!(
            shown(validate_related_fields(&svc(json!({
                "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"], "ipFamilies": ["IPv6"]
            })))),
            ["spec.clusterIPs[0]: Invalid value: \"10.96.0.5\": expected an IPv6 value as indicated by `ipFamilies[0]`"]
        );
        assert_eq!(
            shown(validate_related_fields(&svc(json!({"clusterIP": "None", "clusterIPs": ["None", "10.96.0.5"]})))),
            ["spec.clusterIPs: Invalid value: []string{\"None\", \"10.96.0.5\"}: 'None' must be the first and only value"]
        );
        assert_eq!(
            shown(validate_related_fields(&svc(json!({"clusterIP": "10.96.0.x", "clusterIPs": ["10.96.0.x"]})))),
            ["spec.clusterIPs[0]: Invalid value: \"10.96.0.x\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
        );
    }

    #[test]
    fn external_names_hold_no_cluster_ip_fields() {
        let bad = svc(
            json!({"type": "ExternalName", "clusterIPs": ["10.96.0.5"], "ipFamilyPolicy": "SingleStack"}),
        );
        assert_eq!(
            shown(validate_external_name(&bad)),
            [
                "spec.clusterIPs: Forbidden: may not be set for ExternalName services",
                "spec.ipFamilyPolicy: Forbidden: may not be set for ExternalName services",
            ]
        );
    }

    #[test]
    fn updates_add_or_release_only_the_secondary() {
        let dual = svc(json!({
            "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00::5"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"
        }));
        let single = svc(json!({
            "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"
        }));
        assert!(validate_update(&dual, &single).is_empty(), "upgrade");
        assert!(validate_update(&single, &dual).is_empty(), "downgrade");
        let mut half = single.clone();
        half["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
        assert_eq!(
            shown(validate_update(&half, &dual)),
            [
                "spec.ipFamilyPolicy: Invalid value: \"PreferDualStack\": must be set to 'SingleStack' when releasing the secondary clusterIP",
                "spec.ipFamilyPolicy: Invalid value: \"PreferDualStack\": must be set to 'SingleStack' when releasing the secondary ipFamily",
            ]
        );
        let mut moved = single.clone();
        moved["spec"]["clusterIP"] = json!("10.96.0.6");
        moved["spec"]["clusterIPs"] = json!(["10.96.0.6"]);
        assert_eq!(
            shown(validate_update(&moved, &single)),
            ["spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.6\"}: may not change once set"]
        );
        let mut flipped = single.clone();
        flipped["spec"]["ipFamilies"] = json!(["IPv6"]);
        assert_eq!(
            shown(validate_update(&flipped, &single)),
            ["spec.ipFamilies[0]: Invalid value: []core.IPFamily{\"IPv6\"}: may not change once set"]
        );
    }
}
