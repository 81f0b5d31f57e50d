//! Name and label validation with the messages Kubernetes gives, so users see
//! the same errors (`apimachinery/pkg/util/validation`).

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const LABEL_VALUE_MAX: usize = 63;

fn alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label(s: &str, first: fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && first(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn too_long(max: usize) -> String {
    format!("must be no more than {max} characters")
}

/// Problems with `value` as an RFC 1123 label (empty when valid).
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(too_long(DNS1123_LABEL_MAX));
    }
    if !is_label(value, alnum) {
        errs.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into());
    }
    errs
}

/// Problems with `value` as an RFC 1035 label (Service names).
pub fn dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        errs.push(too_long(DNS1123_LABEL_MAX));
    }
    if !is_label(value, |c| c.is_ascii_lowercase()) {
        errs.push("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into());
    }
    errs
}

/// Problems with `value` as an RFC 1123 subdomain.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(too_long(DNS1123_SUBDOMAIN_MAX));
    }
    if !value.split('.').all(|part| is_label(part, alnum)) {
        errs.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
    }
    errs
}

/// Problems with `value` as a wildcard subdomain (`*.example.com`, Ingress
/// hosts).
pub fn wildcard_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(too_long(DNS1123_SUBDOMAIN_MAX));
    }
    let valid = value
        .strip_prefix("*.")
        .is_some_and(|rest| rest.split('.').all(|part| is_label(part, alnum)));
    if !valid {
        errs.push("a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
    }
    errs
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && ok(b[0])
        && ok(b[b.len() - 1])
        && b.iter().all(|&c| ok(c) || matches!(c, b'-' | b'_' | b'.'))
}

const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// Problems with `value` as a qualified name (label and annotation keys):
/// an optional DNS subdomain prefix and `/`, then a name of at most 63.
pub fn qualified_name(value: &str) -> Vec<String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let mut errs = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".into());
        } else {
            errs.extend(
                dns1123_subdomain(prefix)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else {
        if name.len() > 63 {
            errs.push(format!("name part {}", too_long(63)));
        }
        if !is_name_part(name) {
            errs.push(NAME_PART_MSG.into());
        }
    }
    errs
}

/// Problems with `value` as a label value (may be empty).
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(too_long(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !is_name_part(value) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    errs
}

/// Upstream's `IsValidPathSegmentName`: a name that is one path segment
/// (RBAC names such as `system:node:n1` may hold colons).
pub fn path_segment(value: &str) -> Vec<String> {
    match value {
        "." => return vec!["may not be '.'".into()],
        ".." => return vec!["may not be '..'".into()],
        _ => {}
    }
    let mut problems = Vec::new();
    for bad in ["/", "%"] {
        if value.contains(bad) {
            problems.push(format!("may not contain '{bad}'"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(dns1123_label("my-name").is_empty());
        assert!(dns1123_label("123-abc").is_empty());
        assert!(!dns1123_label("My-name").is_empty());
        assert!(!dns1123_label("-a").is_empty());
        assert!(!dns1123_label(&"a".repeat(64)).is_empty());
        assert!(dns1035_label("abc-123").is_empty());
        assert!(!dns1035_label("1abc").is_empty());
        assert!(dns1123_subdomain("example.com").is_empty());
        assert!(!dns1123_subdomain("example..com").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
    }

    #[test]
    fn qualified_names_and_values() {
        assert!(qualified_name("app").is_empty());
        assert!(qualified_name("kubernetes.io/service-name").is_empty());
        assert!(!qualified_name("/app").is_empty());
        assert!(!qualified_name("a b").is_empty());
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_x").is_empty());
        assert!(!label_value("a b").is_empty());
    }
}
