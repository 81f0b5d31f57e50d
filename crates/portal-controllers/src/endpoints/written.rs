//! What the controller wrote and its reflectors have not shown yet.
//!
//! The controller compares what it wants with its reflectors' copies instead
//! of reading the API server on every reconcile. A reflector lags behind
//! the controller's own writes by one watch event, and acting on the older
//! copy would create a second slice or fail on a stale resourceVersion. So
//! every write is remembered until the reflector has caught up with it; a
//! Service with writes in flight waits (its own write's watch event
//! re-triggers it). Like Kubernetes' endpoint-slice tracker, expectations
//! expire, so an event that never comes cannot wedge a Service.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an unmet expectation holds a Service back.
const EXPIRY: Duration = Duration::from_secs(60);

/// What the controller expects its reflector to show for one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Expected {
    /// At least this resourceVersion.
    Version(String),
    /// No object.
    Deleted,
}

impl Expected {
    /// Whether the reflector's copy (its resourceVersion, `None` if it holds
    /// no object) reflects the write. resourceVersions are opaque in
    /// Kubernetes but numeric in Portal and etcd; a newer number means a
    /// later write on top of ours.
    fn met_by(&self, seen: Option<&str>) -> bool {
        match (self, seen) {
            (Expected::Deleted, seen) => seen.is_none(),
            (Expected::Version(_), None) => false,
            (Expected::Version(want), Some(seen)) => {
                seen == want
                    || matches!(
                        (want.parse::<u64>(), seen.parse::<u64>()),
                        (Ok(want), Ok(seen)) if seen >= want
                    )
            }
        }
    }
}

/// Object name → expectation, per owning Service `(namespace, name)`.
#[derive(Debug, Default)]
pub(super) struct Written {
    by_service: HashMap<(String, String), HashMap<String, (Expected, Instant)>>,
}

impl Written {
    /// Remembers a write to object `object` on behalf of `service`.
    pub(super) fn record(&mut self, service: &(String, String), object: &str, expected: Expected) {
        self.by_service
            .entry(service.clone())
            .or_default()
            .insert(object.to_owned(), (expected, Instant::now()));
    }

    /// Whether the reflectors show every write made for `service`;
    /// `seen(object)` gives the reflector's resourceVersion of an object.
    /// Forgets the expectations that are met or expired.
    pub(super) fn caught_up(
        &mut self,
        service: &(String, String),
        seen: impl Fn(&str) -> Option<String>,
    ) -> bool {
        let Some(objects) = self.by_service.get_mut(service) else {
            return true;
        };
        objects.retain(|object, (expected, at)| {
            at.elapsed() < EXPIRY && !expected.met_by(seen(object).as_deref())
        });
        let caught_up = objects.is_empty();
        if caught_up {
            self.by_service.remove(service);
        }
        caught_up
    }

    /// Whether writes for `service` await their watch events.
    pub(super) fn pending(&self, service: &(String, String)) -> bool {
        self.by_service.contains_key(service)
    }

    /// Drops everything about a deleted Service.
    pub(super) fn forget(&mut self, service: &(String, String)) {
        self.by_service.remove(service);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> (String, String) {
        ("default".into(), "web".into())
    }

    #[test]
    fn a_write_holds_until_the_reflector_shows_it_or_a_newer_one() {
        let mut written = Written::default();
        written.record(&svc(), "web-abc", Expected::Version("10".into()));
        assert!(!written.caught_up(&svc(), |_| None));
        assert!(!written.caught_up(&svc(), |_| Some("9".into())));
        assert!(written.caught_up(&svc(), |_| Some("12".into())));
        // Met expectations are forgotten.
        assert!(written.caught_up(&svc(), |_| None));
    }

    #[test]
    fn opaque_versions_must_match_exactly() {
        let mut written = Written::default();
        written.record(&svc(), "web", Expected::Version("a1".into()));
        assert!(!written.caught_up(&svc(), |_| Some("a0".into())));
        assert!(written.caught_up(&svc(), |_| Some("a1".into())));
    }

    #[test]
    fn a_delete_holds_until_the_object_is_gone() {
        let mut written = Written::default();
        written.record(&svc(), "web-abc", Expected::Deleted);
        assert!(!written.caught_up(&svc(), |_| Some("3".into())));
        assert!(written.caught_up(&svc(), |_| None));
    }

    #[test]
    fn other_services_are_not_held() {
        let mut written = Written::default();
        written.record(&svc(), "web", Expected::Deleted);
        let other = ("default".to_owned(), "db".to_owned());
        assert!(written.caught_up(&other, |_| Some("1".into())));
        written.forget(&svc());
        assert!(written.caught_up(&svc(), |_| Some("1".into())));
    }
}
