//! `ListOptions` as Kubernetes checks and defaults them for lists and
//! watches: `resourceVersionMatch` and `sendInitialEvents`, the streaming
//! list (KEP 3157) that client-go's reflectors use instead of a list when
//! its WatchListClient feature is on (client-go 1.35 and Helm 4 do so).
//!
//! A watch with `sendInitialEvents=true` starts with the current state as
//! ADDED events, then a BOOKMARK annotated `k8s.io/initial-events-end`
//! (when bookmarks are allowed), then the changes. Upstream defaults a
//! watch from no position or position 0 to `sendInitialEvents=true`, which
//! is the legacy behaviour plus that bookmark.

use portal_api::{Cause, Status, Target};

use crate::server::http::Query;

const NOT_OLDER_THAN: &str = "NotOlderThan";
const EXACT: &str = "Exact";

/// What a watch starts with, once its options are valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// The current state as ADDED events (then, with bookmarks allowed,
    /// the initial-events-end bookmark), then changes.
    StateFirst,
    /// Changes only: after the given position, or from now without one.
    ChangesOnly,
}

/// Checks a list's options; a 422 `Invalid` Status naming `ListOptions`
/// when they contradict each other, as upstream answers.
pub(crate) fn check_list(query: &Query) -> Result<(), Status> {
    let mut causes = Vec::new();
    let version = query.get("resourceVersion").unwrap_or("");
    let continuing = query.get("continue").is_some_and(|c| !c.is_empty());
    if let Some(matched) = query.get("resourceVersionMatch").filter(|m| !m.is_empty()) {
        if version.is_empty() {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if continuing {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if matched != EXACT && matched != NOT_OLDER_THAN {
            causes.push(Cause::unsupported(
                "resourceVersionMatch",
                matched,
                &[EXACT, NOT_OLDER_THAN, ""],
            ));
        }
        if matched == EXACT && version == "0" {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if query.get("sendInitialEvents").is_some() {
        causes.push(Cause::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    refuse_unless_empty(causes)
}

/// Checks a watch's options (after upstream's defaulting) and says how
/// the watch starts.
pub(crate) fn check_watch(query: &Query) -> Result<WatchStart, Status> {
    let version = query.get("resourceVersion").unwrap_or("");
    let mut matched = query.get("resourceVersionMatch").unwrap_or("");
    let mut initial = query
        .get("sendInitialEvents")
        .map(|_| query.flag("sendInitialEvents"));
    // SetListOptionsDefaults with WatchList on: a watch from no position
    // (or from "any") sends the state first, as it always has.
    if initial.is_none() && matched.is_empty() && (version.is_empty() || version == "0") {
        initial = Some(true);
        matched = NOT_OLDER_THAN;
    }
    let mut causes = Vec::new();
    if initial.is_some() && matched != NOT_OLDER_THAN {
        causes.push(Cause::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !matched.is_empty() {
        if initial.is_none() {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if matched != NOT_OLDER_THAN {
            causes.push(Cause::unsupported(
                "resourceVersionMatch",
                matched,
                &[NOT_OLDER_THAN],
            ));
        }
        if query.get("continue").is_some_and(|c| !c.is_empty()) {
            causes.push(Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    refuse_unless_empty(causes)?;
    Ok(if initial == Some(true) {
        WatchStart::StateFirst
    } else {
        WatchStart::ChangesOnly
    })
}

fn refuse_unless_empty(causes: Vec<Cause>) -> Result<(), Status> {
    if causes.is_empty() {
        return Ok(());
    }
    let target = Target {
        group: "meta.k8s.io",
        resource: "",
        kind: "ListOptions",
    };
    Err(Status::invalid(target, "", causes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(query: &str) -> Result<WatchStart, String> {
        check_watch(&Query::parse(Some(query))).map_err(|s| s.message)
    }

    fn list(query: &str) -> Result<(), String> {
        check_list(&Query::parse(Some(query))).map_err(|s| s.message)
    }

    #[test]
    fn watches_start_as_upstream_defaults_them() {
        assert_eq!(watch("watch=1"), Ok(WatchStart::StateFirst));
        assert_eq!(
            watch("watch=1&resourceVersion=0"),
            Ok(WatchStart::StateFirst)
        );
        assert_eq!(
            watch("watch=1&resourceVersion=12"),
            Ok(WatchStart::ChangesOnly)
        );
        assert_eq!(
            watch("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=12"),
            Ok(WatchStart::StateFirst)
        );
        assert_eq!(
            watch("watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"),
            Ok(WatchStart::ChangesOnly)
        );
    }

    #[test]
    fn contradictions_are_refused_in_upstream_words() {
        let prefix = "ListOptions.meta.k8s.io \"\" is invalid: ";
        assert_eq!(
            watch("watch=1&sendInitialEvents=true"),
            Err(format!("{prefix}resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
        );
        assert_eq!(
            watch("watch=1&resourceVersionMatch=NotOlderThan&resourceVersion=3"),
            Err(format!("{prefix}resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
        );
        assert_eq!(
            watch("watch=1&sendInitialEvents=true&resourceVersionMatch=Exact"),
            Err(format!("{prefix}[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"))
        );
        assert_eq!(
            list("sendInitialEvents=true"),
            Err(format!(
                "{prefix}sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
            ))
        );
        assert_eq!(
            list("resourceVersionMatch=Exact&resourceVersion=0"),
            Err(format!("{prefix}resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""))
        );
        assert_eq!(
            list("resourceVersionMatch=NotOlderThan"),
            Err(format!("{prefix}resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"))
        );
        assert_eq!(
            list("resourceVersionMatch=NotOlderThan&resourceVersion=5"),
            Ok(())
        );
    }
}
