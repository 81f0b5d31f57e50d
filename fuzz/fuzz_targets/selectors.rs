//! Label selectors, field selectors and REST paths from arbitrary strings:
//! parse or fail cleanly, and a parsed selector can be matched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portal_api::selector::{FieldSelector, LabelSelector};

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else { return };
    if let Ok(selector) = LabelSelector::parse(input) {
        let _ = selector.matches(|key| (key.len() % 2 == 0).then_some("value"));
    }
    if let Ok(selector) = FieldSelector::parse(input) {
        let _ = selector.matches(|field| field.to_owned());
    }
    let _ = portal_api::path::parse(input);
});
