//! Label queries over pods as the scheduling plugins ask them: selector
//! conjunctions, and pods' affinity terms parsed once.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, WeightedPodAffinityTerm};
use kube::ResourceExt;
use portal_api::selector::LabelSelector;

/// A conjunction of label selectors (each must match); empty matches
/// every pod.
#[derive(Clone, Debug, Default)]
pub struct Selection(pub Vec<LabelSelector>);

impl Selection {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0
            .iter()
            .all(|s| s.matches(|key| labels.get(key).map(String::as_str)))
    }
}

/// A `metav1.LabelSelector` from a typed one; `None` for none (which
/// selects no pod) or one that does not parse.
pub fn selector_of(
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> Option<LabelSelector> {
    crate::label_selector(selector?)
}

/// A selector given as a plain label map (Services, ReplicationControllers).
pub fn map_selector(labels: &BTreeMap<String, String>) -> Option<LabelSelector> {
    LabelSelector::from_api(
        &serde_json::json!({ "matchLabels": labels }),
        "spec.selector",
    )
    .ok()
}

/// `key=value` for each of `keys` the pod has: what `matchLabelKeys` adds
/// to a selector.
pub fn label_keys_selector(pod: &Pod, keys: Option<&Vec<String>>) -> Option<LabelSelector> {
    let labels = pod.labels();
    let parts: Vec<String> = keys
        .into_iter()
        .flatten()
        .filter_map(|key| labels.get(key).map(|value| format!("{key}={value}")))
        .collect();
    if parts.is_empty() {
        return None;
    }
    LabelSelector::parse(&parts.join(",")).ok()
}

/// A parsed affinity term of a pod.
#[derive(Debug)]
pub struct Term {
    /// `None`: no label selector, which matches no pod.
    selection: Option<Selection>,
    /// `None`: every namespace.
    namespaces: Option<Vec<String>>,
    /// Shared, so the domains it names are keyed without copies.
    pub topology_key: Arc<str>,
    pub weight: i64,
}

impl Term {
    /// The term as `owner` (the pod that has it) means it.
    fn new(term: &PodAffinityTerm, owner: &Pod, weight: i64) -> Term {
        let selection = selector_of(term.label_selector.as_ref()).map(|s| {
            let mut all = vec![s];
            all.extend(label_keys_selector(owner, term.match_label_keys.as_ref()));
            Selection(all)
        });
        let listed = term.namespaces.clone().unwrap_or_default();
        // An empty namespace selector means every namespace; a non-empty
        // one needs namespace labels, which this scheduler does not read,
        // so only the listed namespaces count then.
        let every = term
            .namespace_selector
            .as_ref()
            .is_some_and(|s| s.match_labels.is_none() && s.match_expressions.is_none());
        let namespaces = if every {
            None
        } else if listed.is_empty() && term.namespace_selector.is_none() {
            Some(vec![owner.namespace().unwrap_or_default()])
        } else {
            Some(listed)
        };
        Term {
            selection,
            namespaces,
            topology_key: term.topology_key.as_str().into(),
            weight,
        }
    }

    pub fn matches(&self, pod: &Pod) -> bool {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.namespaces
            .as_ref()
            .is_none_or(|n| n.iter().any(|ns| ns == namespace))
            && self
                .selection
                .as_ref()
                .is_some_and(|s| s.matches(pod.labels()))
    }
}

/// A pod's affinity terms, by kind.
#[derive(Debug, Default)]
pub struct Terms {
    pub affinity: Vec<Term>,
    pub anti_affinity: Vec<Term>,
    pub preferred_affinity: Vec<Term>,
    pub preferred_anti_affinity: Vec<Term>,
}

impl Terms {
    pub fn of(pod: &Pod) -> Terms {
        let Some(affinity) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return Terms::default();
        };
        let required = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<Term> {
            terms
                .into_iter()
                .flatten()
                .map(|t| Term::new(t, pod, 0))
                .collect()
        };
        let preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>| -> Vec<Term> {
            terms
                .into_iter()
                .flatten()
                .map(|t| Term::new(&t.pod_affinity_term, pod, i64::from(t.weight)))
                .collect()
        };
        let near = affinity.pod_affinity.as_ref();
        let away = affinity.pod_anti_affinity.as_ref();
        Terms {
            affinity: required(near.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            anti_affinity: required(away.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity: preferred(near.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity: preferred(away.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty()
    }
}
