//! Serving the kinds CustomResourceDefinitions define: the registry is
//! made to match the definitions in the watch cache whenever they change
//! (checked cheaply, by the revision of their last change, on every cache
//! advance and when a URL names nothing served). A definition is built
//! into resources once per generation; one whose names clash with a kind
//! served before it (built-in, or an older definition) is not served, and
//! its status says why (`duties::definitions`).

use std::collections::HashMap;

use parking_lot::Mutex;
use portal_api::kinds::custom_resource_definition as crd;
use portal_api::Resource;
use portal_store::Revision;
use serde_json::Value;

use crate::ApiState;

/// What was made of the definitions at the last change seen.
#[derive(Debug, Default)]
pub(crate) struct Defined {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The definitions' last change, as the cache saw it.
    revision: Option<Revision>,
    /// By definition UID: its generation and its resources.
    built: HashMap<String, (i64, Vec<&'static Resource>)>,
    /// Definitions not served, by name, and why.
    refused: HashMap<String, String>,
}

impl Defined {
    /// Why the definition `name` is not served, if it is not.
    pub(crate) fn refusal(&self, name: &str) -> Option<String> {
        self.seen.lock().refused.get(name).cloned()
    }
}

/// Makes the registry serve what the definitions in the cache define, if
/// they changed since the last call.
pub(crate) fn sync(state: &ApiState) {
    let changed = state.cache.changed(&[crd::KIND]);
    let mut seen = state.defined.seen.lock();
    if seen.revision == Some(changed) {
        return;
    }
    let prefix = crd::RESOURCE.key_prefix();
    let (definitions, _, _) = state.cache.list(&crd::RESOURCE, &prefix, None, 0, |_| true);
    let mut definitions: Vec<&Value> = definitions.iter().map(|d| &d.value).collect();
    // The oldest definition keeps a contested name, as upstream.
    definitions.sort_by_key(|d| {
        (
            d["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            d["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        )
    });
    let mut built = HashMap::new();
    let mut refused = HashMap::new();
    let mut served = Vec::new();
    // Each definition is tried on what is served so far, whole or not at
    // all.
    let mut trial = portal_api::registry::Registry::built_in();
    for definition in definitions {
        let name = definition["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let uid = definition["metadata"]["uid"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let generation = definition["metadata"]["generation"].as_i64().unwrap_or(0);
        let resources = match seen.built.remove(&uid) {
            Some((at, resources)) if at == generation => resources,
            _ => match portal_api::custom::resources(definition) {
                Ok(resources) => resources,
                Err(problem) => {
                    refused.insert(name, problem);
                    continue;
                }
            },
        };
        let mut next = trial.clone();
        match resources.iter().try_for_each(|r| next.add(r)) {
            Ok(()) => {
                trial = next;
                served.extend(resources.iter().copied());
            }
            Err(error) => {
                refused.insert(name, error.to_string());
            }
        }
        built.insert(uid, (generation, resources));
    }
    portal_api::registry::set_defined(&served);
    state
        .cache
        .follow_registry(&portal_api::registry::current());
    *seen = Seen {
        revision: Some(changed),
        built,
        refused,
    };
}

/// Keeps the registry in step with the definitions for as long as the
/// server runs.
pub(crate) async fn follow(state: std::sync::Weak<ApiState>) {
    let Some(mut advanced) = state.upgrade().map(|s| s.cache.subscribe()) else {
        return;
    };
    loop {
        match state.upgrade() {
            Some(state) => sync(&state),
            None => return,
        }
        if advanced.changed().await.is_err() {
            return;
        }
    }
}
