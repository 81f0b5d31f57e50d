//! Server-side printing: the `meta.k8s.io/v1` `Table` that `kubectl get`
//! asks for, with the upstream columns of each kind (`kubectl get` shows
//! what the server prints). Pure functions of the object and the time.

pub(crate) mod cells;
mod duration;

use serde_json::{json, Value};

pub use crate::schema::Column;
use crate::schema::Resource;

pub use duration::human_duration;

pub(crate) const fn col(name: &'static str, description: &'static str, priority: u8) -> Column {
    Column {
        name,
        kind: "string",
        format: "",
        description,
        priority,
    }
}

pub(crate) const NAME: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
pub(crate) const AGE: Column = col(
    "Age",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
    0,
);

fn column_json(column: &Column) -> Value {
    json!({
        "name": column.name,
        "type": column.kind,
        "format": column.format,
        "description": column.description,
        "priority": column.priority,
    })
}

/// `rows[].object`: the object's metadata only (`includeObject=Metadata`,
/// the default), enough for `-A` and `--show-labels`.
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// What `rows[].object` carries (`includeObject=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "includeObject {other:?} must be None, Metadata or Object"
            )),
        }
    }
}

/// A `Table` of `objects` at list revision `resource_version`.
pub fn table<'a>(
    resource: &Resource,
    objects: impl IntoIterator<Item = &'a Value>,
    now: i64,
    include: IncludeObject,
    list_meta: Value,
) -> Value {
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|object| {
            let mut row = json!({"cells": resource.table_cells(object, now)});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial_metadata(object),
                IncludeObject::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": resource.table_columns().iter().map(column_json).collect::<Vec<_>>(),
        "rows": rows,
    });
    table["metadata"] = list_meta;
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_fits_its_columns() {
        let empty = json!({"metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"}});
        for resource in crate::resources() {
            assert_eq!(
                (resource.cells)(&empty, 0).len(),
                (resource.columns)().len(),
                "{}",
                resource.kind_name
            );
        }
    }

    #[test]
    fn table_shape() {
        let svc = json!({"metadata": {"name": "web", "labels": {"a": "b"}}, "spec": {"clusterIP": "10.0.0.11"}});
        let t = table(
            &crate::kinds::service::RESOURCE,
            [&svc],
            0,
            IncludeObject::Metadata,
            json!({"resourceVersion": "5"}),
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        assert_eq!(t["rows"][0]["object"]["metadata"]["labels"]["a"], "b");
        assert_eq!(t["rows"][0]["cells"][2], "10.0.0.11");
    }
}
