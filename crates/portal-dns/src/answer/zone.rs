//! Whose name is it: the cluster domain and the reverse names of addresses
//! in the index are ours; everything else is another server's.

use hickory_proto::op::Query;
use hickory_proto::rr::DNSClass;

use crate::records::{Lookup, Records};

/// Where a question goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Answered here; the name lower-cased, with its final dot.
    Ours(String),
    /// Forwarded upstream, or refused.
    Elsewhere,
}

pub(super) fn in_class(question: &Query) -> bool {
    matches!(question.query_class(), DNSClass::IN | DNSClass::ANY)
}

pub(super) fn route(records: &Records, question: &Query) -> Route {
    let lower = question.name().to_lowercase().to_ascii();
    let lower = if lower.ends_with('.') {
        lower
    } else {
        lower + "."
    };
    let domain = records.domain();
    let in_zone = lower == domain
        || lower
            .strip_suffix(domain)
            .is_some_and(|head| head.ends_with('.'));
    // Reverse names are ours only where we hold records (not their
    // parents: `in-addr.arpa.` is not ours to answer).
    let known_reverse = !in_zone
        && (lower.ends_with(".in-addr.arpa.") || lower.ends_with(".ip6.arpa."))
        && matches!(records.lookup(&lower), Lookup::Found(_));
    if (in_zone || known_reverse) && in_class(question) {
        Route::Ours(lower)
    } else {
        Route::Elsewhere
    }
}
