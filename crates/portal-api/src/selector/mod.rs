//! Label and field selectors as `kubectl` sends them (`labelSelector=`,
//! `fieldSelector=`), parsed once and matched against many objects.

pub mod field;
pub mod label;

pub use field::FieldSelector;
pub use label::LabelSelector;
