//! `portal-bench endpoints`: the endpoints controller at scale. Fills a
//! namespace with Services and ready pods, waits for the EndpointSlices to
//! converge, then flips single pods' readiness and times, from the moment
//! the status write is sent, until a watch on EndpointSlices shows the
//! change (SPEC E1, issue 5: p99 < 50 ms at 10,000 Services / 50,000 pods).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::portal::{Client, Portal};
use crate::stats::Samples;

type Error = String;
const NS: &str = "bench-ep";

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[arg(long, default_value = "target/release/portal")]
    portal: std::path::PathBuf,
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    #[arg(long, default_value_t = 50_000)]
    pods: usize,
    /// Readiness flips timed.
    #[arg(long, default_value_t = 200)]
    samples: usize,
}

fn pod_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 64 + i / 65_536, (i / 256) % 256, i % 256)
}

fn pod_status(i: usize, ready: bool) -> Bytes {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    Bytes::from(
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": NS},
            "status": {"phase": "Running", "podIP": pod_ip(i),
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now}]},
        })
        .to_string(),
    )
}

/// Runs `count` requests over `clients` connections.
async fn fill(
    portal: &Portal,
    count: usize,
    request: impl Fn(usize) -> (&'static str, String, Bytes) + Send + Sync + 'static,
) -> Result<(), Error> {
    let request = Arc::new(request);
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..32 {
        let mut client = portal.connect().await?;
        let (next, request) = (next.clone(), request.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                if i >= count {
                    return Ok::<_, Error>(());
                }
                let (method, path, body) = request(i);
                let (code, reply) = client.call(method, &path, body).await?;
                if !(200..300).contains(&code) {
                    return Err(format!(
                        "{method} {path}: {code} {}",
                        String::from_utf8_lossy(&reply)
                    ));
                }
            }
        }));
    }
    for worker in futures_util::future::join_all(workers).await {
        worker.map_err(|e| e.to_string())??;
    }
    Ok(())
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn slice_count(client: &mut Client) -> Result<(usize, String), Error> {
    let (_, body) = client
        .call(
            "GET",
            &format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"),
            Bytes::new(),
        )
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let ready = list["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .map(|s| s["endpoints"].as_array().map_or(0, Vec::len))
            .sum()
    });
    Ok((
        ready,
        list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .to_owned(),
    ))
}

pub(crate) async fn run(args: &Args) -> Result<String, Error> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    // The controllers run as their own process (`portal controllers`, as
    // they may in production) so their memory is measured apart.
    let portal = Portal::start(
        &args.portal,
        dir.path(),
        &["--disable", "controllers,proxy"],
    )?;
    let mut controllers = std::process::Command::new(&args.portal)
        .arg("controllers")
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .env(
            "RUST_LOG",
            std::env::var("PORTAL_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("portal controllers: {e}"))?;
    let result = measure(args, &portal, controllers.id()).await;
    let _ = controllers.kill();
    let _ = controllers.wait();
    result
}

async fn measure(args: &Args, portal: &Portal, controllers: u32) -> Result<String, Error> {
    let mut admin = portal.connect().await?;
    admin
        .call(
            "POST",
            "/api/v1/namespaces",
            Bytes::from(format!(r#"{{"metadata":{{"name":"{NS}"}}}}"#)),
        )
        .await?;
    let services = args.services;
    let started = Instant::now();
    fill(portal, services, move |i| {
        let body = serde_json::json!({"metadata": {"name": format!("s{i}")},
            "spec": {"selector": {"app": format!("s{i}")}, "ports": [{"port": 80, "targetPort": 8080}]}});
        ("POST", format!("/api/v1/namespaces/{NS}/services"), Bytes::from(body.to_string()))
    })
    .await?;
    fill(portal, args.pods, move |i| {
        let body = serde_json::json!({"metadata": {"name": format!("p{i}"), "labels": {"app": format!("s{}", i % services)}},
            // Running pods are bound; the scheduler is not what is measured.
            "spec": {"nodeName": format!("node-{}", i % 100), "containers": [{"name": "c", "image": "registry.local/app:1"}]}});
        ("POST", format!("/api/v1/namespaces/{NS}/pods"), Bytes::from(body.to_string()))
    })
    .await?;
    fill(portal, args.pods, |i| {
        (
            "PUT",
            format!("/api/v1/namespaces/{NS}/pods/p{i}/status"),
            pod_status(i, true),
        )
    })
    .await?;
    let filled = started.elapsed();

    // Converged: every pod is an endpoint in some slice. On a connection
    // of its own: the server closes one left idle through the fill (its
    // header read timeout).
    let mut admin = portal.connect().await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let converge = Instant::now();
    let revision = loop {
        let (endpoints, rv) = slice_count(&mut admin).await?;
        if endpoints >= args.pods {
            break rv;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "slices hold {endpoints} of {} endpoints after 10 minutes",
                args.pods
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let converged = converge.elapsed();

    let path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices?watch=1&resourceVersion={revision}");
    let mut watch = portal.connect().await?.watch(&path).await?;
    let mut samples = Samples::default();
    let mut writer = portal.connect().await?;
    let mut buffer = Vec::new();
    // Every pod starts ready; each sample inverts one pod's readiness.
    let mut is_ready = vec![true; args.pods];
    for n in 0..args.samples {
        let i = (n * 7919) % args.pods;
        is_ready[i] = !is_ready[i];
        let ready = is_ready[i];
        let ip = pod_ip(i);
        let sent = Instant::now();
        writer
            .call(
                "PUT",
                &format!("/api/v1/namespaces/{NS}/pods/p{i}/status"),
                pod_status(i, ready),
            )
            .await?;
        let seen = loop {
            let Some(Ok(frame)) = tokio::time::timeout(Duration::from_secs(10), watch.frame())
                .await
                .map_err(|_| "no slice event in 10 s".to_owned())?
            else {
                return Err("watch ended".into());
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buffer.extend_from_slice(&data);
            let mut found = false;
            while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let event: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
                let hit = event["object"]["endpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| {
                        e["addresses"][0].as_str() == Some(ip.as_str())
                            && e["conditions"]["ready"].as_bool() == Some(ready)
                    });
                found |= hit;
            }
            if found {
                break sent.elapsed();
            }
        };
        samples.push(seen);
    }
    let rss = rss_kib(portal.pid());
    let controllers_rss = rss_kib(controllers);
    Ok(format!(
        "| measure | value |\n| --- | ---: |\n\
         | pod readiness change → EndpointSlice update p50 | {:.2} ms |\n\
         | pod readiness change → EndpointSlice update p99 | {:.2} ms |\n\
         | initial fill ({} Services, {} pods, statuses) | {:.1} s |\n\
         | slices converged after the fill | {:.1} s |\n\
         | `portal server` RSS (API server and store, controllers off) | {} MiB |\n\
         | `portal controllers` RSS (endpoints, mirroring, replication, scheduler) | {} MiB |\n\n\
         {} samples, each a single pod's Ready flip, timed from the status write to the slice event.\n",
        samples.percentile_ms(50.0),
        samples.percentile_ms(99.0),
        args.services,
        args.pods,
        filled.as_secs_f64(),
        converged.as_secs_f64(),
        rss / 1024,
        controllers_rss / 1024,
        args.samples,
    ))
}
