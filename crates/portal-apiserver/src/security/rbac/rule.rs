//! One RBAC rule (`PolicyRule`): whether it allows a request, and whether
//! a set of rules covers another's (the escalation check: you may grant
//! only what you hold).

use serde_json::Value;

/// A policy rule, read from a Role's or ClusterRole's `rules`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) verbs: Vec<String>,
    pub(crate) api_groups: Vec<String>,
    pub(crate) resources: Vec<String>,
    pub(crate) resource_names: Vec<String>,
    pub(crate) non_resource_urls: Vec<String>,
}

/// What is asked, in authorization terms.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Request<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        name: Option<&'a str>,
    },
    Path {
        verb: &'a str,
        path: &'a str,
    },
}

/// The strings of a JSON list (none when it is not one).
pub(crate) fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn has(list: &[String], wanted: &str) -> bool {
    list.iter().any(|item| item == wanted)
}

impl Rule {
    pub(crate) fn from_json(rule: &Value) -> Rule {
        Rule {
            verbs: strings(&rule["verbs"]),
            api_groups: strings(&rule["apiGroups"]),
            resources: strings(&rule["resources"]),
            resource_names: strings(&rule["resourceNames"]),
            non_resource_urls: strings(&rule["nonResourceURLs"]),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub(crate) fn all_of(role: &Value) -> Vec<Rule> {
        role["rules"]
            .as_array()
            .map(|rules| rules.iter().map(Rule::from_json).collect())
            .unwrap_or_default()
    }

    fn verb_matches(&self, verb: &str) -> bool {
        has(&self.verbs, "*") || has(&self.verbs, verb)
    }

    /// Upstream's `RuleAllows`.
    pub(crate) fn allows(&self, request: &Request<'_>) -> bool {
        match *request {
            Request::Resource {
                verb,
                group,
                resource,
                subresource,
                name,
            } => {
                self.verb_matches(verb)
                    && (has(&self.api_groups, "*") || has(&self.api_groups, group))
                    && self.resource_matches(resource, subresource)
                    && (self.resource_names.is_empty()
                        || name.is_some_and(|n| !n.is_empty() && has(&self.resource_names, n)))
            }
            Request::Path { verb, path } => {
                self.verb_matches(verb)
                    && self
                        .non_resource_urls
                        .iter()
                        .any(|url| url_matches(url, path))
            }
        }
    }

    fn resource_matches(&self, resource: &str, subresource: Option<&str>) -> bool {
        let combined = match subresource {
            Some(sub) if !sub.is_empty() => format!("{resource}/{sub}"),
            _ => resource.to_owned(),
        };
        self.resources.iter().any(|rule| {
            rule == "*"
                || *rule == combined
                || subresource
                    .is_some_and(|sub| rule.strip_prefix("*/").is_some_and(|rest| rest == sub))
        })
    }
}

fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Upstream's `Covers`: whether `owner` allows everything `servant` does,
/// checked one atom (one verb, group, resource, name or URL) at a time.
/// The atoms not covered come back (empty: covered).
pub(crate) fn uncovered(owner: &[Rule], servant: &[Rule]) -> Vec<Rule> {
    let mut missing = Vec::new();
    for rule in servant {
        for atom in atoms(rule) {
            if !owner.iter().any(|o| covers(o, &atom)) {
                missing.push(atom);
            }
        }
    }
    missing
}

/// A rule broken into rules of one verb and one resource (or URL) each.
fn atoms(rule: &Rule) -> Vec<Rule> {
    let one = |s: &String| vec![s.clone()];
    let mut out = Vec::new();
    for verb in &rule.verbs {
        for url in &rule.non_resource_urls {
            out.push(Rule {
                verbs: one(verb),
                non_resource_urls: one(url),
                ..Rule::default()
            });
        }
        for group in &rule.api_groups {
            for resource in &rule.resources {
                let base = Rule {
                    verbs: one(verb),
                    api_groups: one(group),
                    resources: one(resource),
                    ..Rule::default()
                };
                if rule.resource_names.is_empty() {
                    out.push(base);
                } else {
                    for name in &rule.resource_names {
                        out.push(Rule {
                            resource_names: one(name),
                            ..base.clone()
                        });
                    }
                }
            }
        }
    }
    out
}

/// Upstream's `ruleCovers` for one atom: a literal `*` is covered only by
/// a `*`.
fn covers(owner: &Rule, atom: &Rule) -> bool {
    let verb = &atom.verbs[0];
    if !(has(&owner.verbs, "*") || has(&owner.verbs, verb)) {
        return false;
    }
    if let Some(url) = atom.non_resource_urls.first() {
        return owner.non_resource_urls.iter().any(|o| {
            o == url || o == "*" || o.strip_suffix('*').is_some_and(|p| url.starts_with(p))
        });
    }
    let (Some(group), Some(resource)) = (atom.api_groups.first(), atom.resources.first()) else {
        return false;
    };
    if !(has(&owner.api_groups, "*") || has(&owner.api_groups, group)) {
        return false;
    }
    let resource_covered = has(&owner.resources, "*")
        || has(&owner.resources, resource)
        || resource.split_once('/').is_some_and(|(parent, sub)| {
            has(&owner.resources, &format!("{parent}/*"))
                || has(&owner.resources, &format!("*/{sub}"))
        });
    if !resource_covered {
        return false;
    }
    match atom.resource_names.first() {
        _ if owner.resource_names.is_empty() => true,
        Some(name) => has(&owner.resource_names, name),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(value: Value) -> Rule {
        Rule::from_json(&value)
    }

    fn asks<'a>(
        verb: &'a str,
        resource: &'a str,
        sub: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Request<'a> {
        Request::Resource {
            verb,
            group: "",
            resource,
            subresource: sub,
            name,
        }
    }

    #[test]
    fn rules_allow_as_upstream() {
        let pods =
            rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}));
        assert!(pods.allows(&asks("list", "pods", None, None)));
        assert!(!pods.allows(&asks("delete", "pods", None, Some("p"))));
        assert!(
            !pods.allows(&asks("get", "pods", Some("log"), Some("p"))),
            "subresources are named"
        );
        let logs = rule(json!({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*/log"]}));
        assert!(logs.allows(&asks("get", "pods", Some("log"), Some("p"))));
        let named = rule(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["db"]}),
        );
        assert!(named.allows(&asks("get", "secrets", None, Some("db"))));
        assert!(!named.allows(&asks("list", "secrets", None, None)));
        let health = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        assert!(health.allows(&Request::Path {
            verb: "get",
            path: "/healthz"
        }));
        assert!(health.allows(&Request::Path {
            verb: "get",
            path: "/apis/apps/v1"
        }));
        assert!(!health.allows(&Request::Path {
            verb: "get",
            path: "/metrics"
        }));
    }

    #[test]
    fn only_held_rules_are_covered() {
        let held = vec![rule(
            json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "secrets/*"]}),
        )];
        let less = vec![rule(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods", "secrets/status"]}),
        )];
        assert!(uncovered(&held, &less).is_empty());
        let more = vec![rule(
            json!({"verbs": ["get", "delete"], "apiGroups": [""], "resources": ["pods"]}),
        )];
        assert_eq!(uncovered(&held, &more).len(), 1);
        let star = vec![rule(
            json!({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}),
        )];
        assert_eq!(
            uncovered(&held, &star).len(),
            1,
            "a * is covered only by a *"
        );
        let named = vec![rule(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["p"]}),
        )];
        assert!(uncovered(&held, &named).is_empty());
    }
}
