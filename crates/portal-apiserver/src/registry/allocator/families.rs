//! The IP family fields of a Service, defaulted for this cluster's service
//! CIDRs as Kubernetes does before it validates and allocates
//! (`normalizeClusterIPs`, `initIPFamilyFields`): a policy (SingleStack
//! unless asked, RequireDualStack for a headless Service without a
//! selector), families from the cluster IPs given, then the primary
//! family, and the other one for a dual-stack policy on a dual-stack
//! cluster. A PreferDualStack Service is never upgraded or downgraded
//! behind its owner's back when the cluster's families change.

use portal_api::cidr::IpFamily;
use portal_api::service::families::{
    cluster_ips, go_strings, ip_families, validate_related_fields,
};
use portal_api::service::HEADLESS;
use portal_api::{kinds, Cause, Resource};
use serde_json::{json, Value};

use super::Allocators;

fn external_name(svc: &Value) -> bool {
    svc["spec"]["type"].as_str() == Some("ExternalName")
}

fn owned(items: Vec<&str>) -> Vec<String> {
    items.into_iter().map(str::to_owned).collect()
}

fn headless_without_selector(svc: &Value) -> bool {
    svc["spec"]["clusterIP"].as_str() == Some(HEADLESS)
        && svc["spec"]["selector"]
            .as_object()
            .is_none_or(|s| s.is_empty())
}

fn set(svc: &mut Value, field: &str, value: Value) {
    if let Some(spec) = svc["spec"].as_object_mut() {
        if value.is_null() {
            spec.remove(field);
        } else {
            spec.insert(field.to_owned(), value);
        }
    }
}

/// Addresses in canonical text (`FD00::05` is `fd00::5`): one address has
/// one record key, and an unchanged address reads as unchanged.
fn canonical(svc: &mut Value) {
    // `get_mut`, not indexing: a missing field stays missing.
    let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let parsed = |v: &Value| {
        v.as_str()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
    };
    if let Some(ip) = spec.get("clusterIP").and_then(parsed) {
        spec.insert("clusterIP".into(), json!(ip.to_string()));
    }
    if let Some(ips) = spec.get_mut("clusterIPs").and_then(Value::as_array_mut) {
        for value in ips.iter_mut() {
            if let Some(ip) = parsed(value) {
                *value = json!(ip.to_string());
            }
        }
    }
}

/// `clusterIPs` from `clusterIP` (never the other way), as Kubernetes'
/// `normalizeClusterIPs`.
fn normalize(svc: &mut Value, old: Option<&Value>) {
    canonical(svc);
    let cluster_ip = svc["spec"]["clusterIP"].as_str().unwrap_or("").to_owned();
    let ips = owned(cluster_ips(svc));
    let Some(old) = old else {
        if !cluster_ip.is_empty() && ips.is_empty() {
            set(svc, "clusterIPs", json!([cluster_ip]));
        }
        return;
    };
    let old_ip = old["spec"]["clusterIP"].as_str().unwrap_or("");
    let old_ips = owned(cluster_ips(old));
    if !old_ips.is_empty() && ips.is_empty() && old_ip == cluster_ip {
        set(svc, "clusterIPs", json!(old_ips));
        return;
    }
    if old_ip != cluster_ip && ips == old_ips {
        if cluster_ip.is_empty() {
            set(svc, "clusterIPs", Value::Null);
        } else {
            set(svc, "clusterIPs", json!([cluster_ip]));
        }
    }
}

impl Allocators {
    /// A Service's IP family fields before it is validated and allocated
    /// (nothing for other kinds).
    pub(crate) fn prepare_families(
        &self,
        resource: &Resource,
        svc: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), Vec<Cause>> {
        if resource.kind() != kinds::service::KIND {
            return Ok(());
        }
        let old = old.map(|old| {
            let mut read = old.clone();
            self.default_on_read(&mut read);
            read
        });
        self.init_families(svc, old.as_ref())
    }

    /// The families this cluster's service CIDRs hold, primary first.
    pub(crate) fn families(&self) -> Vec<IpFamily> {
        self.ips.iter().map(|(family, _)| *family).collect()
    }

    /// A stored Service from before these fields, read as Kubernetes reads
    /// one (`defaultOnReadService`).
    pub(crate) fn default_on_read(&self, svc: &mut Value) {
        if external_name(svc) || !ip_families(svc).is_empty() {
            return;
        }
        normalize(svc, None);
        let configured = self.families();
        let (policy, families): (&str, Vec<IpFamily>) = if headless_without_selector(svc) {
            (
                "RequireDualStack",
                vec![configured[0], configured[0].other()],
            )
        } else if svc["spec"]["clusterIP"].as_str() == Some(HEADLESS) {
            ("SingleStack", vec![configured[0]])
        } else {
            let from_ips: Vec<IpFamily> = cluster_ips(svc)
                .iter()
                .filter_map(|ip| ip.parse().ok().map(IpFamily::of))
                .collect();
            let policy = if from_ips.len() > 1 {
                "RequireDualStack"
            } else {
                "SingleStack"
            };
            (policy, from_ips)
        };
        if families.is_empty() {
            return;
        }
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        set(svc, "ipFamilies", json!(names));
        if svc["spec"]["ipFamilyPolicy"].is_null() {
            set(svc, "ipFamilyPolicy", json!(policy));
        }
    }

    /// Kubernetes' `normalizeClusterIPs` and `initIPFamilyFields` on `svc`
    /// (with `old`, the stored object read as defaulted, on update).
    pub(crate) fn init_families(
        &self,
        svc: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), Vec<Cause>> {
        normalize(svc, old);
        if external_name(svc) {
            return Ok(());
        }
        if self.matching_prefer_dual_stack(svc, old) {
            return Ok(());
        }
        let configured = self.families();
        let primary = configured[0];
        let policy = match svc["spec"]["ipFamilyPolicy"].as_str() {
            Some(policy) => policy.to_owned(),
            None => match old.and_then(|o| o["spec"]["ipFamilyPolicy"].as_str()) {
                Some(policy) => policy.to_owned(),
                None if headless_without_selector(svc) => "RequireDualStack".to_owned(),
                None => "SingleStack".to_owned(),
            },
        };
        set(svc, "ipFamilyPolicy", json!(policy));
        let problems = validate_related_fields(svc);
        if !problems.is_empty() {
            return Err(problems);
        }
        let single = policy == "SingleStack";
        let mut causes = Vec::new();
        if let Some(old) = old {
            let (ips, old_ips) = (owned(cluster_ips(svc)), owned(cluster_ips(old)));
            let (families, old_families) = (owned(ip_families(svc)), owned(ip_families(old)));
            if single {
                // Releasing the secondary takes only the policy: the server
                // trims the lists the client sent back unchanged.
                if ips == old_ips && ips.len() > 1 {
                    set(svc, "clusterIPs", json!(ips[..1]));
                }
                if families == old_families && families.len() > 1 {
                    set(svc, "ipFamilies", json!(families[..1]));
                }
            } else {
                let field_policy = json!(policy);
                if !ips.is_empty() && ips.len() < old_ips.len() {
                    causes.push(Cause::invalid(
                        "spec.ipFamilyPolicy",
                        field_policy.clone(),
                        "must be 'SingleStack' to release the secondary cluster IP",
                    ));
                }
                if !families.is_empty() && families.len() < old_families.len() {
                    causes.push(Cause::invalid(
                        "spec.ipFamilyPolicy",
                        field_policy,
                        "must be 'SingleStack' to release the secondary IP family",
                    ));
                }
            }
        }
        let ips = owned(cluster_ips(svc));
        let mut families = owned(ip_families(svc));
        if single {
            if ips.len() == 2 {
                causes.push(Cause::invalid("spec.ipFamilyPolicy", json!(policy), "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified"));
            }
            if families.len() == 2 {
                causes.push(Cause::invalid("spec.ipFamilyPolicy", json!(policy), "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"));
            }
        }
        // Families follow the cluster IPs given.
        let rendered = go_strings(&ips);
        for (i, ip) in ips.iter().enumerate() {
            if ip == HEADLESS {
                break;
            }
            if i < families.len() {
                continue;
            }
            let Ok(address) = ip.parse() else { continue };
            let family = IpFamily::of(address);
            if configured.contains(&family) {
                families.push(family.name().to_owned());
            } else {
                causes.push(Cause::invalid_rendered(
                    &format!("spec.clusterIPs[{i}]"),
                    &rendered,
                    &format!("{} is not configured on this cluster", family.name()),
                ));
            }
        }
        if !causes.is_empty() {
            return Err(causes);
        }
        if headless_without_selector(svc) {
            // Allowed on any cluster: no address is allocated.
            if families.is_empty() {
                families.push(primary.name().to_owned());
            }
            if families.len() < 2 && !single {
                if let Some(first) = IpFamily::from_name(&families[0]) {
                    families.push(first.other().name().to_owned());
                }
            }
            set(svc, "ipFamilies", json!(families));
            return Ok(());
        }
        if policy == "RequireDualStack" && configured.len() < 2 {
            causes.push(Cause::invalid(
                "spec.ipFamilyPolicy",
                json!(policy),
                "this cluster is not configured for dual-stack services",
            ));
        }
        for (i, family) in families.iter().enumerate() {
            let known = IpFamily::from_name(family).is_some_and(|f| configured.contains(&f));
            if !known {
                causes.push(Cause::invalid(
                    &format!("spec.ipFamilies[{i}]"),
                    json!(family),
                    "not configured on this cluster",
                ));
            }
        }
        if !causes.is_empty() {
            return Err(causes);
        }
        if families.is_empty() {
            families.push(primary.name().to_owned());
        }
        if !single && families.len() == 1 && configured.len() == 2 {
            if let Some(first) = IpFamily::from_name(&families[0]) {
                families.push(first.other().name().to_owned());
            }
        }
        set(svc, "ipFamilies", json!(families));
        Ok(())
    }

    /// A PreferDualStack Service sent back with the fields it has: left as
    /// it is (Kubernetes' `isMatchingPreferDualStackClusterIPFields`).
    fn matching_prefer_dual_stack(&self, svc: &Value, old: Option<&Value>) -> bool {
        let Some(old) = old else { return false };
        let policy = |s: &Value| s["spec"]["ipFamilyPolicy"].as_str().map(str::to_owned);
        let kind = |s: &Value| s["spec"]["type"].as_str().unwrap_or("ClusterIP").to_owned();
        kind(svc) == kind(old)
            && matches!(
                kind(svc).as_str(),
                "ClusterIP" | "NodePort" | "LoadBalancer"
            )
            && policy(svc).as_deref() == Some("PreferDualStack")
            && matches!(policy(old).as_deref(), None | Some("PreferDualStack"))
            && cluster_ips(svc) == cluster_ips(old)
            && ip_families(svc) == ip_families(old)
    }
}
