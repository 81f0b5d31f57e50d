//! Custom resources (issue 30): create throughput of a custom resource
//! whose definition has a structural schema (defaults, an enum, bounds, a
//! map list) and a CEL rule, against a built-in kind of similar size (a
//! ConfigMap with the same bytes of data), on one `portal server`, in
//! alternating rounds so both meet the same machine state.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::portal::{Client, Portal};
use crate::stats::Samples;
use crate::Error;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The portal binary to measure.
    #[arg(long, default_value = "target/release/portal")]
    portal: PathBuf,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per round.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds of each kind, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

const DEFINITION: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.bench.example.com"},
  "spec": {"group": "bench.example.com", "scope": "Namespaced",
    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"],
          "x-kubernetes-validations": [{"rule": "self.size <= self.limit", "message": "size must not exceed limit"}],
          "properties": {
            "size": {"type": "integer", "minimum": 1, "maximum": 100},
            "limit": {"type": "integer", "default": 50},
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "owner": {"type": "string", "maxLength": 64},
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
              "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}}}}}}]}}"#;

fn widget(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "apiVersion": "bench.example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "labels": {"app": "bench"}},
            "spec": {"size": 7, "color": "green", "owner": "team-a",
                     "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]},
        })
        .to_string(),
    )
}

/// A ConfigMap carrying as many bytes as a widget's spec.
fn config_map(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "bench"}},
            "data": {"size": "7", "color": "green", "owner": "team-a",
                     "ports": "http=80,https=443", "limit": "50"},
        })
        .to_string(),
    )
}

async fn creates(
    portal: &Portal,
    clients: usize,
    seconds: f64,
    path: &str,
    body: fn(&str) -> Bytes,
    tag: &str,
) -> Result<(f64, Samples), Error> {
    let mut connections: Vec<Client> = Vec::new();
    for _ in 0..clients {
        connections.push(portal.connect().await?);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let workers = connections.into_iter().enumerate().map(|(w, mut client)| {
        let (tag, path) = (tag.to_owned(), path.to_owned());
        tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut i = 0;
            while Instant::now() < deadline {
                let sent = Instant::now();
                let (code, reply) = client
                    .call("POST", &path, body(&format!("{tag}-{w}-{i}")))
                    .await?;
                if code != 201 {
                    return Err(format!(
                        "create answered {code}: {}",
                        String::from_utf8_lossy(&reply)
                    ));
                }
                samples.push(sent.elapsed());
                i += 1;
            }
            Ok::<_, Error>(samples)
        })
    });
    let mut all = Samples::default();
    for worker in futures_util::future::join_all(workers).await {
        all.extend(worker.map_err(|e| e.to_string())??);
    }
    Ok((all.len() as f64 / started.elapsed().as_secs_f64(), all))
}

pub(crate) async fn run(args: &Args) -> Result<String, Error> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let portal = Portal::start(&args.portal, dir.path(), &["--disable", "proxy,agent"])?;
    let mut admin = portal.connect().await?;
    let namespace = Bytes::from(r#"{"metadata":{"name":"bench"}}"#);
    admin.call("POST", "/api/v1/namespaces", namespace).await?;
    let (code, reply) = admin
        .call(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            Bytes::from(DEFINITION),
        )
        .await?;
    if code != 201 {
        return Err(format!(
            "the CRD: {code} {}",
            String::from_utf8_lossy(&reply)
        ));
    }
    let widgets = "/apis/bench.example.com/v1/namespaces/bench/widgets";
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.call("GET", widgets, Bytes::new()).await?.0 != 200 {
        if Instant::now() > deadline {
            return Err("the CRD was not served".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config_maps = "/api/v1/namespaces/bench/configmaps";
    // Warm both paths.
    creates(&portal, args.clients, 0.5, widgets, widget, "warm").await?;
    creates(&portal, args.clients, 0.5, config_maps, config_map, "warm").await?;
    let (mut anchor, mut custom) = (Samples::default(), Samples::default());
    let (mut anchor_time, mut custom_time) = (0.0, 0.0);
    for round in 0..args.rounds {
        let tag = format!("r{round}");
        let (rate, samples) = creates(
            &portal,
            args.clients,
            args.seconds,
            config_maps,
            config_map,
            &tag,
        )
        .await?;
        anchor_time += samples.len() as f64 / rate;
        anchor.extend(samples);
        let (rate, samples) =
            creates(&portal, args.clients, args.seconds, widgets, widget, &tag).await?;
        custom_time += samples.len() as f64 / rate;
        custom.extend(samples);
        eprintln!("round {round} done");
    }
    let anchor_rate = anchor.len() as f64 / anchor_time;
    let custom_rate = custom.len() as f64 / custom_time;
    let (anchor_p99, custom_p99) = (anchor.percentile_ms(0.99), custom.percentile_ms(0.99));
    Ok(format!(
        "| creates, {} clients, {} rounds of {} s each, alternating | creates/s | p99 |\n|---|---|---|\n\
         | ConfigMap of the same bytes (built-in, anchor) | {anchor_rate:.0} | {anchor_p99:.1} ms |\n\
         | custom resource: structural schema, defaults, enum, bounds, map list, CEL rule | {custom_rate:.0} | {custom_p99:.1} ms |\n\
         | ratio custom / built-in | **{:.2}×** | {:.2}× |\n",
        args.clients,
        args.rounds,
        args.seconds,
        custom_rate / anchor_rate,
        custom_p99 / anchor_p99,
    ))
}
