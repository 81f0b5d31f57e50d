//! `kubectl get` for custom resources: the name, then the CRD's
//! `additionalPrinterColumns` (or `Age` when it states none), each cell
//! read with its JSONPath; `date` columns are shown as ages, as upstream's
//! table convertor does.

use jsonpath_rust::JsonPath as _;
use serde_json::{json, Value};

use crate::schema::Column;
use crate::table::cells::{age_of, name};
use crate::table::{AGE, NAME};

/// One printer column and where its value is.
#[derive(Clone, Debug)]
pub struct PrinterColumn {
    column: Column,
    /// `$.spec.size` (the CRD's `.spec.size`).
    json_path: String,
}

const TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];

/// Reads `additionalPrinterColumns`.
pub fn parse(columns: Option<&Value>) -> Result<Vec<PrinterColumn>, String> {
    let mut parsed = Vec::new();
    for column in columns.and_then(Value::as_array).into_iter().flatten() {
        let text = |name: &str| column[name].as_str().unwrap_or("");
        let kind = text("type");
        if !TYPES.contains(&kind) {
            return Err(format!(
                "printer column {:?}: unsupported type {kind:?}",
                text("name")
            ));
        }
        let path = text("jsonPath");
        let json_path = format!("${}", path.trim_start_matches('$'));
        // Checked once here: a path that does not parse fails the CRD.
        json!({})
            .query(&json_path)
            .map_err(|e| format!("printer column {:?}: jsonPath {path:?}: {e}", text("name")))?;
        parsed.push(PrinterColumn {
            column: Column {
                name: super::leak(text("name")),
                kind: super::leak(kind),
                format: super::leak(text("format")),
                description: super::leak(text("description")),
                priority: column["priority"].as_u64().unwrap_or(0).min(255) as u8,
            },
            json_path,
        });
    }
    Ok(parsed)
}

/// The column definitions: the name first.
pub fn definitions(columns: &[PrinterColumn]) -> Vec<Column> {
    let mut all = vec![NAME];
    if columns.is_empty() {
        all.push(AGE);
    }
    all.extend(columns.iter().map(|c| c.column));
    all
}

/// One object's cells, in the order of [`definitions`].
pub fn cells(columns: &[PrinterColumn], object: &Value, now: i64) -> Vec<Value> {
    let mut cells = vec![name(object)];
    if columns.is_empty() {
        let created = object["metadata"]["creationTimestamp"].as_str();
        cells.push(json!(age_of(created, now)));
    }
    for column in columns {
        let found = object.query(&column.json_path).unwrap_or_default();
        let cell = match found.as_slice() {
            [] => Value::Null,
            [one] if column.column.kind == "date" => match one.as_str() {
                Some(timestamp) => json!(age_of(Some(timestamp), now)),
                None => Value::Null,
            },
            [one] => (*one).clone(),
            many => json!(many
                .iter()
                .map(|v| v
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string()))
                .collect::<Vec<_>>()
                .join(",")),
        };
        cells.push(cell);
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_follow_the_json_paths() {
        let columns = parse(Some(&json!([
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
            {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1},
            {"name": "Made", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ])))
        .unwrap();
        let names: Vec<_> = definitions(&columns).iter().map(|c| c.name).collect();
        assert_eq!(names, ["Name", "Ready", "Size", "Made"]);
        let object = json!({"metadata": {"name": "w", "creationTimestamp": "1970-01-01T00:00:00Z"},
            "spec": {"size": 3}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            cells(&columns, &object, 90),
            [json!("w"), json!("True"), json!(3), json!("90s")]
        );
        assert_eq!(
            cells(&columns, &json!({"metadata": {"name": "x"}}), 0)[2],
            Value::Null
        );
        assert!(parse(Some(
            &json!([{"name": "x", "type": "bytes", "jsonPath": ".a"}])
        ))
        .is_err());
        let plain: Vec<_> = definitions(&[]).iter().map(|c| c.name).collect();
        assert_eq!(plain, ["Name", "Age"]);
    }
}
