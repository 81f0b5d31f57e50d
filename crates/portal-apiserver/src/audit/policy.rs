//! Kubernetes' audit policy (`audit.k8s.io/v1` `Policy`): rules tried in
//! order, the first that matches a request giving its level (`None`,
//! `Metadata`, `Request`, `RequestResponse`) and the stages to leave out;
//! no match is `None`.

use serde::Deserialize;

/// How much of a request is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<String>,
}

/// A policy file, read.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: bool,
}

/// What a request is, as the policy's rules see it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Asked<'a> {
    pub(crate) user: &'a str,
    pub(crate) groups: &'a [String],
    pub(crate) verb: &'a str,
    /// `None` for a non-resource path.
    pub(crate) resource: Option<ResourceAsked<'a>>,
    pub(crate) path: &'a str,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ResourceAsked<'a> {
    pub(crate) group: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
}

impl Policy {
    /// Reads a policy file (YAML or JSON).
    pub fn load(path: &std::path::Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let policy: Policy =
            serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if policy.kind != "Policy" || !policy.api_version.starts_with("audit.k8s.io/") {
            return Err(format!(
                "{}: not an audit.k8s.io Policy (kind {:?}, apiVersion {:?})",
                path.display(),
                policy.kind,
                policy.api_version
            ));
        }
        let stages = [
            "RequestReceived",
            "ResponseStarted",
            "ResponseComplete",
            "Panic",
        ];
        for stage in policy
            .omit_stages
            .iter()
            .chain(policy.rules.iter().flat_map(|r| &r.omit_stages))
        {
            if !stages.contains(&stage.as_str()) {
                return Err(format!("{}: unknown stage {stage:?}", path.display()));
            }
        }
        Ok(policy)
    }

    /// The level of `asked` and the stages not to record.
    pub(crate) fn level(&self, asked: &Asked<'_>) -> (Level, Vec<String>) {
        for rule in &self.rules {
            if rule.matches(asked) {
                let mut omitted = self.omit_stages.clone();
                omitted.extend(rule.omit_stages.iter().cloned());
                return (rule.level, omitted);
            }
        }
        (Level::None, Vec::new())
    }

    pub(crate) fn omit_managed_fields(&self) -> bool {
        self.omit_managed_fields
    }
}

impl Rule {
    fn matches(&self, asked: &Asked<'_>) -> bool {
        let listed =
            |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v == value);
        if !listed(&self.users, asked.user) || !listed(&self.verbs, asked.verb) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !asked.groups.iter().any(|g| self.user_groups.contains(g))
        {
            return false;
        }
        match &asked.resource {
            Some(r) => {
                // A rule for paths only says nothing of resources.
                if !self.non_resource_urls.is_empty()
                    && self.resources.is_empty()
                    && self.namespaces.is_empty()
                {
                    return false;
                }
                if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| n == r.namespace)
                {
                    return false;
                }
                self.resources.is_empty() || self.resources.iter().any(|g| g.matches(r))
            }
            None => {
                if !self.resources.is_empty() || !self.namespaces.is_empty() {
                    return false;
                }
                self.non_resource_urls.is_empty()
                    || self.non_resource_urls.iter().any(|url| {
                        url == asked.path
                            || url
                                .strip_suffix('*')
                                .is_some_and(|prefix| asked.path.starts_with(prefix))
                    })
            }
        }
    }
}

impl GroupResources {
    fn matches(&self, r: &ResourceAsked<'_>) -> bool {
        if self.group != r.group {
            return false;
        }
        let combined = match r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource),
            None => r.resource.to_owned(),
        };
        let resource_ok = self.resources.is_empty()
            || self.resources.iter().any(|name| {
                name == "*"
                    || *name == combined
                    || (r.subresource.is_some() && *name == format!("{}/*", r.resource))
                    || r.subresource.is_some_and(|sub| *name == format!("*/{sub}"))
            });
        resource_ok
            && (self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == r.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_rule_decides() {
        let policy: Policy = serde_yaml_ng::from_str(
            r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources: [{group: "", resources: [secrets]}]
- level: RequestResponse
  resources: [{group: "", resources: [configmaps]}]
- level: None
  nonResourceURLs: ["/healthz*", "/version"]
- level: Request
  userGroups: [system:authenticated]
"#,
        )
        .unwrap();
        let groups = vec!["system:authenticated".to_owned()];
        fn ask<'a>(resource: &'a str, groups: &'a [String]) -> Asked<'a> {
            Asked {
                user: "alice",
                groups,
                verb: "get",
                resource: Some(ResourceAsked {
                    resource,
                    namespace: "default",
                    ..ResourceAsked::default()
                }),
                path: "/api/v1/x",
            }
        }
        assert_eq!(policy.level(&ask("secrets", &groups)).0, Level::Metadata);
        assert_eq!(
            policy.level(&ask("configmaps", &groups)).0,
            Level::RequestResponse
        );
        assert_eq!(policy.level(&ask("pods", &groups)).0, Level::Request);
        assert_eq!(policy.level(&ask("pods", &groups)).1, ["RequestReceived"]);
        let path = Asked {
            user: "alice",
            groups: &groups,
            verb: "get",
            resource: None,
            path: "/healthz/ready",
        };
        assert_eq!(policy.level(&path).0, Level::None);
    }
}
