//! Talking to the kernel through the `nft` command (as Kubernetes'
//! knftables does): a transaction is one `nft -f -` run, all or nothing.
//! [`FakeNft`] records transactions for unit tests.

use std::time::Duration;

use super::rules::TABLE_NAME;
use crate::model::Family;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `nft` could not be started (not installed?).
    #[error("cannot run nft: {0}")]
    Spawn(std::io::Error),
    /// The kernel or nft refused the transaction; nothing was applied.
    #[error("nft failed: {0}")]
    Rejected(String),
    /// `nft -j list` printed something unexpected.
    #[error("cannot read nft's listing: {0}")]
    Listing(String),
}

/// Chains and sets (not maps: those are fixed) in Portal's table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Existing {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
}

/// Where transactions go.
pub trait Nft: Send {
    /// Applies one transaction atomically.
    fn apply(&mut self, script: &str) -> Result<(), Error>;
    /// What Portal's table holds now (empty when there is no table).
    fn existing(&mut self) -> Result<Existing, Error>;

    /// Only the chains (cheaper: no sets).
    fn chains(&mut self) -> Result<Vec<String>, Error> {
        self.existing().map(|existing| existing.chains)
    }
}

/// The real kernel, through `nft`; listings read the table of `family`.
#[derive(Debug, Clone, Copy)]
pub struct NftCommand {
    pub family: Family,
}

impl Default for NftCommand {
    fn default() -> Self {
        NftCommand { family: Family::V4 }
    }
}

/// A full sync of 10,000 Services takes about 3 s; far more means `nft`
/// is stuck.
const NFT_TIMEOUT: Duration = Duration::from_secs(120);

fn run(args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
    let output = crate::command::run("nft", args, stdin.map(str::to_owned), NFT_TIMEOUT).map_err(
        |error| match error.kind() {
            std::io::ErrorKind::TimedOut => Error::Rejected(error.to_string()),
            _ => Error::Spawn(error),
        },
    )?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // nft quotes the offending line; the first lines say what is wrong.
        let message: Vec<&str> = stderr.lines().take(6).collect();
        Err(Error::Rejected(message.join(" | ")))
    }
}

/// Names of the `kind` objects of `table` in a `nft -j list` output.
fn names(kind: &str, listing: &str, table: &str) -> Result<Vec<String>, Error> {
    let json: serde_json::Value =
        serde_json::from_str(listing).map_err(|e| Error::Listing(e.to_string()))?;
    let objects = json["nftables"].as_array().cloned().unwrap_or_default();
    Ok(objects
        .iter()
        .filter_map(|o| o.get(kind))
        .filter(|o| o["table"] == table)
        .filter_map(|o| o["name"].as_str().map(str::to_owned))
        .collect())
}

impl Nft for NftCommand {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        run(&["-f", "-"], Some(script)).map(drop)
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        // `list chains/sets ip` lists names without rules or elements, which
        // stays fast with tens of thousands of chains (a table listing does
        // not) and does not fail when the table is missing.
        let family = self.family.nft();
        Ok(Existing {
            chains: names(
                "chain",
                &run(&["-j", "list", "chains", family], None)?,
                TABLE_NAME,
            )?,
            // Terse: without the elements (the hairpin set has one per endpoint).
            sets: names(
                "set",
                &run(&["-t", "-j", "list", "sets", family], None)?,
                TABLE_NAME,
            )?,
        })
    }

    fn chains(&mut self) -> Result<Vec<String>, Error> {
        let family = self.family.nft();
        names(
            "chain",
            &run(&["-j", "list", "chains", family], None)?,
            TABLE_NAME,
        )
    }
}

/// Records every transaction; can be told to fail the next one.
#[derive(Debug, Default)]
pub struct FakeNft {
    pub transactions: Vec<String>,
    pub existing: Existing,
    pub fail_next: bool,
}

impl Nft for FakeNft {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        if std::mem::take(&mut self.fail_next) {
            return Err(Error::Rejected("injected failure".into()));
        }
        self.transactions.push(script.to_owned());
        Ok(())
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        Ok(self.existing.clone())
    }
}

impl<T: Nft + ?Sized> Nft for Box<T> {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        (**self).apply(script)
    }

    fn existing(&mut self) -> Result<Existing, Error> {
        (**self).existing()
    }

    fn chains(&mut self) -> Result<Vec<String>, Error> {
        (**self).chains()
    }
}
