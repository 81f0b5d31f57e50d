//! `portal-bench`: the API server on its embedded store and on etcd, against
//! raw etcd, side by side in one run on loopback. Reports ratios; absolute numbers depend on the
//! machine.
//!
//! - create throughput and p99 at 1, 16, 64 concurrent clients: a full Portal
//!   create (HTTPS, decoding, validation, fsync) vs an etcd put of the same
//!   bytes (gRPC, fsync);
//! - list of 10,000 Services vs an etcd range read of 10,000 keys;
//! - watch delivery: one write seen by 100 watchers, from the moment the write
//!   is sent to the moment each watcher has the event.

// A command-line report: printing is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod aggregation;
mod custom;
mod endpoints;
mod etcd;
mod portal;
mod stats;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::BodyExt;
use stats::Samples;

#[derive(Parser, Debug)]
#[command(name = "portal-bench")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(clap::Subcommand, Debug)]
enum Bench {
    /// API server and store vs etcd.
    Store(Args),
    /// The endpoints controller at scale.
    Endpoints(endpoints::Args),
    /// Custom resources against a built-in kind of the same size.
    Custom(custom::Args),
}

#[derive(clap::Args, Debug)]
struct Args {
    /// The portal binary to measure.
    #[arg(long, default_value = "target/release/portal")]
    portal: PathBuf,
    /// The etcd binary of the anchor.
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// Seconds per create measurement.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Objects in the list measurement.
    #[arg(long, default_value_t = 10_000)]
    list_objects: usize,
    /// Concurrent watchers in the watch measurement.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Writes observed in the watch measurement.
    #[arg(long, default_value_t = 200)]
    watch_writes: usize,
}

type Error = String;

fn service_body(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": {"app": "bench", "tier": "frontend"}},
            "spec": {"selector": {"app": "bench"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        })
        .to_string(),
    )
}

/// Runs `clients` workers until `deadline`; each yields its latencies.
async fn portal_creates(
    portal: &portal::Portal,
    clients: usize,
    seconds: f64,
    tag: &str,
) -> Result<(f64, Samples), Error> {
    creates(
        portal,
        clients,
        seconds,
        "/api/v1/namespaces/bench/services",
        service_body,
        tag,
    )
    .await
}

/// `clients` workers POSTing `body(name)` to `path` until `seconds` have
/// passed: the rate and every latency.
pub(crate) async fn creates(
    portal: &portal::Portal,
    clients: usize,
    seconds: f64,
    path: &str,
    body: fn(&str) -> Bytes,
    tag: &str,
) -> Result<(f64, Samples), Error> {
    let mut connections = Vec::new();
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

async fn etcd_puts(
    etcd: &etcd::Etcd,
    clients: usize,
    seconds: f64,
    tag: &str,
) -> Result<(f64, Samples), Error> {
    let mut connections = Vec::new();
    for _ in 0..clients {
        connections.push(etcd.connect().await?);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let workers = connections.into_iter().enumerate().map(|(w, mut client)| {
        let tag = tag.to_owned();
        tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut i = 0;
            while Instant::now() < deadline {
                let name = format!("{tag}-{w}-{i}");
                let key = format!("/registry/services/bench/{name}");
                let sent = Instant::now();
                client.put(key, service_body(&name)).await?;
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

/// Fills a namespace with `count` Services (64 writers), then times lists.
async fn portal_list(portal: &portal::Portal, count: usize) -> Result<Samples, Error> {
    let mut admin = portal.connect().await?;
    let ns = Bytes::from(r#"{"metadata":{"name":"bench-list"}}"#);
    admin.call("POST", "/api/v1/namespaces", ns).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for _ in 0..64 {
        let mut client = portal.connect().await?;
        let next = next.clone();
        writers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                if i >= count {
                    return Ok::<_, Error>(());
                }
                let (code, _) = client
                    .call(
                        "POST",
                        "/api/v1/namespaces/bench-list/services",
                        service_body(&format!("l{i}")),
                    )
                    .await?;
                if code != 201 {
                    return Err(format!("create answered {code}"));
                }
            }
        }));
    }
    for w in futures_util::future::join_all(writers).await {
        w.map_err(|e| e.to_string())??;
    }
    let mut samples = Samples::default();
    for _ in 0..40 {
        let sent = Instant::now();
        let (code, body) = admin
            .call(
                "GET",
                "/api/v1/namespaces/bench-list/services",
                Bytes::new(),
            )
            .await?;
        samples.push(sent.elapsed());
        let listed: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let items = listed["items"].as_array().map_or(0, Vec::len);
        if code != 200 || items != count {
            return Err(format!("list answered {code} with {items} items"));
        }
    }
    Ok(samples)
}

async fn etcd_list(etcd: &etcd::Etcd, count: usize) -> Result<Samples, Error> {
    let mut client = etcd.connect().await?;
    for i in 0..count {
        let name = format!("l{i}");
        client
            .put(
                format!("/registry/services/bench-list/{name}"),
                service_body(&name),
            )
            .await?;
    }
    let mut samples = Samples::default();
    for _ in 0..40 {
        let sent = Instant::now();
        let found = client
            .range_prefix("/registry/services/bench-list/")
            .await?;
        samples.push(sent.elapsed());
        if found != count {
            return Err(format!("etcd range returned {found}"));
        }
    }
    Ok(samples)
}

/// Send times of the watched writes, as nanoseconds after `base`.
struct Sent {
    base: Instant,
    at: Vec<AtomicU64>,
}

impl Sent {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Sent {
            base: Instant::now(),
            at: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    fn mark(&self, i: usize) {
        self.at[i].store(self.base.elapsed().as_nanos() as u64, Ordering::SeqCst);
    }
    fn latency(&self, i: usize) -> Duration {
        let now = self.base.elapsed().as_nanos() as u64;
        Duration::from_nanos(now.saturating_sub(self.at[i].load(Ordering::SeqCst)))
    }
}

/// The write index in a name like `wNNN`.
fn write_index(text: &str) -> Option<usize> {
    let start = text.find("\"name\":\"w")? + 9;
    let end = text[start..].find('"')? + start;
    text[start..end].parse().ok()
}

async fn portal_watch(
    portal: &portal::Portal,
    watchers: usize,
    writes: usize,
) -> Result<Samples, Error> {
    let mut admin = portal.connect().await?;
    admin
        .call(
            "POST",
            "/api/v1/namespaces",
            Bytes::from(r#"{"metadata":{"name":"bench-watch"}}"#),
        )
        .await?;
    let (_, body) = admin
        .call(
            "GET",
            "/api/v1/namespaces/bench-watch/services",
            Bytes::new(),
        )
        .await?;
    let listed: serde_json::Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_owned();
    let sent = Sent::new(writes);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..watchers {
        let path = format!("/api/v1/namespaces/bench-watch/services?watch=1&resourceVersion={rv}");
        let mut body = portal.connect().await?.watch(&path).await?;
        let (tx, sent) = (tx.clone(), sent.clone());
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut seen = 0;
            while seen < writes {
                let Some(Ok(frame)) = body.frame().await else {
                    return;
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                buffer.extend_from_slice(&data);
                while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    if let Some(i) = write_index(&String::from_utf8_lossy(&line)) {
                        let _ = tx.send(sent.latency(i));
                        seen += 1;
                    }
                }
            }
        });
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..writes {
        sent.mark(i);
        admin
            .call(
                "POST",
                "/api/v1/namespaces/bench-watch/services",
                service_body(&format!("w{i}")),
            )
            .await?;
    }
    collect(&mut rx, watchers * writes).await
}

async fn etcd_watch(etcd: &etcd::Etcd, watchers: usize, writes: usize) -> Result<Samples, Error> {
    let mut writer = etcd.connect().await?;
    let sent = Sent::new(writes);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut clients = Vec::new();
    for _ in 0..watchers {
        let mut client = etcd.connect().await?;
        let mut stream = client
            .watch_prefix("/registry/services/bench-watch/")
            .await?;
        let (tx, sent) = (tx.clone(), sent.clone());
        tokio::spawn(async move {
            while let Ok(Some(response)) = stream.message().await {
                for event in &response.events {
                    let key = event
                        .kv
                        .as_ref()
                        .and_then(|kv| std::str::from_utf8(&kv.key).ok())
                        .unwrap_or("");
                    if let Some(i) = key
                        .rsplit('/')
                        .next()
                        .and_then(|n| n.strip_prefix('w'))
                        .and_then(|n| n.parse().ok())
                    {
                        let _ = tx.send(sent.latency(i));
                    }
                }
            }
        });
        clients.push(client);
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..writes {
        let name = format!("w{i}");
        sent.mark(i);
        writer
            .put(
                format!("/registry/services/bench-watch/{name}"),
                service_body(&name),
            )
            .await?;
    }
    collect(&mut rx, watchers * writes).await
}

async fn collect(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Duration>,
    expected: usize,
) -> Result<Samples, Error> {
    let mut samples = Samples::default();
    while samples.len() < expected {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(latency)) => samples.push(latency),
            _ => {
                return Err(format!(
                    "watchers saw {} of {expected} events",
                    samples.len()
                ))
            }
        }
    }
    Ok(samples)
}

struct Row {
    measure: String,
    portal: f64,
    /// The same API server on etcd (its own etcd, not the anchor's).
    on_etcd: f64,
    etcd: f64,
    unit: &'static str,
    /// Whether a larger number is better (throughput) or worse (latency).
    higher_is_better: bool,
}

fn render(rows: &[Row], args: &Args) -> String {
    let mut out = String::from(
        "| measure | Portal (embedded) | Portal on etcd | etcd | embedded vs etcd | on etcd vs etcd |\n| --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for row in rows {
        let ratio = |portal: f64| {
            if row.higher_is_better {
                portal / row.etcd
            } else {
                row.etcd / portal
            }
        };
        let word = if row.higher_is_better {
            "× throughput"
        } else {
            "× faster"
        };
        out.push_str(&format!(
            "| {} | {:.2} {u} | {:.2} {u} | {:.2} {u} | {:.2}{word} | {:.2}{word} |\n",
            row.measure,
            row.portal,
            row.on_etcd,
            row.etcd,
            ratio(row.portal),
            ratio(row.on_etcd),
            u = row.unit,
        ));
    }
    out.push_str(&format!(
        "\n{}s per create cell; list of {} objects, 40 reads; watch: {} watchers × {} writes.\n",
        args.seconds, args.list_objects, args.watchers, args.watch_writes
    ));
    out
}

async fn run(args: &Args) -> Result<String, Error> {
    let portal_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let etcd_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    // The API server and store alone, as etcd is alone: the controllers
    // would turn every Service create into three writes.
    let portal = portal::Portal::start(
        &args.portal,
        portal_dir.path(),
        &["--disable", "controllers,proxy"],
    )?;
    let etcd = etcd::Etcd::start(&args.etcd, etcd_dir.path()).await?;
    // The same API server on an etcd of its own (the anchor's keyspace
    // stays untouched).
    let backing_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let backing = etcd::Etcd::start(&args.etcd, backing_dir.path()).await?;
    let on_etcd_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let on_etcd = portal::Portal::start(
        &args.portal,
        on_etcd_dir.path(),
        &[
            "--disable",
            "controllers,proxy",
            "--datastore-endpoint",
            &backing.endpoint,
        ],
    )?;
    for server in [&portal, &on_etcd] {
        server
            .connect()
            .await?
            .call(
                "POST",
                "/api/v1/namespaces",
                Bytes::from(r#"{"metadata":{"name":"bench"}}"#),
            )
            .await?;
    }
    let mut rows = Vec::new();
    for clients in [1usize, 16, 64] {
        let (p_rate, mut p) =
            portal_creates(&portal, clients, args.seconds, &format!("c{clients}")).await?;
        let (o_rate, mut o) =
            portal_creates(&on_etcd, clients, args.seconds, &format!("c{clients}")).await?;
        let (e_rate, mut e) =
            etcd_puts(&etcd, clients, args.seconds, &format!("c{clients}")).await?;
        eprintln!(
            "create x{clients}: portal {p_rate:.0}/s, portal on etcd {o_rate:.0}/s, etcd {e_rate:.0}/s"
        );
        rows.push(Row {
            measure: format!("create, {clients} clients"),
            portal: p_rate,
            on_etcd: o_rate,
            etcd: e_rate,
            unit: "obj/s",
            higher_is_better: true,
        });
        rows.push(Row {
            measure: format!("create p99, {clients} clients"),
            portal: p.percentile_ms(99.0),
            on_etcd: o.percentile_ms(99.0),
            etcd: e.percentile_ms(99.0),
            unit: "ms",
            higher_is_better: false,
        });
    }
    let (mut p, mut o, mut e) = (
        portal_list(&portal, args.list_objects).await?,
        portal_list(&on_etcd, args.list_objects).await?,
        etcd_list(&etcd, args.list_objects).await?,
    );
    for (name, pct) in [("p50", 50.0), ("p99", 99.0)] {
        rows.push(Row {
            measure: format!("list {} Services {name}", args.list_objects),
            portal: p.percentile_ms(pct),
            on_etcd: o.percentile_ms(pct),
            etcd: e.percentile_ms(pct),
            unit: "ms",
            higher_is_better: false,
        });
    }
    let mut p = portal_watch(&portal, args.watchers, args.watch_writes).await?;
    let mut o = portal_watch(&on_etcd, args.watchers, args.watch_writes).await?;
    let mut e = etcd_watch(&etcd, args.watchers, args.watch_writes).await?;
    for (name, pct) in [("p50", 50.0), ("p99", 99.0)] {
        rows.push(Row {
            measure: format!("watch delivery to {} watchers {name}", args.watchers),
            portal: p.percentile_ms(pct),
            on_etcd: o.percentile_ms(pct),
            etcd: e.percentile_ms(pct),
            unit: "ms",
            higher_is_better: false,
        });
    }
    Ok(render(&rows, args))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &cli.bench {
            Bench::Store(args) => run(args).await,
            Bench::Endpoints(args) => endpoints::run(args).await,
            Bench::Custom(args) => custom::run(args).await,
        }
    });
    match result {
        Ok(table) => {
            println!("{table}");
            if let Ok(out) = std::env::var("BENCH_OUT") {
                if let Err(e) = std::fs::write(&out, &table) {
                    eprintln!("{out}: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
