//! HTTPRoutes compiled for one listening socket: each match of each rule
//! an [`Entry`] under the hostnames it serves, in the Gateway API's order
//! of precedence, and each rule's [`Action`] (filters, weighted backends,
//! timeouts).
//!
//! Precedence (the HTTPRoute specification): the most specific hostname
//! first (exact, then the longest wildcard, then any host); within it an
//! `Exact` path before a prefix, the longest path, a method match, the
//! most header matches, the most query matches, then the oldest route,
//! then the route's `namespace/name`, then the rule's order. A wildcard
//! (`*.example.test`) covers any number of labels.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Method;
use regex::Regex;

use crate::backends::Backend;
use crate::metrics::Label;

/// How a path is matched.
#[derive(Debug)]
pub(crate) enum PathTest {
    Exact(String),
    /// Whole path elements, trailing `/` ignored.
    Prefix(String),
    /// The whole path.
    Regex(Regex),
}

/// How a header or query value is matched.
#[derive(Debug)]
pub(crate) enum ValueTest {
    Exact(String),
    Regex(Regex),
}

impl ValueTest {
    fn holds(&self, value: &str) -> bool {
        match self {
            ValueTest::Exact(wanted) => value == wanted,
            ValueTest::Regex(regex) => regex.is_match(value),
        }
    }
}

/// One match of one rule.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) path: PathTest,
    pub(crate) method: Option<Method>,
    pub(crate) headers: Vec<(HeaderName, ValueTest)>,
    pub(crate) query: Vec<(String, ValueTest)>,
    pub(crate) action: Arc<Action>,
    /// Where it stands among entries of the same hostname (lower first).
    pub(crate) rank: Rank,
}

/// The sort key of an entry (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    pub(crate) path_kind: u8,
    pub(crate) path_length: std::cmp::Reverse<usize>,
    pub(crate) no_method: bool,
    pub(crate) headers: std::cmp::Reverse<usize>,
    pub(crate) query: std::cmp::Reverse<usize>,
    pub(crate) created: Option<jiff::Timestamp>,
    pub(crate) route: String,
    pub(crate) rule: usize,
    pub(crate) index: usize,
}

/// What a request looks like to matching.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a Method,
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
    pub(crate) headers: &'a HeaderMap,
    /// The query's pairs, parsed once when an entry first asks.
    pub(crate) pairs: std::cell::OnceCell<Vec<(String, String)>>,
}

impl<'a> Request<'a> {
    pub(crate) fn new(
        method: &'a Method,
        path: &'a str,
        query: Option<&'a str>,
        headers: &'a HeaderMap,
    ) -> Self {
        Request {
            method,
            path,
            query,
            headers,
            pairs: std::cell::OnceCell::new(),
        }
    }

    fn pairs(&self) -> &[(String, String)] {
        self.pairs.get_or_init(|| {
            form_urlencoded::parse(self.query.unwrap_or_default().as_bytes())
                .into_owned()
                .collect()
        })
    }
}

impl Entry {
    fn matches(&self, request: &Request<'_>) -> bool {
        let path = match &self.path {
            PathTest::Exact(wanted) => request.path == wanted,
            PathTest::Prefix(prefix) => prefix_matches(prefix, request.path),
            PathTest::Regex(regex) => regex.is_match(request.path),
        };
        path && self.method.as_ref().is_none_or(|m| m == request.method)
            && self.headers.iter().all(|(name, test)| {
                let mut values = request.headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (None, _) => false,
                    (Some(one), None) => one.to_str().is_ok_and(|v| test.holds(v)),
                    // Several fields of one name are one comma-joined value.
                    (Some(_), Some(_)) => {
                        let all: Vec<&str> = request
                            .headers
                            .get_all(name)
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .collect();
                        test.holds(&all.join(","))
                    }
                }
            })
            && self.query.iter().all(|(name, test)| {
                // The first value of a repeated parameter counts.
                request
                    .pairs()
                    .iter()
                    .find(|(n, _)| n == name)
                    .is_some_and(|(_, v)| test.holds(v))
            })
    }

    /// The prefix a `ReplacePrefixMatch` replaces.
    pub(crate) fn prefix(&self) -> Option<&str> {
        match &self.path {
            PathTest::Prefix(prefix) => Some(prefix),
            _ => None,
        }
    }
}

pub(crate) fn prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Header changes of a `RequestHeaderModifier` or `ResponseHeaderModifier`.
#[derive(Debug, Default)]
pub(crate) struct HeaderEdit {
    pub(crate) set: Vec<(HeaderName, HeaderValue)>,
    pub(crate) add: Vec<(HeaderName, HeaderValue)>,
    pub(crate) remove: Vec<HeaderName>,
}

impl HeaderEdit {
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
        for name in &self.remove {
            headers.remove(name);
        }
    }
}

/// A new path: the whole of it, or in place of the matched prefix.
#[derive(Debug)]
pub(crate) enum PathChange {
    Full(String),
    Prefix(String),
}

impl PathChange {
    /// The path after the change (`matched`: the prefix the entry matched).
    pub(crate) fn apply(&self, path: &str, matched: Option<&str>) -> String {
        match (self, matched) {
            (PathChange::Full(full), _) => full.clone(),
            (PathChange::Prefix(replacement), Some(prefix)) => {
                let rest = &path[prefix.trim_end_matches('/').len().min(path.len())..];
                let joined = format!("{}{rest}", replacement.trim_end_matches('/'));
                if joined.is_empty() {
                    "/".to_owned()
                } else if joined.starts_with('/') {
                    joined
                } else {
                    format!("/{joined}")
                }
            }
            (PathChange::Prefix(_), None) => path.to_owned(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct RedirectTo {
    pub(crate) scheme: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) path: Option<PathChange>,
    pub(crate) port: Option<u16>,
    pub(crate) code: u16,
}

#[derive(Debug, Default)]
pub(crate) struct RewriteTo {
    pub(crate) hostname: Option<String>,
    pub(crate) path: Option<PathChange>,
}

/// One backendRef of a rule: its weight, and its Service port's endpoints
/// (none: the reference does not resolve, its share answers 500).
#[derive(Debug)]
pub(crate) struct Weighted {
    pub(crate) weight: u32,
    pub(crate) backend: Option<Arc<Backend>>,
    pub(crate) request_headers: Option<HeaderEdit>,
    pub(crate) response_headers: Option<HeaderEdit>,
}

/// What a rule does with the requests it matches.
#[derive(Debug, Default)]
pub(crate) struct Action {
    /// `httproute/namespace/name` (metrics and logs).
    pub(crate) route: Label,
    pub(crate) request_headers: Option<HeaderEdit>,
    pub(crate) response_headers: Option<HeaderEdit>,
    pub(crate) redirect: Option<RedirectTo>,
    pub(crate) rewrite: Option<RewriteTo>,
    pub(crate) mirrors: Vec<Arc<Backend>>,
    pub(crate) backends: Vec<Weighted>,
    /// A filter Portal does not implement: the rule answers 500.
    pub(crate) unsupported: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backend_timeout: Option<Duration>,
    pub(crate) picks: AtomicU64,
}

impl Action {
    /// A backendRef chosen by weight (none: no weight at all).
    pub(crate) fn pick(&self) -> Option<&Weighted> {
        let total: u64 = self.backends.iter().map(|b| u64::from(b.weight)).sum();
        if total == 0 {
            return None;
        }
        // A hash of a counter under a per-process random key: uniform
        // enough, and no shared random generator on the hot path.
        let n = self.picks.fetch_add(1, Ordering::Relaxed);
        let mut at = random_key().hash_one(n) % total;
        for backend in &self.backends {
            let weight = u64::from(backend.weight);
            if at < weight {
                return Some(backend);
            }
            at -= weight;
        }
        None
    }
}

fn random_key() -> &'static RandomState {
    static KEY: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(RandomState::new)
}

/// Every entry of one socket, by the hostname it serves.
#[derive(Debug, Default)]
pub(crate) struct HostRoutes {
    exact: HashMap<String, Vec<Arc<Entry>>>,
    /// `*.example.test` as `.example.test`, the longest first.
    wildcards: Vec<(String, Vec<Arc<Entry>>)>,
    any: Vec<Arc<Entry>>,
    /// How many entries were added.
    count: usize,
}

impl HostRoutes {
    /// Adds an entry for a hostname (`*.` wildcard, or none: any host).
    pub(crate) fn add(&mut self, hostname: Option<&str>, entry: Arc<Entry>) {
        self.count += 1;
        match hostname {
            None => self.any.push(entry),
            Some(host) => match host.strip_prefix('*') {
                Some(suffix) => match self.wildcards.iter_mut().find(|(s, _)| s == suffix) {
                    Some((_, entries)) => entries.push(entry),
                    None => self.wildcards.push((suffix.to_owned(), vec![entry])),
                },
                None => self.exact.entry(host.to_owned()).or_default().push(entry),
            },
        }
    }

    /// Orders every list, and gives each hostname the less specific
    /// hostnames' entries after its own (a request for `a.example.test`
    /// that no route of that name matches can still match one of
    /// `*.example.test` or of any host).
    pub(crate) fn seal(&mut self) {
        let by_rank = |a: &Arc<Entry>, b: &Arc<Entry>| a.rank.cmp(&b.rank);
        self.any.sort_by(by_rank);
        for (_, entries) in &mut self.wildcards {
            entries.sort_by(by_rank);
        }
        self.wildcards
            .sort_by_key(|(suffix, _)| std::cmp::Reverse(suffix.len()));
        for (host, entries) in &mut self.exact {
            entries.sort_by(by_rank);
            for (suffix, wider) in &self.wildcards {
                if host.ends_with(suffix.as_str()) {
                    entries.extend(wider.iter().cloned());
                }
            }
            entries.extend(self.any.iter().cloned());
        }
        let wildcards = self.wildcards.clone();
        for (suffix, entries) in &mut self.wildcards {
            for (wider_suffix, wider) in &wildcards {
                if wider_suffix.len() < suffix.len() && suffix.ends_with(wider_suffix.as_str()) {
                    entries.extend(wider.iter().cloned());
                }
            }
            entries.extend(self.any.iter().cloned());
        }
    }

    /// The entry a request matches (host without port, lower case).
    pub(crate) fn find(&self, host: &str, request: &Request<'_>) -> Option<&Entry> {
        let entries = self
            .exact
            .get(host)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(suffix, _)| {
                        host.ends_with(suffix.as_str()) && host.len() > suffix.len()
                    })
                    .map(|(_, entries)| entries)
            })
            .unwrap_or(&self.any);
        entries
            .iter()
            .find(|e| e.matches(request))
            .map(|e| e.as_ref())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }
}
