//! Events about what the controllers did, as `kubectl describe` shows them.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client};

/// Records one Event about `object`; failures are logged, never fatal.
pub(crate) async fn record(
    client: &Client,
    object: &ObjectReference,
    kind: &str,
    reason: &str,
    message: &str,
    component: &str,
) {
    let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
    let now = jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", object.name.as_deref().unwrap_or("object"))),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: object.clone(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(kind.into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        source: Some(EventSource {
            component: Some(component.into()),
            host: None,
        }),
        reporting_component: Some(component.into()),
        reporting_instance: Some(component.into()),
        action: Some(reason.into()),
        ..Event::default()
    };
    if let Err(error) = Api::<Event>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &event)
        .await
    {
        tracing::debug!(%error, reason, "recording an event failed");
    }
}
