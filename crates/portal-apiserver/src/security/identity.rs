//! One cluster identity for every API server on a shared store (etcd): the
//! cluster CA, the agents' client CA, the admin token and the node token's
//! secret are the same on all of them, so any server accepts any client and
//! nodes trust whichever server answers.
//!
//! As k3s keeps its bootstrap data in its datastore: the first server to
//! start seals its credential files with the cluster token (PBKDF2-SHA256,
//! AES-256-GCM) and stores them at [`KEY`]; a later server started with the
//! same token opens them and writes them into its data directory, where the
//! rest of the server finds them as if it had made them. An operator may
//! supply the CA files instead (`DIR/pki/ca.{crt,key}` before the first
//! start); a server whose own files differ from the cluster's refuses to
//! start rather than split the cluster.

use std::num::NonZeroU32;
use std::path::Path;

use base64::Engine;
use bytes::Bytes;
use portal_store::{Error as StoreError, Op, Store};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::security::join;
use crate::security::pki;
use crate::security::tokens;

/// Where the sealed identity lives (under the registry prefix, so every
/// server's watch cache sees its revision go by).
pub(crate) const KEY: &str = "/registry/portal/identity";

/// The files that make up the identity, relative to the data directory.
const FILES: [&str; 7] = [
    "pki/ca.crt",
    "pki/ca.key",
    "pki/kubelet-client-ca.crt",
    "pki/kubelet-client-ca.key",
    "admin.token",
    "node-token",
    tokens::KEY_FILE,
];

const PBKDF2_ROUNDS: u32 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("this cluster's identity is in its datastore: start with the cluster token (--token-file, the first server's DIR/server-token)")]
    TokenNeeded,
    #[error("the cluster token does not open this cluster's identity (wrong token?)")]
    WrongToken,
    #[error("{0} is not this cluster's: remove it (or supply the cluster's) and start again")]
    Differs(String),
    #[error("the stored cluster identity is unreadable: {0}")]
    Corrupt(String),
}

/// The sealed form, as stored.
#[derive(Serialize, Deserialize)]
struct Sealed {
    version: u32,
    salt: String,
    nonce: String,
    sealed: String,
}

/// The identity, opened: each file's path and contents.
#[derive(Serialize, Deserialize, PartialEq, Eq, Debug)]
struct Files(Vec<(String, String)>);

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn key_of(token: &str, salt: &[u8]) -> LessSafeKey {
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        NonZeroU32::new(PBKDF2_ROUNDS).unwrap_or(NonZeroU32::MIN),
        salt,
        token.as_bytes(),
        &mut key,
    );
    // A 32-byte key is always valid for AES-256-GCM.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap_or_else(|_| unreachable!()))
}

fn seal(files: &Files, token: &str) -> Result<Vec<u8>, Error> {
    let random = SystemRandom::new();
    let mut salt = [0u8; 16];
    let mut nonce = [0u8; 12];
    random
        .fill(&mut salt)
        .and_then(|()| random.fill(&mut nonce))
        .map_err(|_| Error::Corrupt("no randomness".into()))?;
    let mut data = serde_json::to_vec(files).map_err(|e| Error::Corrupt(e.to_string()))?;
    key_of(token, &salt)
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
        .map_err(|_| Error::Corrupt("sealing failed".into()))?;
    let sealed = Sealed {
        version: 1,
        salt: b64().encode(salt),
        nonce: b64().encode(nonce),
        sealed: b64().encode(data),
    };
    serde_json::to_vec(&sealed).map_err(|e| Error::Corrupt(e.to_string()))
}

fn open(stored: &[u8], token: &str) -> Result<Files, Error> {
    let corrupt = |e: &dyn std::fmt::Display| Error::Corrupt(e.to_string());
    let sealed: Sealed = serde_json::from_slice(stored).map_err(|e| corrupt(&e))?;
    if sealed.version != 1 {
        return Err(Error::Corrupt(format!("version {}", sealed.version)));
    }
    let salt = b64().decode(&sealed.salt).map_err(|e| corrupt(&e))?;
    let nonce: [u8; 12] = b64()
        .decode(&sealed.nonce)
        .map_err(|e| corrupt(&e))?
        .try_into()
        .map_err(|_| Error::Corrupt("nonce length".into()))?;
    let mut data = b64().decode(&sealed.sealed).map_err(|e| corrupt(&e))?;
    let plain = key_of(token, &salt)
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
        .map_err(|_| Error::WrongToken)?;
    serde_json::from_slice(plain).map_err(|e| corrupt(&e))
}

/// The identity this server would bring as the first one: the files it
/// has (an operator's CA, its own from an earlier start) and new ones for
/// the rest, made in a scratch directory so that nothing lands in `dir`
/// unless this server wins the race to be first.
fn local_files(dir: &Path) -> Result<Files, Error> {
    let scratch = dir.join(".identity-new");
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::from(pki::Error::Io { path, source })
    };
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("pki")).map_err(io(&scratch))?;
    let made = (|| {
        for name in FILES {
            match std::fs::read(dir.join(name)) {
                Ok(bytes) => pki::write_private(&scratch.join(name), &bytes)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(pki::Error::Io {
                        path: dir.join(name),
                        source,
                    }
                    .into())
                }
            }
        }
        let credentials = pki::load_or_create(&scratch, &[], &[])?;
        pki::agent_client(&scratch)?;
        join::load_or_create_token(&scratch, &credentials.ca_pem)?;
        new_service_account_key(&scratch)?;
        let mut files = Vec::new();
        for name in FILES {
            let path = scratch.join(name);
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            files.push((name.to_owned(), text));
        }
        Ok(Files(files))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    made
}

/// Makes the service-account signing key in `dir` unless it has one.
fn new_service_account_key(dir: &Path) -> Result<(), pki::Error> {
    let path = dir.join(tokens::KEY_FILE);
    if path.exists() {
        return Ok(());
    }
    let pem = tokens::new_key_pem().map_err(|why| pki::Error::Io {
        path: path.clone(),
        source: std::io::Error::other(why),
    })?;
    pki::write_private(&path, pem.as_bytes())
}

/// Writes the cluster's files into `dir`. A file already there must be the
/// same (the CA an operator supplied, or this server's own from before);
/// all are checked before any is written.
fn adopt(dir: &Path, files: &Files) -> Result<(), Error> {
    let mut missing = Vec::new();
    for (name, text) in &files.0 {
        if !FILES.contains(&name.as_str()) {
            return Err(Error::Corrupt(format!("unexpected file {name:?}")));
        }
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(existing) if existing == *text => {}
            Ok(_) => return Err(Error::Differs(path.display().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push((path, text)),
            Err(source) => return Err(pki::Error::Io { path, source }.into()),
        }
    }
    for (path, text) in missing {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| pki::Error::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        pki::write_private(&path, text.as_bytes())?;
    }
    Ok(())
}

/// The cluster token of a first server: given, kept from an earlier
/// attempt, or made (and kept only once this server has won).
fn token_for_first_server(dir: &Path, given: Option<&str>) -> Result<String, Error> {
    if let Some(token) = given {
        return Ok(token.to_owned());
    }
    if let Ok(existing) = std::fs::read_to_string(dir.join("server-token")) {
        return Ok(existing.trim().to_owned());
    }
    let mut bytes = [0u8; 24];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::Corrupt("no randomness".into()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes `dir` hold the cluster's identity: taken from the store, or (the
/// first server) put there.
pub(crate) async fn share(store: &dyn Store, dir: &Path, token: Option<&str>) -> Result<(), Error> {
    // A few times at most: a server that loses the race to be first (or to
    // add the service-account key) takes the winner's identity.
    for _ in 0..3 {
        if let Some(stored) = store.get(KEY).await? {
            let token = match token {
                Some(token) => token.to_owned(),
                None => match std::fs::read_to_string(dir.join("server-token")) {
                    Ok(kept) => kept.trim().to_owned(),
                    Err(_) => return Err(Error::TokenNeeded),
                },
            };
            let mut files = open(&stored.value, &token)?;
            // An identity stored before the service-account key was part
            // of it gains one, once, for every server.
            if !files.0.iter().any(|(name, _)| name == tokens::KEY_FILE) {
                let pem = tokens::new_key_pem().map_err(Error::Corrupt)?;
                files.0.push((tokens::KEY_FILE.to_owned(), pem));
                let op = Op::Update {
                    key: KEY.into(),
                    value: Bytes::from(seal(&files, &token)?),
                    expected_revision: stored.mod_revision,
                };
                match store.txn(vec![op]).await {
                    Ok(_) => {}
                    // Another server added one first: take it.
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(error) => return Err(error.into()),
                }
            }
            adopt(dir, &files)?;
            pki::write_private(&dir.join("server-token"), format!("{token}\n").as_bytes())?;
            return Ok(());
        }
        let chosen = token_for_first_server(dir, token)?;
        let files = local_files(dir)?;
        let op = Op::Create {
            key: KEY.into(),
            value: Bytes::from(seal(&files, &chosen)?),
        };
        match store.txn(vec![op]).await {
            Ok(_) => {
                adopt(dir, &files)?;
                pki::write_private(&dir.join("server-token"), format!("{chosen}\n").as_bytes())?;
                tracing::info!(token = %dir.join("server-token").display(), "cluster identity stored; other API servers start with --token-file of this file");
                return Ok(());
            }
            Err(StoreError::AlreadyExists { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Corrupt("the identity appeared and vanished".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use portal_store::{EmbeddedOptions, EmbeddedStore};

    #[test]
    fn sealed_identity_opens_only_with_its_token() {
        let files = Files(vec![("admin.token".into(), "secret".into())]);
        let sealed = seal(&files, "cluster-token").unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("secret"));
        assert_eq!(open(&sealed, "cluster-token").unwrap(), files);
        assert!(matches!(open(&sealed, "other"), Err(Error::WrongToken)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_server_takes_the_first_ones_identity() {
        let store_dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(store_dir.path(), EmbeddedOptions::default()).unwrap();
        let (first, second, stranger) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        share(&store, first.path(), None).await.unwrap();
        let token = std::fs::read_to_string(first.path().join("server-token")).unwrap();
        // Without the token, or with a wrong one: refused.
        assert!(matches!(
            share(&store, second.path(), None).await,
            Err(Error::TokenNeeded)
        ));
        assert!(matches!(
            share(&store, second.path(), Some("wrong")).await,
            Err(Error::WrongToken)
        ));
        share(&store, second.path(), Some(token.trim()))
            .await
            .unwrap();
        for name in FILES {
            assert_eq!(
                std::fs::read(first.path().join(name)).unwrap(),
                std::fs::read(second.path().join(name)).unwrap(),
                "{name}"
            );
        }
        // Two first servers racing with one token: one identity for both.
        let racing_store_dir = tempfile::tempdir().unwrap();
        let racing =
            EmbeddedStore::open(racing_store_dir.path(), EmbeddedOptions::default()).unwrap();
        let (x, y) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (rx, ry) = tokio::join!(
            share(&racing, x.path(), Some("shared")),
            share(&racing, y.path(), Some("shared"))
        );
        rx.unwrap();
        ry.unwrap();
        for name in FILES {
            assert_eq!(
                std::fs::read(x.path().join(name)).unwrap(),
                std::fs::read(y.path().join(name)).unwrap(),
                "{name}"
            );
        }
        // A server with a CA of its own does not silently join.
        pki::load_or_create(stranger.path(), &[], &[]).unwrap();
        assert!(matches!(
            share(&store, stranger.path(), Some(token.trim())).await,
            Err(Error::Differs(_))
        ));
    }
}
