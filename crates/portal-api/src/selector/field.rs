//! Field selectors: `metadata.name=x,spec.nodeName!=y`. Which fields a
//! resource supports is the API server's business; this parses and matches.

/// One `field=value` or `field!=value` term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

/// Splits on `sep` where it is not escaped with `\`.
fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in input.chars() {
        let last = parts.last_mut().expect("parts is never empty");
        if escaped {
            last.push('\\');
            last.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(String::new());
        } else {
            last.push(c);
        }
    }
    if escaped {
        if let Some(last) = parts.last_mut() {
            last.push('\\');
        }
    }
    parts
}

fn unescape(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            if c == '=' || c == ',' {
                return Err(format!(
                    "invalid field selector value {value:?}: unescaped {c:?}"
                ));
            }
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(e @ ('\\' | ',' | '=')) => out.push(e),
            _ => {
                return Err(format!(
                    "invalid field selector value {value:?}: invalid escape sequence"
                ))
            }
        }
    }
    Ok(out)
}

impl FieldSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        if input.len() > super::label::MAX_SELECTOR_LEN {
            return Err("field selector too long".into());
        }
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(FieldSelector { requirements });
        }
        for term in split_unescaped(input, ',') {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!(
                    "invalid selector: '{input}'; empty field in '{term}'"
                ));
            }
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                value: unescape(value)?,
                negated,
            });
        }
        Ok(FieldSelector { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The value required for `field` by an equality term, if any (lets a
    /// server narrow a list by name or namespace before matching).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && !r.negated)
            .map(|r| r.value.as_str())
    }

    /// Whether the object's fields, looked up through `get` (absent fields
    /// read as ""), satisfy every term.
    pub fn matches(&self, get: impl Fn(&str) -> String) -> bool {
        self.requirements
            .iter()
            .all(|r| (get(&r.field) == r.value) != r.negated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let s = FieldSelector::parse(
            "involvedObject.name=web,involvedObject.kind==Service,status.phase!=Failed",
        )
        .unwrap();
        assert_eq!(s.requirements.len(), 3);
        assert_eq!(s.required_value("involvedObject.name"), Some("web"));
        let get = |f: &str| match f {
            "involvedObject.name" => "web".to_owned(),
            "involvedObject.kind" => "Service".to_owned(),
            _ => String::new(),
        };
        assert!(s.matches(get));
        assert!(!FieldSelector::parse("metadata.name=other")
            .unwrap()
            .matches(get));
    }

    #[test]
    fn escapes() {
        let s = FieldSelector::parse(r"metadata.name=a\,b,x=y").unwrap();
        assert_eq!(s.requirements[0].value, "a,b");
        assert!(FieldSelector::parse("nonsense").is_err());
        assert!(FieldSelector::parse("=x").is_err());
        assert!(FieldSelector::parse("a=b=c").is_err());
        assert!(FieldSelector::parse("").unwrap().is_empty());
    }
}
