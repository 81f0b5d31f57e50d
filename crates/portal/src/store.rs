//! `portal store migrate`: moves a cluster that started on the embedded
//! store to etcd, keeping every object and the order of their
//! resourceVersions.
//!
//! etcd numbers revisions itself, so the numbers change; what is kept is
//! their order: the keys are written in the order of their last change,
//! one etcd transaction per original transaction (keys written together
//! stay together, at one revision). Clients see new numbers, so their
//! watches re-list once (410 Gone), as after any compaction.

use std::path::PathBuf;

use portal_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Op, Store};

use crate::Error;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum StoreCommand {
    /// Copy the embedded store of a data directory (its server stopped)
    /// into an empty etcd; then start the server with
    /// `--datastore-endpoint` on the same data directory.
    Migrate(MigrateArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct MigrateArgs {
    /// The data directory of the `portal server` to move (stopped).
    #[arg(long)]
    from: PathBuf,
    /// The etcd cluster to move to: `etcd://HOST:PORT[,…]`, `https://…`.
    #[arg(long)]
    to: String,
    #[command(flatten)]
    etcd_tls: crate::apiserver::EtcdTlsArgs,
}

pub(crate) async fn store(command: StoreCommand) -> Result<(), Error> {
    match command {
        StoreCommand::Migrate(args) => migrate(args).await,
    }
}

fn failed(what: &str) -> impl FnOnce(portal_store::Error) -> Error + '_ {
    move |error| Error::Usage(format!("{what}: {error}"))
}

async fn migrate(args: MigrateArgs) -> Result<(), Error> {
    let options = args.etcd_tls.options(&args.to)?;
    let source_dir = args.from.join("store");
    if !source_dir.exists() {
        return Err(Error::Usage(format!(
            "{}: no embedded store here",
            source_dir.display()
        )));
    }
    let source = EmbeddedStore::open(&source_dir, EmbeddedOptions::default())
        .map_err(failed("the embedded store (is its server still running?)"))?;
    let target = EtcdStore::connect(&options).await.map_err(failed("etcd"))?;
    let (existing, _) = target.list("/registry/").await.map_err(failed("etcd"))?;
    if !existing.is_empty() {
        return Err(Error::Usage(format!(
            "etcd already holds {} keys under /registry/: migrate only into an empty cluster",
            existing.len()
        )));
    }
    let (mut items, revision) = source.list("/").await.map_err(failed("reading"))?;
    // In the order they were last written; keys of one transaction together.
    items.sort_by(|a, b| (a.mod_revision, &a.key).cmp(&(b.mod_revision, &b.key)));
    let mut transactions = 0;
    let mut start = 0;
    while start < items.len() {
        let at = items[start].mod_revision;
        let end = start
            + items[start..]
                .iter()
                .take_while(|kv| kv.mod_revision == at)
                .count();
        let ops = items[start..end]
            .iter()
            .map(|kv| Op::Create {
                key: kv.key.clone(),
                value: kv.value.clone(),
            })
            .collect();
        target.txn(ops).await.map_err(failed("writing to etcd"))?;
        transactions += 1;
        start = end;
    }
    tracing::info!(
        keys = items.len(),
        transactions,
        from_revision = revision,
        "migrated the embedded store to etcd; start the server with --datastore-endpoint {} on {}",
        args.to,
        args.from.display()
    );
    Ok(())
}
