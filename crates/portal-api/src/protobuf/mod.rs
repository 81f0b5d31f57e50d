//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`): the
//! `k8s\0` magic, then a `runtime.Unknown` envelope around the object's
//! protobuf encoding. kubectl's typed commands send these (`kubectl create
//! service`, `kubectl debug --copy-to` sends a Pod), as do client-go
//! programs set to protobuf. Every served kind is decoded by one walk of the
//! wire format guided by [`schema`] (generated from `k8s-pb`'s field
//! numbers and `k8s-openapi`'s JSON names by
//! `scripts/gen-protobuf-schema.py`) into the JSON form the rest of the
//! server handles.

mod schema;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message as _;
use serde_json::{json, Map, Value};

use crate::schema::{DecodeError, Resource};

const MAGIC: &[u8] = b"k8s\0";
/// Deepest nesting of messages accepted (the served kinds need about 12).
const MAX_DEPTH: usize = 48;

/// One message of the served kinds: its fields by number.
#[derive(Debug)]
pub(crate) struct Message {
    name: &'static str,
    fields: &'static [Field],
}

#[derive(Debug)]
pub(crate) struct Field {
    tag: u32,
    /// The JSON name; empty for an embedded struct whose fields are the
    /// parent's in JSON.
    json: &'static str,
    ty: Type,
    repeated: bool,
    /// A Go non-pointer scalar tagged `omitempty`: Go's protobuf writes its
    /// zero value, Go's JSON leaves it out, and so does the decoder.
    omit_zero: bool,
}

/// What a field holds (the indices are into `schema::MESSAGES`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Type {
    String,
    /// `bytes`: base64 in JSON (a CSR's `request`).
    Bytes,
    Bool,
    Int32,
    Int64,
    Message(usize),
    /// `map<string, message>`.
    MapOf(usize),
    /// `map<string, string>`.
    MapOfStrings,
    /// `map<string, bytes>` (a Secret's `data`), base64 values in JSON.
    MapOfBytes,
}

/// Decodes a protobuf body as an object of `resource`.
pub fn decode(resource: &Resource, body: &[u8]) -> Result<Value, DecodeError> {
    decode_message(
        &resource.openapi_name(),
        resource.kind_name,
        &resource.api_version(),
        body,
    )
}

/// Decodes a protobuf body as the message `openapi_name` (of `kind` at
/// `api_version`): also the bodies of what is not stored (a TokenRequest,
/// the reviews).
pub fn decode_message(
    openapi_name: &str,
    kind_name: &str,
    api_version: &str,
    body: &[u8],
) -> Result<Value, DecodeError> {
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| {
        DecodeError::Malformed("protobuf body does not start with the k8s magic".into())
    })?;
    let unknown = Unknown::decode(envelope)
        .map_err(|e| DecodeError::Malformed(format!("protobuf envelope: {e}")))?;
    if let Some(encoding) = unknown
        .content_encoding
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        return Err(DecodeError::Malformed(format!(
            "unsupported content encoding {encoding:?}"
        )));
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if !kind.is_empty() && kind != kind_name {
        return Err(DecodeError::WrongKind(format!(
            "the kind in the data ({kind}) does not match the expected kind ({kind_name})"
        )));
    }
    let Some(&(_, index)) = schema::KINDS.iter().find(|(n, _)| *n == openapi_name) else {
        return Err(DecodeError::Unsupported(format!(
            "protobuf bodies for {kind_name} are not supported; send JSON"
        )));
    };
    let raw = unknown.raw.unwrap_or_default();
    let mut object = message(&raw, index, 0)
        .map_err(|e| DecodeError::Malformed(format!("protobuf {kind_name}: {e}")))?;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind_name);
    Ok(object)
}

/// The protobuf wire format, read one field at a time.
struct Reader<'a> {
    bytes: &'a [u8],
}

/// A field's value as it sits on the wire.
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.bytes.split_first().ok_or("truncated varint")?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.bytes.len() {
            return Err("truncated field".into());
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    /// The next field number and value, `None` at the end.
    fn next(&mut self) -> Result<Option<(u32, Wire<'a>)>, String> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let tag = u32::try_from(key >> 3).map_err(|_| "field number out of range")?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed64
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length out of range")?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed32
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        Ok(Some((tag, value)))
    }
}

fn text(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
}

/// Decodes message `index` of the schema from `bytes` into its JSON form.
fn message(bytes: &[u8], index: usize, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("messages nested too deeply".into());
    }
    let message = &schema::MESSAGES[index];
    if let Some(special) = special(message.name, bytes)? {
        return Ok(special);
    }
    let mut out = Map::new();
    let mut reader = Reader { bytes };
    while let Some((tag, wire)) = reader.next()? {
        // Fields this version does not know are skipped, as Kubernetes does.
        let Some(field) = message.fields.iter().find(|f| f.tag == tag) else {
            continue;
        };
        let value = field_value(field, wire, depth)?;
        match (field.json, value) {
            ("", Value::Object(embedded)) => out.extend(embedded),
            // Go writes every non-pointer scalar, zero ones too; its JSON
            // leaves those tagged `omitempty` out. Pointers set to zero
            // (`replicas: 0`, an EndpointSlice port's `name: ""`) stay.
            (_, value) if field.omit_zero && !field.repeated && is_zero(&value) => {}
            (name, Value::Object(entry))
                if matches!(
                    field.ty,
                    Type::MapOf(_) | Type::MapOfStrings | Type::MapOfBytes
                ) =>
            {
                let map = out.entry(name).or_insert_with(|| json!({}));
                if let Some(map) = map.as_object_mut() {
                    map.extend(entry);
                }
            }
            (name, value) if field.repeated => {
                let list = out.entry(name).or_insert_with(|| json!([]));
                match (list.as_array_mut(), value) {
                    (Some(list), Value::Array(packed)) => list.extend(packed),
                    (Some(list), value) => list.push(value),
                    (None, _) => {}
                }
            }
            (name, value) => drop(out.insert(name.to_owned(), value)),
        }
    }
    Ok(Value::Object(out))
}

fn field_value(field: &Field, wire: Wire<'_>, depth: usize) -> Result<Value, String> {
    let mismatch = || format!("field {} has the wrong wire type", field.tag);
    Ok(match (field.ty, wire) {
        (Type::String, Wire::Bytes(b)) => Value::String(text(b)?),
        (Type::Bytes, Wire::Bytes(b)) => Value::String(BASE64.encode(b)),
        (Type::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        // Two's complement on the wire, as Go writes negative int32s.
        (Type::Int32, Wire::Varint(v)) => json!(v as i64 as i32),
        (Type::Int64, Wire::Varint(v)) => json!(v as i64),
        (Type::Int32 | Type::Int64 | Type::Bool, Wire::Bytes(packed)) if field.repeated => {
            let mut reader = Reader { bytes: packed };
            let mut items = Vec::new();
            while !reader.bytes.is_empty() {
                let v = reader.varint()?;
                items.push(match field.ty {
                    Type::Int32 => json!(v as i64 as i32),
                    Type::Bool => json!(v != 0),
                    _ => json!(v as i64),
                });
            }
            Value::Array(items)
        }
        (Type::Message(index), Wire::Bytes(b)) => message(b, index, depth + 1)?,
        (Type::MapOf(_) | Type::MapOfStrings | Type::MapOfBytes, Wire::Bytes(b)) => {
            let mut key = String::new();
            let mut value = Value::Null;
            let mut reader = Reader { bytes: b };
            while let Some((tag, wire)) = reader.next()? {
                match (tag, wire, field.ty) {
                    (1, Wire::Bytes(k), _) => key = text(k)?,
                    (2, Wire::Bytes(v), Type::MapOfStrings) => value = Value::String(text(v)?),
                    (2, Wire::Bytes(v), Type::MapOfBytes) => {
                        value = Value::String(BASE64.encode(v))
                    }
                    (2, Wire::Bytes(v), Type::MapOf(index)) => {
                        value = message(v, index, depth + 1)?
                    }
                    _ => return Err(mismatch()),
                }
            }
            if value.is_null() {
                value = match field.ty {
                    Type::MapOfStrings | Type::MapOfBytes => json!(""),
                    Type::MapOf(index) => message(&[], index, depth + 1)?,
                    _ => Value::Null,
                };
            }
            json!({ key: value })
        }
        _ => return Err(mismatch()),
    })
}

/// A scalar's zero value: `""`, `false`, `0`.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// Messages with a JSON form of their own.
fn special(name: &str, bytes: &[u8]) -> Result<Option<Value>, String> {
    let fields = || -> Result<Vec<(u32, Wire<'_>)>, String> {
        let mut reader = Reader { bytes };
        let mut out = Vec::new();
        while let Some(field) = reader.next()? {
            out.push(field);
        }
        Ok(out)
    };
    Ok(Some(match name {
        "io.k8s.apimachinery.pkg.api.resource.Quantity" => {
            let mut quantity = String::new();
            for (tag, wire) in fields()? {
                if let (1, Wire::Bytes(b)) = (tag, wire) {
                    quantity = text(b)?;
                }
            }
            Value::String(quantity)
        }
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
        | "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime" => {
            let (mut seconds, mut nanos) = (0i64, 0i32);
            let fields = fields()?;
            // Go writes a zero time as an empty message; its JSON is null.
            if fields.is_empty() {
                return Ok(Some(Value::Null));
            }
            for (tag, wire) in fields {
                match (tag, wire) {
                    (1, Wire::Varint(v)) => seconds = v as i64,
                    (2, Wire::Varint(v)) => nanos = v as i64 as i32,
                    _ => {}
                }
            }
            let time = jiff::Timestamp::new(seconds, nanos).map_err(|e| format!("time: {e}"))?;
            let format = if name.ends_with("MicroTime") {
                "%Y-%m-%dT%H:%M:%S.%6fZ"
            } else {
                "%Y-%m-%dT%H:%M:%SZ"
            };
            Value::String(time.strftime(format).to_string())
        }
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => {
            let (mut kind, mut int, mut string) = (0u64, 0i64, String::new());
            for (tag, wire) in fields()? {
                match (tag, wire) {
                    (1, Wire::Varint(v)) => kind = v,
                    (2, Wire::Varint(v)) => int = i64::from(v as i64 as i32),
                    (3, Wire::Bytes(b)) => string = text(b)?,
                    _ => {}
                }
            }
            if kind == 1 {
                Value::String(string)
            } else {
                json!(int)
            }
        }
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1" => {
            let mut raw = Value::Object(Map::new());
            for (tag, wire) in fields()? {
                if let (1, Wire::Bytes(b)) = (tag, wire) {
                    raw = serde_json::from_slice(b).map_err(|e| format!("fieldsV1: {e}"))?;
                }
            }
            raw
        }
        // An embedded object (a ControllerRevision's data): its JSON bytes.
        "io.k8s.apimachinery.pkg.runtime.RawExtension" => {
            let mut raw = Value::Null;
            for (tag, wire) in fields()? {
                if let (1, Wire::Bytes(b)) = (tag, wire) {
                    raw = serde_json::from_slice(b).map_err(|e| format!("raw extension: {e}"))?;
                }
            }
            raw
        }
        _ => return Ok(None),
    }))
}

/// Whether objects of `resource` have a protobuf form (kinds users define
/// have none: clients get JSON, as from kube-apiserver).
pub fn supports(resource: &Resource) -> bool {
    let name = resource.openapi_name();
    resource.custom.is_none() && schema::KINDS.iter().any(|(n, _)| *n == name)
}

/// The protobuf media type, for answers to clients that prefer it.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Encodes an object of `resource` as Kubernetes' protobuf: the magic, the
/// `runtime.Unknown` envelope, the object's message. JSON fields the
/// served version does not have are left out.
pub fn encode(resource: &Resource, object: &Value) -> Result<Vec<u8>, String> {
    let name = resource.openapi_name();
    let &(_, index) = schema::KINDS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("no protobuf form for {}", resource.kind_name))?;
    let mut raw = Vec::new();
    encode_message(object, index, &mut raw, 0)?;
    let unknown = Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some(resource.api_version()),
            kind: Some(resource.kind_name.to_owned()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    Ok([MAGIC, &unknown.encode_to_vec()].concat())
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, tag: u32, wire: u64) {
    put_varint(out, (u64::from(tag) << 3) | wire);
}

fn put_bytes(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_key(out, tag, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_int(out: &mut Vec<u8>, tag: u32, value: i64) {
    put_key(out, tag, 0);
    // Negative numbers as ten-byte two's complement, as Go writes them.
    put_varint(out, value as u64);
}

fn encode_message(
    value: &Value,
    index: usize,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err("objects nested too deeply".into());
    }
    let message = &schema::MESSAGES[index];
    if encode_special(message.name, value, out)? {
        return Ok(());
    }
    let object = value
        .as_object()
        .ok_or_else(|| format!("{} must be an object", message.name))?;
    for field in message.fields {
        let value = if field.json.is_empty() {
            // An embedded struct: its fields are this object's.
            value
        } else {
            match object.get(field.json) {
                None | Some(Value::Null) => continue,
                Some(value) => value,
            }
        };
        let wrong = || format!("{}: unexpected value {value}", field.json);
        match (field.ty, value) {
            (Type::MapOfStrings | Type::MapOfBytes | Type::MapOf(_), Value::Object(map)) => {
                for (key, item) in map {
                    let mut entry = Vec::new();
                    put_bytes(&mut entry, 1, key.as_bytes());
                    match (field.ty, item) {
                        (Type::MapOfStrings, Value::String(text)) => {
                            put_bytes(&mut entry, 2, text.as_bytes())
                        }
                        (Type::MapOfBytes, Value::String(text)) => {
                            put_bytes(&mut entry, 2, &unbase64(field, text)?)
                        }
                        (Type::MapOf(index), item) => {
                            let mut encoded = Vec::new();
                            encode_message(item, index, &mut encoded, depth + 1)?;
                            put_bytes(&mut entry, 2, &encoded);
                        }
                        _ => return Err(wrong()),
                    }
                    put_bytes(out, field.tag, &entry);
                }
            }
            (_, Value::Array(items)) if field.repeated => {
                for item in items {
                    encode_single(field, item, out, depth)?;
                }
            }
            (_, value) if !field.repeated => encode_single(field, value, out, depth)?,
            _ => return Err(wrong()),
        }
    }
    Ok(())
}

fn encode_single(
    field: &Field,
    value: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), String> {
    match (field.ty, value) {
        (Type::String, Value::String(text)) => put_bytes(out, field.tag, text.as_bytes()),
        (Type::Bytes, Value::String(text)) => put_bytes(out, field.tag, &unbase64(field, text)?),
        (Type::Bool, Value::Bool(b)) => put_int(out, field.tag, i64::from(*b)),
        (Type::Int32 | Type::Int64, Value::Number(n)) => {
            let n = n
                .as_i64()
                .ok_or_else(|| format!("{}: not an integer: {n}", field.json))?;
            put_int(out, field.tag, n);
        }
        (Type::Message(index), value) => {
            let mut encoded = Vec::new();
            encode_message(value, index, &mut encoded, depth + 1)?;
            put_bytes(out, field.tag, &encoded);
        }
        _ => return Err(format!("{}: unexpected value {value}", field.json)),
    }
    Ok(())
}

/// A `bytes` value's JSON (base64, as Go's `[]byte`) as its bytes.
fn unbase64(field: &Field, text: &str) -> Result<Vec<u8>, String> {
    BASE64
        .decode(text)
        .map_err(|e| format!("{}: not base64: {e}", field.json))
}

/// The messages with a JSON form of their own; whether `name` is one.
fn encode_special(name: &str, value: &Value, out: &mut Vec<u8>) -> Result<bool, String> {
    match (name, value) {
        ("io.k8s.apimachinery.pkg.api.resource.Quantity", Value::String(q)) => {
            put_bytes(out, 1, q.as_bytes());
        }
        ("io.k8s.apimachinery.pkg.api.resource.Quantity", Value::Number(n)) => {
            put_bytes(out, 1, n.to_string().as_bytes());
        }
        (
            "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
            | "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime",
            Value::String(text),
        ) => {
            let time: jiff::Timestamp = text.parse().map_err(|e| format!("time {text:?}: {e}"))?;
            put_int(out, 1, time.as_second());
            if time.subsec_nanosecond() != 0 {
                put_int(out, 2, i64::from(time.subsec_nanosecond()));
            }
        }
        ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", Value::Number(n)) => {
            put_int(out, 1, 0);
            put_int(out, 2, n.as_i64().unwrap_or_default());
        }
        ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", Value::String(text)) => {
            put_int(out, 1, 1);
            put_bytes(out, 3, text.as_bytes());
        }
        ("io.k8s.apimachinery.pkg.runtime.RawExtension", raw) => {
            put_bytes(out, 1, &serde_json::to_vec(raw).map_err(|e| e.to_string())?);
        }
        ("io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1", fields) => {
            put_bytes(
                out,
                1,
                &serde_json::to_vec(fields).map_err(|e| e.to_string())?,
            );
        }
        (
            "io.k8s.apimachinery.pkg.api.resource.Quantity"
            | "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
            | "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"
            | "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
            other,
        ) => return Err(format!("unexpected value {other} for {name}")),
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;
    use k8s_pb::api::core::v1 as pb;
    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_pb::apimachinery::pkg::runtime::TypeMeta;
    use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.to_vec(), unknown.encode_to_vec()].concat()
    }

    #[test]
    fn service_as_kubectl_create_sends_it() {
        let service = pb::Service {
            metadata: Some(ObjectMeta {
                name: Some("foo".into()),
                labels: [("app".to_owned(), "foo".to_owned())].into(),
                ..ObjectMeta::default()
            }),
            spec: Some(pb::ServiceSpec {
                ports: vec![pb::ServicePort {
                    name: Some("5678-8080".into()),
                    protocol: Some("TCP".into()),
                    port: Some(5678),
                    target_port: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: Some(String::new()),
                    }),
                    ..pb::ServicePort::default()
                }],
                selector: [("app".to_owned(), "foo".to_owned())].into(),
                r#type: Some("ClusterIP".into()),
                cluster_ip: Some(String::new()),
                ..pb::ServiceSpec::default()
            }),
            status: None,
        };
        let body = envelope("Service", service.encode_to_vec());
        let object = decode(&crate::kinds::service::RESOURCE, &body).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "foo", "labels": {"app": "foo"}},
                "spec": {"ports": [{"name": "5678-8080", "protocol": "TCP", "port": 5678, "targetPort": 8080}],
                         "selector": {"app": "foo"}, "type": "ClusterIP"}})
        );
    }

    /// A Deployment as `kubectl create deployment --replicas=0` sends it:
    /// Go writes every non-pointer field, zero ones too; the JSON is what
    /// Kubernetes' would be (zero `omitempty` scalars out, a zero time
    /// null, a pointer's zero kept).
    #[test]
    fn deployment_as_kubectl_create_sends_it() {
        use k8s_pb::api::apps::v1 as apps;
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_owned(), "web".to_owned())].into();
        let deployment = apps::Deployment {
            metadata: Some(ObjectMeta {
                name: Some("web".into()),
                generation: Some(0),
                namespace: Some(String::new()),
                labels: labels.clone(),
                ..ObjectMeta::default()
            }),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(0),
                paused: Some(false),
                min_ready_seconds: Some(0),
                selector: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(pb::PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        creation_timestamp: Some(Time::default()),
                        labels,
                        ..ObjectMeta::default()
                    }),
                    spec: Some(pb::PodSpec {
                        containers: vec![pb::Container {
                            name: Some("nginx".into()),
                            image: Some("nginx".into()),
                            stdin: Some(false),
                            tty: Some(false),
                            working_dir: Some(String::new()),
                            resources: Some(pb::ResourceRequirements::default()),
                            ..pb::Container::default()
                        }],
                        host_network: Some(false),
                        enable_service_links: Some(false),
                        ..pb::PodSpec::default()
                    }),
                }),
                ..apps::DeploymentSpec::default()
            }),
            status: Some(apps::DeploymentStatus::default()),
        };
        let body = envelope("Deployment", deployment.encode_to_vec());
        let object = decode(&crate::kinds::deployment::RESOURCE, &body).unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}],
                            "enableServiceLinks": false}}},
                "status": {}})
        );
    }

    /// A Pod as `kubectl debug --copy-to` sends it: embedded structs
    /// (probe handlers, volume sources), quantities, times, named ports,
    /// false booleans and zero numbers that mean something.
    #[test]
    fn a_pod_with_everything_kubectl_debug_copies() {
        let container = pb::Container {
            name: Some("app".into()),
            image: Some("busybox".into()),
            command: vec!["sh".into(), "-c".into()],
            ports: vec![pb::ContainerPort {
                name: Some("http".into()),
                container_port: Some(8080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }],
            env: vec![pb::EnvVar {
                name: Some("POD".into()),
                value_from: Some(pb::EnvVarSource {
                    field_ref: Some(pb::ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: Some("metadata.name".into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            resources: Some(pb::ResourceRequirements {
                limits: [(
                    "cpu".to_owned(),
                    Quantity {
                        string: Some("500m".into()),
                    },
                )]
                .into(),
                ..Default::default()
            }),
            readiness_probe: Some(pb::Probe {
                handler: Some(pb::ProbeHandler {
                    http_get: Some(pb::HttpGetAction {
                        path: Some("/ready".into()),
                        port: Some(IntOrString {
                            r#type: Some(1),
                            int_val: Some(0),
                            str_val: Some("http".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                period_seconds: Some(5),
                ..Default::default()
            }),
            security_context: Some(pb::SecurityContext {
                allow_privilege_escalation: Some(false),
                run_as_user: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = pb::Pod {
            metadata: Some(ObjectMeta {
                name: Some("copy".into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(Time {
                    seconds: Some(1_700_000_000),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            spec: Some(pb::PodSpec {
                containers: vec![container],
                volumes: vec![pb::Volume {
                    name: Some("scratch".into()),
                    volume_source: Some(pb::VolumeSource {
                        empty_dir: Some(pb::EmptyDirVolumeSource::default()),
                        ..Default::default()
                    }),
                }],
                share_process_namespace: Some(true),
                termination_grace_period_seconds: Some(0),
                ..Default::default()
            }),
            status: None,
        };
        let object = decode(
            &crate::kinds::pod::RESOURCE,
            &envelope("Pod", pod.encode_to_vec()),
        )
        .unwrap();
        assert_eq!(
            object["spec"],
            json!({
                "containers": [{
                    "name": "app", "image": "busybox", "command": ["sh", "-c"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                    "resources": {"limits": {"cpu": "500m"}},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
                    "securityContext": {"allowPrivilegeEscalation": false, "runAsUser": 0},
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "shareProcessNamespace": true,
                "terminationGracePeriodSeconds": 0,
            })
        );
        assert_eq!(
            object["metadata"]["creationTimestamp"],
            "2023-11-14T22:13:20Z"
        );
        // The JSON is the Kubernetes form: the typed decoder takes it whole.
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(object).unwrap();
        assert_eq!(typed.spec.unwrap().containers[0].name, "app");
    }

    #[test]
    fn every_kind_decodes() {
        let meta = ObjectMeta {
            name: Some("x".into()),
            ..Default::default()
        };
        // CustomResourceDefinitions are JSON only (as most clients send them).
        for resource in resources().filter(|r| supports(r)) {
            // Every kind's field 1 is its ObjectMeta.
            let raw = [
                vec![0x0a],
                vec![u8::try_from(meta.encoded_len()).unwrap()],
                meta.encode_to_vec(),
            ]
            .concat();
            let object = decode(resource, &envelope(resource.kind_name, raw))
                .unwrap_or_else(|e| panic!("{}: {e}", resource.kind_name));
            assert_eq!(object["metadata"]["name"], "x", "{}", resource.kind_name);
            assert_eq!(object["kind"], resource.kind_name);
        }
    }

    #[test]
    fn bad_bodies_are_errors() {
        let svc = &crate::kinds::service::RESOURCE;
        assert!(decode(svc, b"not k8s").is_err());
        assert!(decode(svc, b"k8s\0\xff\xff\xff").is_err());
        assert!(matches!(
            decode(svc, &envelope("Pod", vec![])),
            Err(DecodeError::WrongKind(_))
        ));
        // Truncated, wrong wire types, nesting past the limit: errors.
        assert!(decode(svc, &envelope("Service", vec![0x0a, 0x05, 0x0a])).is_err());
        assert!(decode(svc, &envelope("Service", vec![0x08, 0x01])).is_err());
        let mut deep = Vec::new();
        for _ in 0..200 {
            deep = [
                vec![0x12],
                vec![u8::try_from(deep.len().min(127)).unwrap()],
                deep,
            ]
            .concat();
            deep.truncate(129);
        }
        assert!(decode(svc, &envelope("Service", deep)).is_err());
    }

    /// Every kind, as the server stores it, through our encoder, then read
    /// back by an independent decoder (`k8s-pb`'s prost types) and by ours.
    #[test]
    fn every_kind_round_trips() {
        let metadata = json!({"name": "x", "namespace": "default", "uid": "u-1", "resourceVersion": "42",
            "creationTimestamp": "2026-11-23T10:00:00Z", "labels": {"a": "b"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]});
        let samples = [
            (
                &crate::kinds::namespace::RESOURCE,
                json!({"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            ),
            (
                &crate::kinds::pod::RESOURCE,
                json!({"spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 10},
                "resources": {"requests": {"memory": "64Mi"}}}],
                "volumes": [{"name": "v", "configMap": {"name": "cm", "defaultMode": 420}}], "nodeName": "n1"},
                "status": {"phase": "Running", "podIP": "10.244.0.5", "conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
            (
                &crate::kinds::service::RESOURCE,
                json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "targetPort": "http", "nodePort": 30080, "protocol": "TCP"}],
                "clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"], "selector": {"app": "a"}}, "status": {"loadBalancer": {}}}),
            ),
            (
                &crate::kinds::endpoints::RESOURCE,
                json!({"subsets": [{"addresses": [{"ip": "10.244.0.5", "targetRef": {"kind": "Pod", "name": "p"}}], "ports": [{"port": 80}]}]}),
            ),
            (
                &crate::kinds::replication_controller::RESOURCE,
                json!({"spec": {"replicas": 0, "selector": {"app": "a"}, "template": {"metadata": {"labels": {"app": "a"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}, "status": {"replicas": 0}}),
            ),
            (
                &crate::kinds::node::RESOURCE,
                json!({"spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"capacity": {"cpu": "2"}, "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}),
            ),
            (
                &crate::kinds::event::RESOURCE,
                json!({"involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Started", "count": 2,
                "eventTime": "2026-11-23T10:00:00.123456Z", "firstTimestamp": "2026-11-23T10:00:00Z"}),
            ),
            (
                &crate::kinds::endpoint_slice::RESOURCE,
                json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}],
                "ports": [{"name": "", "port": 80, "protocol": "TCP"}]}),
            ),
            (
                &crate::kinds::secret::RESOURCE,
                json!({"type": "Opaque", "data": {"bin": "AAH/", "empty": ""}, "immutable": true}),
            ),
            (
                &crate::kinds::config_map::RESOURCE,
                json!({"data": {"a": "text"}, "binaryData": {"b": "AAH/"}}),
            ),
            (
                &crate::kinds::lease::RESOURCE,
                json!({"spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2026-11-23T10:00:00.000000Z"}}),
            ),
        ];
        for (kind, body) in samples {
            let resource = kind;
            let mut object = body.clone();
            object["metadata"] = metadata.clone();
            object["apiVersion"] = json!(resource.api_version());
            object["kind"] = json!(resource.kind_name);
            let bytes =
                encode(resource, &object).unwrap_or_else(|e| panic!("{}: {e}", kind.kind_name));
            // Independent check: prost decodes the same bytes as the kind.
            let unknown = Unknown::decode(&bytes[MAGIC.len()..]).unwrap();
            let raw = unknown.raw.unwrap();
            let name = match kind.kind_name {
                "Namespace" => pb::Namespace::decode(raw.as_slice()).map(|o| o.metadata),
                "Pod" => pb::Pod::decode(raw.as_slice()).map(|o| o.metadata),
                "Service" => pb::Service::decode(raw.as_slice()).map(|o| o.metadata),
                "Endpoints" => pb::Endpoints::decode(raw.as_slice()).map(|o| o.metadata),
                "ReplicationController" => {
                    pb::ReplicationController::decode(raw.as_slice()).map(|o| o.metadata)
                }
                "Node" => pb::Node::decode(raw.as_slice()).map(|o| o.metadata),
                "Secret" => pb::Secret::decode(raw.as_slice()).map(|o| {
                    assert_eq!(o.data["bin"], [0, 1, 255]);
                    o.metadata
                }),
                "ConfigMap" => pb::ConfigMap::decode(raw.as_slice()).map(|o| o.metadata),
                "Event" => pb::Event::decode(raw.as_slice()).map(|o| o.metadata),
                "EndpointSlice" => {
                    k8s_pb::api::discovery::v1::EndpointSlice::decode(raw.as_slice())
                        .map(|o| o.metadata)
                }
                "Lease" => {
                    k8s_pb::api::coordination::v1::Lease::decode(raw.as_slice()).map(|o| o.metadata)
                }
                other => panic!("no sample decoder for {other}"),
            };
            assert_eq!(
                name.unwrap().unwrap().name.as_deref(),
                Some("x"),
                "{}",
                kind.kind_name
            );
            assert_eq!(
                decode(resource, &bytes).unwrap(),
                object,
                "{}",
                kind.kind_name
            );
        }
        // An RC's zero replicas and a Pod's `false` survive (they mean something).
        let rc = &crate::kinds::replication_controller::RESOURCE;
        let zero = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "r"}, "spec": {"replicas": 0}});
        assert_eq!(decode(rc, &encode(rc, &zero).unwrap()).unwrap(), zero);
    }
}
