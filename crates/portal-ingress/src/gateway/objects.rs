//! The Gateway API's objects as the proxy reads them: the fields it acts
//! on, typed (defaults are the CRDs' own, applied by the API server), and
//! each status as JSON (the proxy writes status whole, see `status`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) const GROUP: &str = "gateway.networking.k8s.io";

/// Implements the traits `kube::Api` and the watcher need.
macro_rules! resource {
    ($type:ident, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = concat!("gateway.networking.k8s.io/", $version);
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }
        impl k8s_openapi::Metadata for $type {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource!(
    GatewayClass,
    "v1",
    "GatewayClass",
    "gatewayclasses",
    ClusterResourceScope
);
resource!(Gateway, "v1", "Gateway", "gateways", NamespaceResourceScope);
resource!(
    HttpRoute,
    "v1",
    "HTTPRoute",
    "httproutes",
    NamespaceResourceScope
);
resource!(
    ReferenceGrant,
    "v1beta1",
    "ReferenceGrant",
    "referencegrants",
    NamespaceResourceScope
);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct GatewayClass {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: GatewayClassSpec,
    #[serde(default)]
    pub(crate) status: Value,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GatewayClassSpec {
    #[serde(default)]
    pub(crate) controller_name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct Gateway {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: GatewaySpec,
    #[serde(default)]
    pub(crate) status: Value,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GatewaySpec {
    #[serde(default)]
    pub(crate) gateway_class_name: String,
    #[serde(default)]
    pub(crate) listeners: Vec<Listener>,
    #[serde(default)]
    pub(crate) addresses: Vec<Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Listener {
    pub(crate) name: String,
    pub(crate) hostname: Option<String>,
    pub(crate) port: i32,
    pub(crate) protocol: String,
    pub(crate) tls: Option<ListenerTls>,
    #[serde(default)]
    pub(crate) allowed_routes: AllowedRoutes,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListenerTls {
    pub(crate) mode: Option<String>,
    #[serde(default)]
    pub(crate) certificate_refs: Vec<ObjectRef>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllowedRoutes {
    #[serde(default)]
    pub(crate) namespaces: RouteNamespaces,
    pub(crate) kinds: Option<Vec<RouteKind>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RouteNamespaces {
    pub(crate) from: Option<String>,
    pub(crate) selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct RouteKind {
    pub(crate) group: Option<String>,
    pub(crate) kind: String,
}

/// A reference to an object of any kind (a Secret, a Service).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub(crate) struct ObjectRef {
    #[serde(default)]
    pub(crate) group: String,
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct HttpRoute {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: HttpRouteSpec,
    #[serde(default)]
    pub(crate) status: Value,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HttpRouteSpec {
    #[serde(default)]
    pub(crate) parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub(crate) hostnames: Vec<String>,
    #[serde(default)]
    pub(crate) rules: Vec<Rule>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ParentRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) section_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) port: Option<i32>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rule {
    #[serde(default)]
    pub(crate) matches: Vec<RouteMatch>,
    #[serde(default)]
    pub(crate) filters: Vec<Filter>,
    #[serde(default)]
    pub(crate) backend_refs: Vec<BackendRef>,
    pub(crate) timeouts: Option<Timeouts>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RouteMatch {
    pub(crate) path: Option<PathMatch>,
    #[serde(default)]
    pub(crate) headers: Vec<ValueMatch>,
    #[serde(default)]
    pub(crate) query_params: Vec<ValueMatch>,
    pub(crate) method: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct PathMatch {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) value: Option<String>,
}

/// A header or query parameter match.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct ValueMatch {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    pub(crate) value: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Filter {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) request_header_modifier: Option<HeaderModifier>,
    pub(crate) response_header_modifier: Option<HeaderModifier>,
    pub(crate) request_mirror: Option<Mirror>,
    pub(crate) request_redirect: Option<Redirect>,
    pub(crate) url_rewrite: Option<Rewrite>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct HeaderModifier {
    #[serde(default)]
    pub(crate) set: Vec<HeaderValue>,
    #[serde(default)]
    pub(crate) add: Vec<HeaderValue>,
    #[serde(default)]
    pub(crate) remove: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct HeaderValue {
    pub(crate) name: String,
    pub(crate) value: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Mirror {
    pub(crate) backend_ref: ObjectRef,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Redirect {
    pub(crate) scheme: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) path: Option<PathModifier>,
    pub(crate) port: Option<i32>,
    pub(crate) status_code: Option<u16>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rewrite {
    pub(crate) hostname: Option<String>,
    pub(crate) path: Option<PathModifier>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PathModifier {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) replace_full_path: Option<String>,
    pub(crate) replace_prefix_match: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct BackendRef {
    #[serde(flatten)]
    pub(crate) target: ObjectRef,
    pub(crate) weight: Option<u32>,
    #[serde(default)]
    pub(crate) filters: Vec<Filter>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Timeouts {
    pub(crate) request: Option<String>,
    pub(crate) backend_request: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct ReferenceGrant {
    #[serde(default)]
    pub(crate) metadata: ObjectMeta,
    #[serde(default)]
    pub(crate) spec: ReferenceGrantSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct ReferenceGrantSpec {
    #[serde(default)]
    pub(crate) from: Vec<GrantFrom>,
    #[serde(default)]
    pub(crate) to: Vec<GrantTo>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct GrantFrom {
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub(crate) struct GrantTo {
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) name: Option<String>,
}

/// Whether a ReferenceGrant in the target's namespace lets an object of
/// `from_kind` in `from_namespace` refer to `kind` `name` there.
pub(crate) fn granted(
    grants: &[&ReferenceGrant],
    from_kind: &str,
    from_namespace: &str,
    to_group: &str,
    to_kind: &str,
    to_name: &str,
) -> bool {
    grants.iter().any(|grant| {
        grant
            .spec
            .from
            .iter()
            .any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_namespace)
            && grant.spec.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to_name)
            })
    })
}

/// A Gateway API duration (`1h2m3s4ms`, up to four parts).
pub(crate) fn duration(text: &str) -> Option<std::time::Duration> {
    let mut total = std::time::Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, millis) = if let Some(r) = rest.strip_prefix("ms") {
            (r, 1)
        } else if let Some(r) = rest.strip_prefix('h') {
            (r, 3_600_000)
        } else if let Some(r) = rest.strip_prefix('m') {
            (r, 60_000)
        } else if let Some(r) = rest.strip_prefix('s') {
            (r, 1_000)
        } else {
            return None;
        };
        rest = unit;
        total += std::time::Duration::from_millis(number * millis);
    }
    Some(total)
}
