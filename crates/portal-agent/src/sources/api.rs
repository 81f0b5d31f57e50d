//! The `api` source: the pods bound to this node, watched from the API
//! server. Mirror pods (the API's copies of this node's static pods) are
//! not run: they go to the mirror manager. A re-list (the first one, or
//! after the watch fell behind) also ends the API pods that vanished
//! meanwhile.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use super::Source;
use crate::mirror::is_mirror;
use crate::pods::Context;
use crate::runtime::Runtime;

pub(crate) async fn run<R: Runtime>(ctx: Arc<Context<R>>, client: Client) {
    let api = Api::<Pod>::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.me.name));
    let mut relisted: Vec<String> = Vec::new();
    let mut mirrors: Vec<Pod> = Vec::new();
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) if is_mirror(&pod) => {
                if let Some(uid) = ctx.status.mirror_drifted(&pod) {
                    ctx.dispatch(&uid);
                }
                ctx.mirrors.apply(pod);
            }
            Ok(watcher::Event::Delete(pod)) if is_mirror(&pod) => ctx.mirrors.delete(&pod),
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(uid) = ctx.desired.set(pod) {
                    ctx.dispatch(&uid);
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    ctx.confirmed.lock().remove(uid);
                    ctx.desired.remove(uid);
                    ctx.dispatch(uid);
                }
            }
            Ok(watcher::Event::Init) => {
                relisted.clear();
                mirrors.clear();
            }
            Ok(watcher::Event::InitApply(pod)) if is_mirror(&pod) => mirrors.push(pod),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    ctx.desired.set(pod);
                    relisted.push(uid);
                }
            }
            Ok(watcher::Event::InitDone) => {
                for uid in ctx.desired.uids_of(Source::Api) {
                    if !relisted.contains(&uid) {
                        ctx.desired.remove(&uid);
                        ctx.dispatch(&uid);
                    }
                }
                ctx.mirrors.relisted(std::mem::take(&mut mirrors));
                ctx.desired.source_ready(Source::Api);
                crate::pods::sweep(&ctx);
            }
            Err(error) => tracing::warn!(%error, "watching this node's pods"),
        }
    }
}
