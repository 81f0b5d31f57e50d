//! Label selectors: `a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`,
//! `a>1`, `a<1`, comma-separated, all of which must hold.

use crate::name;

/// Longest selector string accepted; bounds parsing work per request.
pub const MAX_SELECTOR_LEN: usize = 16 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    In,
    NotIn,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    In,
    NotIn,
    Open,
    Close,
    Comma,
}

fn special(c: char) -> bool {
    c.is_whitespace() || matches!(c, '!' | '=' | ',' | '(' | ')' | '<' | '>')
}

fn lex(input: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::NotEq
            }
            '!' => Token::Not,
            '=' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::DoubleEq
            }
            '=' => Token::Eq,
            '>' => Token::Gt,
            '<' => Token::Lt,
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            c => {
                let mut ident = String::from(c);
                while let Some(&next) = chars.peek() {
                    if special(next) {
                        break;
                    }
                    ident.push(next);
                    chars.next();
                }
                match ident.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(ident),
                }
            }
        };
        tokens.push(token);
    }
    tokens
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    fn key(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Ident(key)) => {
                let errs = name::qualified_name(&key);
                if errs.is_empty() {
                    Ok(key)
                } else {
                    Err(format!("invalid label key {key:?}: {}", errs.join("; ")))
                }
            }
            other => Err(format!("found {other:?}, expected: identifier")),
        }
    }

    fn value(&mut self) -> Result<String, String> {
        // An empty value (`a=`) is allowed.
        let value = match self.peek() {
            Some(Token::Ident(_)) => match self.next() {
                Some(Token::Ident(v)) => v,
                _ => String::new(),
            },
            // Keywords are values too in `a=in`.
            Some(Token::In) => {
                self.next();
                "in".into()
            }
            Some(Token::NotIn) => {
                self.next();
                "notin".into()
            }
            _ => String::new(),
        };
        let errs = name::label_value(&value);
        if errs.is_empty() {
            Ok(value)
        } else {
            Err(format!(
                "invalid label value: {value:?}: {}",
                errs.join("; ")
            ))
        }
    }

    fn set(&mut self) -> Result<Vec<String>, String> {
        if self.next() != Some(Token::Open) {
            return Err("found '', expected: '('".into());
        }
        let mut values = Vec::new();
        loop {
            if self.peek() == Some(&Token::Close) && values.is_empty() {
                return Err("for 'in', 'notin' operators, values set can't be empty".into());
            }
            values.push(self.value()?);
            match self.next() {
                Some(Token::Comma) => continue,
                Some(Token::Close) => return Ok(values),
                other => return Err(format!("found {other:?}, expected: ',' or ')'")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        if self.peek() == Some(&Token::Not) {
            self.next();
            let key = self.key()?;
            return Ok(Requirement {
                key,
                operator: Operator::DoesNotExist,
                values: vec![],
            });
        }
        let key = self.key()?;
        let (operator, values) = match self.peek() {
            None | Some(Token::Comma) => (Operator::Exists, vec![]),
            Some(Token::Eq | Token::DoubleEq) => {
                self.next();
                (Operator::Equals, vec![self.value()?])
            }
            Some(Token::NotEq) => {
                self.next();
                (Operator::NotEquals, vec![self.value()?])
            }
            Some(Token::In) => {
                self.next();
                (Operator::In, self.set()?)
            }
            Some(Token::NotIn) => {
                self.next();
                (Operator::NotIn, self.set()?)
            }
            Some(op @ (Token::Gt | Token::Lt)) => {
                let operator = if *op == Token::Gt {
                    Operator::GreaterThan
                } else {
                    Operator::LessThan
                };
                self.next();
                let value = self.value()?;
                if value.parse::<i64>().is_err() {
                    return Err(format!(
                        "for 'Gt', 'Lt' operators, the value must be an integer, got {value:?}"
                    ));
                }
                (operator, vec![value])
            }
            Some(other) => {
                return Err(format!(
                    "found {other:?}, expected: in, notin, =, ==, !=, gt, lt"
                ))
            }
        };
        Ok(Requirement {
            key,
            operator,
            values,
        })
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(input: &str) -> Result<Self, String> {
        if input.len() > MAX_SELECTOR_LEN {
            return Err(format!("selector longer than {MAX_SELECTOR_LEN} bytes"));
        }
        let mut parser = Parser {
            tokens: lex(input),
            pos: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek().is_none() {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(parser.requirement()?);
            match parser.next() {
                None => return Ok(LabelSelector { requirements }),
                Some(Token::Comma) => continue,
                Some(other) => {
                    return Err(format!("found {other:?}, expected: ',' or 'end of string'"))
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether labels looked up through `get` satisfy every requirement.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|req| {
            let value = get(&req.key);
            match req.operator {
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
                Operator::Equals | Operator::In => {
                    value.is_some_and(|v| req.values.iter().any(|w| w == v))
                }
                Operator::NotEquals | Operator::NotIn => {
                    !value.is_some_and(|v| req.values.iter().any(|w| w == v))
                }
                Operator::GreaterThan | Operator::LessThan => {
                    let (Some(have), Ok(want)) = (
                        value.and_then(|v| v.parse::<i64>().ok()),
                        req.values[0].parse::<i64>(),
                    ) else {
                        return false;
                    };
                    if req.operator == Operator::GreaterThan {
                        have > want
                    } else {
                        have < want
                    }
                }
            }
        })
    }
}

/// A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`), as the
/// workloads' `spec.selector` holds it.
impl LabelSelector {
    /// The selector an API object gives; `field` names it in errors. An
    /// absent or empty selector matches everything (callers that require
    /// one say so themselves).
    pub fn from_api(selector: &serde_json::Value, field: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if let Some(labels) = selector
            .get("matchLabels")
            .and_then(serde_json::Value::as_object)
        {
            for (key, value) in labels {
                let value = value
                    .as_str()
                    .ok_or_else(|| format!("{field}.matchLabels: values must be strings"))?;
                requirements.push(Requirement {
                    key: key.clone(),
                    operator: Operator::Equals,
                    values: vec![value.to_owned()],
                });
            }
        }
        let expressions = selector
            .get("matchExpressions")
            .and_then(serde_json::Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for (i, expression) in expressions.iter().enumerate() {
            let at = format!("{field}.matchExpressions[{i}]");
            let key = expression["key"]
                .as_str()
                .filter(|k| !k.is_empty())
                .ok_or_else(|| format!("{at}.key: Required value"))?;
            let values: Vec<String> = expression["values"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let operator = match expression["operator"].as_str() {
                Some("In") => Operator::In,
                Some("NotIn") => Operator::NotIn,
                Some("Exists") => Operator::Exists,
                Some("DoesNotExist") => Operator::DoesNotExist,
                other => {
                    return Err(format!(
                        "{at}.operator: Unsupported value: {:?}: supported values: \"DoesNotExist\", \"Exists\", \"In\", \"NotIn\"",
                        other.unwrap_or_default()
                    ))
                }
            };
            match operator {
                Operator::In | Operator::NotIn if values.is_empty() => {
                    return Err(format!(
                        "{at}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                    ))
                }
                Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                    return Err(format!(
                        "{at}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                    ))
                }
                _ => {}
            }
            requirements.push(Requirement {
                key: key.to_owned(),
                operator,
                values,
            });
        }
        Ok(LabelSelector { requirements })
    }
}

impl std::fmt::Display for LabelSelector {
    /// The string form (`app=web,tier in (a,b)`), as `status.selector` of a
    /// Scale and `kubectl get -o wide` show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r.operator {
                Operator::Exists => r.key.clone(),
                Operator::DoesNotExist => format!("!{}", r.key),
                Operator::Equals => format!("{}={}", r.key, r.values.join(",")),
                Operator::NotEquals => format!("{}!={}", r.key, r.values.join(",")),
                Operator::In => format!("{} in ({})", r.key, r.values.join(",")),
                Operator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                Operator::GreaterThan => format!("{}>{}", r.key, r.values.join(",")),
                Operator::LessThan => format!("{}<{}", r.key, r.values.join(",")),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn matches(selector: &str, labels: &[(&str, &str)]) -> bool {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        LabelSelector::parse(selector)
            .unwrap()
            .matches(|k| labels.get(k).copied())
    }

    #[test]
    fn equality_and_sets() {
        let labels = [("app", "web"), ("tier", "frontend"), ("stack", "prod")];
        assert!(matches("app=web", &labels));
        assert!(matches("app==web,tier=frontend", &labels));
        assert!(!matches("app!=web", &labels));
        assert!(matches("tier in (frontend),stack=prod", &labels));
        assert!(matches("tier in (backend, frontend)", &labels));
        assert!(!matches("tier notin (frontend)", &labels));
        assert!(matches("missing notin (x)", &labels));
        assert!(matches("app", &labels));
        assert!(matches("!missing", &labels));
        assert!(!matches("!app", &labels));
        assert!(matches("", &labels));
        assert!(
            matches("a!=b", &labels),
            "!= matches when the key is absent"
        );
    }

    #[test]
    fn numeric_comparisons() {
        assert!(matches("n>3", &[("n", "4")]));
        assert!(!matches("n<3", &[("n", "4")]));
        assert!(!matches("n>3", &[("n", "x")]));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "a in ()",
            "a in (x",
            "a=b c",
            "=b",
            "a b",
            "a in x",
            "a=b=c",
            "a>x",
            "a=b,",
            "a=has space)",
            "Bad Key=1",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn api_selectors_match_and_print_as_kubectl_shows_them() {
        let api = serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}, {"key": "canary", "operator": "DoesNotExist"}],
        });
        let selector = LabelSelector::from_api(&api, "spec.selector").unwrap();
        assert_eq!(selector.to_string(), "app=web,tier in (a,b),!canary");
        let labels = [("app", "web"), ("tier", "b")];
        let get = |k: &str| labels.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        assert!(selector.matches(get));
        let bad = serde_json::json!({"matchExpressions": [{"key": "x", "operator": "In"}]});
        assert!(LabelSelector::from_api(&bad, "spec.selector")
            .unwrap_err()
            .contains("values: Required value"));
        assert!(LabelSelector::from_api(&serde_json::json!({}), "s")
            .unwrap()
            .is_empty());
    }
}
