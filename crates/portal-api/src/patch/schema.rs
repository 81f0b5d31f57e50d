//! Patch strategies of list fields (`patchStrategy`/`patchMergeKey` in the
//! Kubernetes types): metadata's here, each kind's in its module of
//! `crate::kinds`. Lists named nowhere are replaced whole by a strategic
//! merge patch, as upstream.

use crate::resource::Kind;

/// How a list field merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replaced whole.
    Replace,
    /// Maps merged by this key.
    MergeKey(&'static str),
    /// Primitives merged as a set (e.g. `finalizers`).
    MergePrimitives,
}

/// The strategy of the list at `path` (object field names, list items
/// skipped) in an object of `kind`: metadata's lists as for every kind,
/// the rest as the kind's definition says.
pub(super) fn list_strategy(kind: Kind, path: &[&str]) -> ListStrategy {
    match path {
        ["metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["metadata", "ownerReferences"] => ListStrategy::MergeKey("uid"),
        _ => (crate::kinds::of(kind).list_strategy)(path),
    }
}
