//! RBAC, Kubernetes' authorizer for everyone but superusers and (first)
//! nodes: Roles and ClusterRoles hold rules, RoleBindings and
//! ClusterRoleBindings grant them to users, groups and service accounts.
//!
//! Every request is authorized, so the bindings are not read per request:
//! an index from each subject to the rules granted to it (and where) is
//! built from the watch cache and rebuilt whenever one of the four kinds
//! changes. A request then costs a few hash lookups and the rule checks of
//! the subjects it names.

pub(crate) mod bootstrap;
pub(crate) mod escalation;
pub(crate) mod rule;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use portal_api::kinds::{cluster_role, cluster_role_binding, role, role_binding, service_account};
use portal_api::Kind;
use portal_store::Revision;
use serde_json::Value;

use crate::registry::cache::WatchCache;
use crate::security::user::User;
pub(crate) use rule::{Request, Rule};

/// The kinds the index is made of.
const KINDS: [Kind; 4] = [
    role::KIND,
    cluster_role::KIND,
    role_binding::KIND,
    cluster_role_binding::KIND,
];

/// Rules granted by one binding: everywhere (a ClusterRoleBinding) or in
/// one namespace (a RoleBinding).
#[derive(Debug)]
struct Grant {
    namespace: Option<String>,
    rules: Arc<[Rule]>,
}

/// Subject → what it is granted, as of one revision.
#[derive(Debug, Default)]
struct Index {
    /// `None` until first built.
    built_at: Option<Revision>,
    users: HashMap<String, Vec<Grant>>,
    groups: HashMap<String, Vec<Grant>>,
}

/// The RBAC authorizer.
pub(crate) struct Rbac {
    cache: Arc<WatchCache>,
    index: RwLock<Arc<Index>>,
    /// One rebuild at a time; the others wait for it and use its result.
    rebuilding: Mutex<()>,
}

impl Rbac {
    pub(crate) fn new(cache: Arc<WatchCache>) -> Rbac {
        Rbac {
            cache,
            index: RwLock::new(Arc::new(Index::default())),
            rebuilding: Mutex::new(()),
        }
    }

    /// The index as of the cache's latest change of the RBAC kinds.
    fn current(&self) -> Arc<Index> {
        let changed = self.cache.changed(&KINDS);
        let index = self.index.read().clone();
        if index.built_at.is_some_and(|built| built >= changed) {
            return index;
        }
        let _one = self.rebuilding.lock();
        let index = self.index.read().clone();
        if index.built_at.is_some_and(|built| built >= changed) {
            return index;
        }
        let fresh = Arc::new(self.build(changed));
        *self.index.write() = fresh.clone();
        fresh
    }

    fn build(&self, built_at: Revision) -> Index {
        let all = |resource: &'static portal_api::Resource| {
            let (items, _, _) =
                self.cache
                    .list(resource, &resource.list_prefix(None), None, 0, |_| true);
            items
        };
        let mut roles: HashMap<(String, String), Arc<[Rule]>> = HashMap::new();
        for item in all(&role::RESOURCE) {
            let (namespace, name) = namespace_and_name(&item.value);
            roles.insert((namespace, name), Rule::all_of(&item.value).into());
        }
        let mut cluster_roles: HashMap<String, Arc<[Rule]>> = HashMap::new();
        for item in all(&cluster_role::RESOURCE) {
            let (_, name) = namespace_and_name(&item.value);
            cluster_roles.insert(name, Rule::all_of(&item.value).into());
        }
        let mut index = Index {
            built_at: Some(built_at),
            ..Index::default()
        };
        let bindings = all(&cluster_role_binding::RESOURCE)
            .into_iter()
            .chain(all(&role_binding::RESOURCE));
        for binding in bindings {
            let value = &binding.value;
            let (namespace, _) = namespace_and_name(value);
            let role_name = value["roleRef"]["name"].as_str().unwrap_or("").to_owned();
            let rules = match value["roleRef"]["kind"].as_str() {
                Some("ClusterRole") => cluster_roles.get(&role_name).cloned(),
                Some("Role") if !namespace.is_empty() => {
                    roles.get(&(namespace.clone(), role_name)).cloned()
                }
                _ => None,
            };
            // A binding to a role that does not exist (yet) grants nothing.
            let Some(rules) = rules else { continue };
            let scope = (!namespace.is_empty()).then_some(namespace.clone());
            for subject in value["subjects"].as_array().into_iter().flatten() {
                let name = subject["name"].as_str().unwrap_or("");
                let (map, key) = match subject["kind"].as_str() {
                    Some("User") => (&mut index.users, name.to_owned()),
                    Some("Group") => (&mut index.groups, name.to_owned()),
                    Some("ServiceAccount") => {
                        let sa_namespace = subject["namespace"]
                            .as_str()
                            .filter(|ns| !ns.is_empty())
                            .unwrap_or(&namespace);
                        (
                            &mut index.users,
                            service_account::user_name(sa_namespace, name),
                        )
                    }
                    _ => continue,
                };
                map.entry(key).or_default().push(Grant {
                    namespace: scope.clone(),
                    rules: rules.clone(),
                });
            }
        }
        index
    }

    /// Whether a binding grants `user` a rule that allows `request` in
    /// `namespace` (`None`: a cluster-scoped request or a path).
    pub(crate) fn allows(
        &self,
        user: &User,
        namespace: Option<&str>,
        request: &Request<'_>,
    ) -> bool {
        let index = self.current();
        let allowed = grants_of(&index, user).any(|grant| {
            (grant.namespace.is_none() || grant.namespace.as_deref() == namespace)
                && grant.rules.iter().any(|rule| rule.allows(request))
        });
        allowed
    }

    /// Every rule `user` holds in `namespace` (with the cluster-wide ones):
    /// `SelfSubjectRulesReview` and the escalation check.
    pub(crate) fn rules_of(&self, user: &User, namespace: Option<&str>) -> Vec<Rule> {
        let index = self.current();
        let mut rules: Vec<Rule> = Vec::new();
        for grant in grants_of(&index, user) {
            if grant.namespace.is_none() || grant.namespace.as_deref() == namespace {
                for rule in grant.rules.iter() {
                    if !rules.contains(rule) {
                        rules.push(rule.clone());
                    }
                }
            }
        }
        rules
    }
}

fn grants_of<'i>(index: &'i Index, user: &'i User) -> impl Iterator<Item = &'i Grant> {
    index
        .users
        .get(&user.name)
        .into_iter()
        .chain(user.groups.iter().filter_map(|g| index.groups.get(g)))
        .flatten()
}

fn namespace_and_name(object: &Value) -> (String, String) {
    let field = |f: &str| object["metadata"][f].as_str().unwrap_or("").to_owned();
    (field("namespace"), field("name"))
}
