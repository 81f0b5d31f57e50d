//! Which pods and Services carry which labels, so that a pod event finds its
//! Services, and a Service its pods, without scanning every object: the
//! controller's work per change stays proportional to what the change
//! touches, whatever the size of the cluster.

use std::collections::{BTreeMap, HashMap, HashSet};

type Labels = BTreeMap<String, String>;
/// `(namespace, key, value)`.
type Pair = (String, String, String);

#[derive(Debug, Default)]
pub(super) struct Index {
    pod_labels: HashMap<(String, String), Labels>,
    pods_by_pair: HashMap<Pair, HashSet<String>>,
    selectors: HashMap<(String, String), Labels>,
    services_by_pair: HashMap<Pair, HashSet<String>>,
}

fn pairs<'a>(namespace: &'a str, labels: &'a Labels) -> impl Iterator<Item = Pair> + 'a {
    labels
        .iter()
        .map(move |(k, v)| (namespace.to_owned(), k.clone(), v.clone()))
}

fn matches(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn unlink(map: &mut HashMap<Pair, HashSet<String>>, pair: Pair, name: &str) {
    if let Some(set) = map.get_mut(&pair) {
        set.remove(name);
        if set.is_empty() {
            map.remove(&pair);
        }
    }
}

impl Index {
    /// Records a pod's labels (`None`: the pod is gone); returns its labels
    /// before this change.
    pub(super) fn set_pod(
        &mut self,
        namespace: &str,
        name: &str,
        labels: Option<&Labels>,
    ) -> Option<Labels> {
        let key = (namespace.to_owned(), name.to_owned());
        let before = self.pod_labels.remove(&key);
        for pair in before.iter().flat_map(|l| pairs(namespace, l)) {
            unlink(&mut self.pods_by_pair, pair, name);
        }
        if let Some(labels) = labels {
            for pair in pairs(namespace, labels) {
                self.pods_by_pair
                    .entry(pair)
                    .or_default()
                    .insert(name.to_owned());
            }
            self.pod_labels.insert(key, labels.clone());
        }
        before
    }

    /// Records a Service's selector (`None` or empty: no selector, or gone).
    /// Replaces every pod with `pods` (after a re-list).
    pub(super) fn reset_pods(&mut self, pods: impl Iterator<Item = (String, String, Labels)>) {
        self.pod_labels.clear();
        self.pods_by_pair.clear();
        for (namespace, name, labels) in pods {
            self.set_pod(&namespace, &name, Some(&labels));
        }
    }

    /// Every Service with a selector, as `(namespace, name)`.
    pub(super) fn services(&self) -> Vec<(String, String)> {
        self.selectors.keys().cloned().collect()
    }

    pub(super) fn set_service(&mut self, namespace: &str, name: &str, selector: Option<&Labels>) {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(before) = self.selectors.remove(&key) {
            for pair in pairs(namespace, &before) {
                unlink(&mut self.services_by_pair, pair, name);
            }
        }
        if let Some(selector) = selector.filter(|s| !s.is_empty()) {
            for pair in pairs(namespace, selector) {
                self.services_by_pair
                    .entry(pair)
                    .or_default()
                    .insert(name.to_owned());
            }
            self.selectors.insert(key, selector.clone());
        }
    }

    /// Services in `namespace` whose selector `labels` satisfy.
    pub(super) fn services_selecting(&self, namespace: &str, labels: &Labels) -> HashSet<String> {
        let mut found = HashSet::new();
        for pair in pairs(namespace, labels) {
            for service in self.services_by_pair.get(&pair).into_iter().flatten() {
                let selector = self.selectors.get(&(namespace.to_owned(), service.clone()));
                if selector.is_some_and(|s| matches(s, labels)) {
                    found.insert(service.clone());
                }
            }
        }
        found
    }

    /// Pods in `namespace` that `selector` selects: the smallest candidate
    /// set among its pairs, then every pair checked.
    pub(super) fn pods_selected(&self, namespace: &str, selector: &Labels) -> Vec<String> {
        if selector.is_empty() {
            return Vec::new();
        }
        let smallest = pairs(namespace, selector)
            .map(|p| self.pods_by_pair.get(&p))
            .min_by_key(|s| s.map_or(0, HashSet::len));
        let Some(Some(candidates)) = smallest else {
            return Vec::new();
        };
        candidates
            .iter()
            .filter(|pod| {
                self.pod_labels
                    .get(&(namespace.to_owned(), (*pod).clone()))
                    .is_some_and(|labels| matches(selector, labels))
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn finds_both_ways_and_follows_changes() {
        let mut index = Index::default();
        index.set_service(
            "ns",
            "web",
            Some(&labels(&[("app", "web"), ("tier", "fe")])),
        );
        index.set_service("ns", "all", Some(&labels(&[("app", "web")])));
        index.set_service("other", "web", Some(&labels(&[("app", "web")])));
        index.set_pod("ns", "a", Some(&labels(&[("app", "web"), ("tier", "fe")])));
        index.set_pod("ns", "b", Some(&labels(&[("app", "web")])));
        let found = index.services_selecting("ns", &labels(&[("app", "web"), ("tier", "fe")]));
        assert_eq!(
            found,
            ["web", "all"].iter().map(|s| (*s).to_owned()).collect()
        );
        let mut pods = index.pods_selected("ns", &labels(&[("app", "web")]));
        pods.sort();
        assert_eq!(pods, ["a", "b"]);
        assert_eq!(
            index.pods_selected("ns", &labels(&[("app", "web"), ("tier", "fe")])),
            ["a"]
        );

        let before = index.set_pod("ns", "a", Some(&labels(&[("app", "moved")])));
        assert_eq!(before, Some(labels(&[("app", "web"), ("tier", "fe")])));
        assert!(index
            .pods_selected("ns", &labels(&[("app", "web"), ("tier", "fe")]))
            .is_empty());
        index.set_pod("ns", "b", None);
        assert!(index
            .pods_selected("ns", &labels(&[("app", "web")]))
            .is_empty());
        index.set_service("ns", "web", None);
        assert_eq!(
            index
                .services_selecting("ns", &labels(&[("app", "web"), ("tier", "fe")]))
                .len(),
            1
        );
    }
}
