//! Request bodies, JSON, YAML and protobuf, decoded as every resource: any bytes must
//! give an object or an error, never a panic; a decoded object decodes again
//! to itself (the canonical form is a fixed point).
#![no_main]

use libfuzzer_sys::fuzz_target;
use portal_api::decode::{decode_object, parse_body, Format};
use portal_api::RESOURCES;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let format = [Format::Json, Format::Yaml, Format::Protobuf][usize::from(selector & 3) % 3];
    let resource = &RESOURCES[usize::from(selector >> 2) % RESOURCES.len()];
    let Ok(value) = parse_body(resource, body, format) else { return };
    let Ok(decoded) = decode_object(resource, value) else { return };
    let again = decode_object(resource, decoded.object.clone()).expect("a decoded object decodes again");
    assert_eq!(again.object, decoded.object);
    assert!(again.unknown_fields.is_empty());
    let _ = portal_api::meta::validate(resource, &decoded.object);
});
