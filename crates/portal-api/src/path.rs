//! Parses Kubernetes REST paths into what they address, like the upstream
//! `RequestInfoFactory`: `/api/v1/namespaces/default/services/web/status`.

use percent_encoding::percent_decode_str;

/// A path that addresses resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiPath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The deprecated `/watch/` path prefix was used.
    pub watch_prefix: bool,
}

/// Splits a resource path; `None` for anything that is not one (discovery
/// documents, health endpoints, malformed paths).
pub fn parse(path: &str) -> Option<ApiPath> {
    let mut parts = Vec::new();
    let path = path.strip_prefix('/')?;
    for raw in path.strip_suffix('/').unwrap_or(path).split('/') {
        if raw.is_empty() {
            return None;
        }
        parts.push(percent_decode_str(raw).decode_utf8().ok()?.into_owned());
    }
    let (group, rest) = match parts.first().map(String::as_str) {
        Some("api") if parts.len() >= 3 => (String::new(), &parts[2..]),
        Some("apis") if parts.len() >= 4 => (parts[1].clone(), &parts[3..]),
        _ => return None,
    };
    let version = if group.is_empty() {
        parts[1].clone()
    } else {
        parts[2].clone()
    };
    let (watch_prefix, mut rest) = match rest.first().map(String::as_str) {
        Some("watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    let mut namespace = None;
    if rest.first().map(String::as_str) == Some("namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].clone());
        // `namespaces/<ns>/<resource>...`, unless the third part is a
        // subresource of the namespace object itself.
        if rest.len() > 2 && !matches!(rest[2].as_str(), "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    if rest.is_empty() || rest.len() > 3 {
        return None;
    }
    let resource = rest[0].clone();
    if resource == "namespaces" {
        namespace = None;
    }
    Some(ApiPath {
        group,
        version,
        namespace,
        resource,
        name: rest.get(1).cloned(),
        subresource: rest.get(2).cloned(),
        watch_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(path: &str) -> ApiPath {
        parse(path).unwrap_or_else(|| panic!("{path} should parse"))
    }

    #[test]
    fn core_and_group_paths() {
        let a = p("/api/v1/namespaces/default/services/web/status");
        assert_eq!((a.group.as_str(), a.version.as_str()), ("", "v1"));
        assert_eq!(a.namespace.as_deref(), Some("default"));
        assert_eq!(
            (
                a.resource.as_str(),
                a.name.as_deref(),
                a.subresource.as_deref()
            ),
            ("services", Some("web"), Some("status"))
        );

        let b = p("/apis/discovery.k8s.io/v1/endpointslices");
        assert_eq!(
            (b.group.as_str(), b.resource.as_str(), b.namespace),
            ("discovery.k8s.io", "endpointslices", None)
        );
    }

    #[test]
    fn namespaces_are_cluster_scoped_objects() {
        let a = p("/api/v1/namespaces/default");
        assert_eq!(
            (a.resource.as_str(), a.name.as_deref(), a.namespace),
            ("namespaces", Some("default"), None)
        );
        let b = p("/api/v1/namespaces/kube-system/status");
        assert_eq!(
            (
                b.resource.as_str(),
                b.name.as_deref(),
                b.subresource.as_deref()
            ),
            ("namespaces", Some("kube-system"), Some("status"))
        );
        let c = p("/api/v1/namespaces");
        assert_eq!((c.resource.as_str(), c.name), ("namespaces", None));
    }

    #[test]
    fn watch_prefix_and_rejects() {
        let a = p("/api/v1/watch/namespaces/default/pods");
        assert!(a.watch_prefix);
        assert_eq!(a.resource, "pods");
        for bad in [
            "/api",
            "/api/v1",
            "/apis/g/v1",
            "/api/v1/pods/a/b/c",
            "//api/v1/pods",
            "/api/v1//pods",
            "/healthz",
            "/api/v1/pods/%ff",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
