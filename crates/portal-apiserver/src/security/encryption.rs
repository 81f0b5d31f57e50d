//! Encryption at rest (`--encryption-provider-config`, Kubernetes'
//! `EncryptionConfiguration`): the objects of the resources it names are
//! sealed before they reach the store and opened when read back, whichever
//! backend holds them (the embedded store or etcd), so a Secret's plaintext
//! never lands in the store's files.
//!
//! Values carry Kubernetes' envelope, `k8s:enc:<provider>:v1:<key name>:`
//! then the ciphertext: `aescbc` (AES-CBC with PKCS#7 padding, a random IV
//! first) and `secretbox` (XSalsa20-Poly1305, a random 24-byte nonce
//! first); `identity` stores plain JSON. The first provider of a resource
//! seals every write; any listed provider (by envelope and key name)
//! opens, so keys rotate by putting the new key first and re-writing the
//! objects (`kubectl get secrets -A -o json | kubectl replace -f -`).
//! Plain values are readable only where `identity` is listed, as upstream.

use std::sync::Arc;

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::Engine as _;
use bytes::Bytes;
use crypto_secretbox::aead::{Aead, KeyInit};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use portal_store::{Error as StoreError, EventBatch, KeyValue, Op, Revision, Store, WatchStream};
use rand::RngCore;
use serde::Deserialize;

const ENVELOPE: &[u8] = b"k8s:enc:";

/// One way values are kept.
#[derive(Clone)]
enum Provider {
    Identity,
    AesCbc(Vec<(String, Vec<u8>)>),
    Secretbox(Vec<(String, [u8; 32])>),
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        match self {
            Provider::Identity => write!(f, "identity"),
            Provider::AesCbc(keys) => write!(f, "aescbc({} keys)", keys.len()),
            Provider::Secretbox(keys) => write!(f, "secretbox({} keys)", keys.len()),
        }
    }
}

/// The providers of each group of store key prefixes, in the file's order.
#[derive(Clone, Debug)]
pub struct Encryption {
    rules: Vec<(Vec<String>, Vec<Provider>)>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    kind: String,
    api_version: String,
    resources: Vec<ResourceRule>,
}

#[derive(Deserialize)]
struct ResourceRule {
    resources: Vec<String>,
    providers: Vec<ProviderEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    identity: Option<serde_json::Value>,
    aescbc: Option<Keys>,
    secretbox: Option<Keys>,
    aesgcm: Option<serde_json::Value>,
    kms: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Keys {
    keys: Vec<NamedKey>,
}

#[derive(Deserialize)]
struct NamedKey {
    name: String,
    secret: String,
}

impl Encryption {
    /// Reads an `EncryptionConfiguration` file.
    pub fn load(path: &std::path::Path) -> Result<Encryption, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Encryption::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Encryption, String> {
        let file: ConfigFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        if file.kind != "EncryptionConfiguration"
            || !matches!(
                file.api_version.as_str(),
                "apiserver.config.k8s.io/v1" | "apiserver.config.k8s.io/v1beta1"
            )
        {
            return Err(
                "expected kind EncryptionConfiguration of apiserver.config.k8s.io/v1".into(),
            );
        }
        let mut rules = Vec::new();
        for rule in file.resources {
            let prefixes = rule
                .resources
                .iter()
                .map(|r| key_prefix(r))
                .collect::<Result<Vec<_>, _>>()?;
            let providers = rule
                .providers
                .into_iter()
                .map(provider)
                .collect::<Result<Vec<_>, _>>()?;
            if providers.is_empty() {
                return Err(format!("resources {:?}: no providers", rule.resources));
            }
            rules.push((prefixes, providers));
        }
        Ok(Encryption { rules })
    }

    /// The providers for the object at `key`; `None`: kept as it is.
    fn providers(&self, key: &str) -> Option<&[Provider]> {
        self.rules
            .iter()
            .find(|(prefixes, _)| prefixes.iter().any(|p| key.starts_with(p.as_str())))
            .map(|(_, providers)| providers.as_slice())
    }

    /// The value to store for `key`.
    pub fn seal(&self, key: &str, plain: &Bytes) -> Result<Bytes, StoreError> {
        let Some(first) = self.providers(key).and_then(|p| p.first()) else {
            return Ok(plain.clone());
        };
        let sealed = match first {
            Provider::Identity => return Ok(plain.clone()),
            Provider::AesCbc(keys) => {
                let (name, secret) = &keys[0];
                let mut iv = [0u8; 16];
                rand::rng().fill_bytes(&mut iv);
                let body = encrypt_cbc(secret, &iv, plain)?;
                envelope("aescbc", name, &[&iv, &body])
            }
            Provider::Secretbox(keys) => {
                let (name, secret) = &keys[0];
                let mut nonce = [0u8; 24];
                rand::rng().fill_bytes(&mut nonce);
                let cipher = crypto_secretbox::XSalsa20Poly1305::new(secret.into());
                let body = cipher
                    .encrypt(&nonce.into(), plain.as_ref())
                    .map_err(|_| StoreError::Backend("secretbox: sealing failed".into()))?;
                envelope("secretbox", name, &[&nonce, &body])
            }
        };
        Ok(Bytes::from(sealed))
    }

    /// Whether `stored` is in the form a write of `key` makes now: the
    /// first provider, its first key.
    fn current_form(&self, key: &str, stored: &Bytes) -> bool {
        let Some(first) = self.providers(key).and_then(|p| p.first()) else {
            return true;
        };
        let prefix = match first {
            Provider::Identity => return !stored.starts_with(ENVELOPE),
            Provider::AesCbc(keys) => format!("k8s:enc:aescbc:v1:{}:", keys[0].0),
            Provider::Secretbox(keys) => format!("k8s:enc:secretbox:v1:{}:", keys[0].0),
        };
        stored.starts_with(prefix.as_bytes())
    }

    /// The plain value of what is stored at `key`.
    pub fn open(&self, key: &str, stored: &Bytes) -> Result<Bytes, StoreError> {
        let Some(providers) = self.providers(key) else {
            return Ok(stored.clone());
        };
        let Some(rest) = stored.strip_prefix(ENVELOPE) else {
            return if providers.iter().any(|p| matches!(p, Provider::Identity)) {
                Ok(stored.clone())
            } else {
                Err(corrupt(
                    key,
                    "stored unencrypted and no identity provider is listed",
                ))
            };
        };
        let mut parts = rest.splitn(4, |b| *b == b':');
        let (Some(kind), Some(_version), Some(name), Some(body)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(corrupt(key, "malformed envelope"));
        };
        let name = String::from_utf8_lossy(name);
        for provider in providers {
            match (provider, kind) {
                (Provider::AesCbc(keys), b"aescbc") => {
                    if let Some((_, secret)) = keys.iter().find(|(n, _)| *n == name) {
                        if body.len() < 16 {
                            return Err(corrupt(key, "aescbc: too short"));
                        }
                        let (iv, data) = body.split_at(16);
                        return decrypt_cbc(secret, iv, data).map_err(|e| corrupt(key, &e));
                    }
                }
                (Provider::Secretbox(keys), b"secretbox") => {
                    if let Some((_, secret)) = keys.iter().find(|(n, _)| *n == name) {
                        if body.len() < 24 {
                            return Err(corrupt(key, "secretbox: too short"));
                        }
                        let (nonce, data) = body.split_at(24);
                        let cipher = crypto_secretbox::XSalsa20Poly1305::new(secret.into());
                        let nonce: [u8; 24] = nonce.try_into().unwrap_or([0; 24]);
                        return cipher
                            .decrypt(&nonce.into(), data)
                            .map(Bytes::from)
                            .map_err(|_| {
                                corrupt(key, "secretbox: the data does not open with its key")
                            });
                    }
                }
                _ => {}
            }
        }
        Err(corrupt(
            key,
            &format!(
                "no provider holds key {name:?} of {}",
                String::from_utf8_lossy(kind)
            ),
        ))
    }
}

fn corrupt(key: &str, why: &str) -> StoreError {
    StoreError::Corrupt(format!("{key}: {why}"))
}

fn envelope(kind: &str, name: &str, parts: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("k8s:enc:{kind}:v1:{name}:").into_bytes();
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

fn encrypt_cbc(secret: &[u8], iv: &[u8; 16], plain: &[u8]) -> Result<Vec<u8>, StoreError> {
    let wrong = |_| StoreError::Backend("aescbc: bad key length".into());
    Ok(match secret.len() {
        16 => cbc::Encryptor::<aes::Aes128>::new_from_slices(secret, iv)
            .map_err(wrong)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        24 => cbc::Encryptor::<aes::Aes192>::new_from_slices(secret, iv)
            .map_err(wrong)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        _ => cbc::Encryptor::<aes::Aes256>::new_from_slices(secret, iv)
            .map_err(wrong)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
    })
}

fn decrypt_cbc(secret: &[u8], iv: &[u8], data: &[u8]) -> Result<Bytes, String> {
    let failed = |_| "aescbc: the data does not open with its key".to_owned();
    let plain = match secret.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(secret, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(failed)?,
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(secret, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(failed)?,
        _ => cbc::Decryptor::<aes::Aes256>::new_from_slices(secret, iv)
            .map_err(|e| e.to_string())?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .map_err(failed)?,
    };
    Ok(Bytes::from(plain))
}

/// A resource name of the file (`secrets`, `deployments.apps`, `*.apps`,
/// `*.*`) as the store key prefix of its objects.
fn key_prefix(resource: &str) -> Result<String, String> {
    if resource == "*.*" {
        return Ok("/registry/".into());
    }
    let (name, group) = resource.split_once('.').unwrap_or((resource, ""));
    let group = if group.is_empty() { "core" } else { group };
    if name.is_empty() {
        return Err(format!("resource {resource:?}: no name"));
    }
    Ok(if name == "*" {
        format!("/registry/{group}/")
    } else {
        format!("/registry/{group}/{name}/")
    })
}

fn provider(entry: ProviderEntry) -> Result<Provider, String> {
    let decode = |k: &NamedKey| {
        base64::engine::general_purpose::STANDARD
            .decode(&k.secret)
            .map_err(|e| format!("key {:?}: not base64: {e}", k.name))
    };
    match entry {
        ProviderEntry {
            identity: Some(_), ..
        } => Ok(Provider::Identity),
        ProviderEntry {
            aescbc: Some(keys), ..
        } => {
            let mut out = Vec::new();
            for key in &keys.keys {
                let secret = decode(key)?;
                if ![16, 24, 32].contains(&secret.len()) {
                    return Err(format!(
                        "aescbc key {:?}: must be 16, 24 or 32 bytes",
                        key.name
                    ));
                }
                out.push((key.name.clone(), secret));
            }
            non_empty("aescbc", out).map(Provider::AesCbc)
        }
        ProviderEntry {
            secretbox: Some(keys),
            ..
        } => {
            let mut out = Vec::new();
            for key in &keys.keys {
                let secret: [u8; 32] = decode(key)?
                    .try_into()
                    .map_err(|_| format!("secretbox key {:?}: must be 32 bytes", key.name))?;
                out.push((key.name.clone(), secret));
            }
            non_empty("secretbox", out).map(Provider::Secretbox)
        }
        ProviderEntry {
            aesgcm: Some(_), ..
        }
        | ProviderEntry { kms: Some(_), .. } => Err(
            "providers aesgcm and kms are not supported (use aescbc, secretbox or identity)".into(),
        ),
        _ => Err("a provider entry names no provider".into()),
    }
}

fn non_empty<T>(kind: &str, keys: Vec<T>) -> Result<Vec<T>, String> {
    if keys.is_empty() {
        Err(format!("{kind}: no keys"))
    } else {
        Ok(keys)
    }
}

/// A store that seals and opens values as [`Encryption`] says.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    encryption: Arc<Encryption>,
}

impl std::fmt::Debug for EncryptedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedStore")
            .field("encryption", &self.encryption)
            .finish_non_exhaustive()
    }
}

impl EncryptedStore {
    pub fn new(inner: Arc<dyn Store>, encryption: Encryption) -> Self {
        EncryptedStore {
            inner,
            encryption: Arc::new(encryption),
        }
    }
}

fn open_kv(encryption: &Encryption, mut kv: KeyValue) -> Result<KeyValue, StoreError> {
    if !kv.value.is_empty() {
        kv.value = encryption.open(&kv.key, &kv.value)?;
    }
    Ok(kv)
}

impl Store for EncryptedStore {
    fn get(&self, key: &str) -> BoxFuture<'_, portal_store::Result<Option<KeyValue>>> {
        let key = key.to_owned();
        Box::pin(async move {
            match self.inner.get(&key).await? {
                Some(kv) => open_kv(&self.encryption, kv).map(Some),
                None => Ok(None),
            }
        })
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, portal_store::Result<(Vec<KeyValue>, Revision)>> {
        let prefix = prefix.to_owned();
        Box::pin(async move {
            let (items, revision) = self.inner.list(&prefix).await?;
            let items = items
                .into_iter()
                .map(|kv| open_kv(&self.encryption, kv))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((items, revision))
        })
    }

    fn txn(&self, ops: Vec<Op>) -> BoxFuture<'_, portal_store::Result<Revision>> {
        Box::pin(async move {
            let mut sealed = Vec::with_capacity(ops.len());
            for op in ops {
                sealed.push(match op {
                    Op::Create { key, value } => {
                        let value = self.encryption.seal(&key, &value)?;
                        Op::Create { key, value }
                    }
                    Op::Update {
                        key,
                        value,
                        expected_revision,
                    } => {
                        let value = self.encryption.seal(&key, &value)?;
                        Op::Update {
                            key,
                            value,
                            expected_revision,
                        }
                    }
                    delete => delete,
                });
            }
            self.inner.txn(sealed).await
        })
    }

    fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> BoxFuture<'_, portal_store::Result<WatchStream>> {
        let prefix = prefix.to_owned();
        let encryption = self.encryption.clone();
        Box::pin(async move {
            let stream = self.inner.watch(&prefix, after).await?;
            let opened = stream.map(move |batch| {
                let batch: EventBatch = batch?;
                batch
                    .into_iter()
                    .map(|mut event| {
                        event.kv = open_kv(&encryption, event.kv)?;
                        event.prev = event
                            .prev
                            .map(|prev| open_kv(&encryption, prev))
                            .transpose()?;
                        Ok(event)
                    })
                    .collect()
            });
            Ok(Box::pin(opened) as WatchStream)
        })
    }

    fn current_revision(&self) -> BoxFuture<'_, portal_store::Result<Revision>> {
        self.inner.current_revision()
    }

    fn compact(&self, revision: Revision) -> BoxFuture<'_, portal_store::Result<()>> {
        self.inner.compact(revision)
    }

    fn outdated(&self, key: &str) -> BoxFuture<'_, portal_store::Result<bool>> {
        let key = key.to_owned();
        Box::pin(async move {
            let Some(stored) = self.inner.get(&key).await? else {
                return Ok(false);
            };
            Ok(!self.encryption.current_form(&key, &stored.value))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(providers: &str) -> Encryption {
        Encryption::parse(&format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
        ))
        .unwrap()
    }

    const AES_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
    const BOX_KEY: &str = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY="; // 32 bytes

    #[test]
    fn secrets_are_sealed_and_open_again() {
        let plain = Bytes::from_static(br#"{"kind":"Secret","data":{"p":"czNjcmV0"}}"#);
        let key = "/registry/core/secrets/default/db";
        for providers in [
            format!("  - aescbc: {{keys: [{{name: k1, secret: {AES_KEY}}}]}}\n"),
            format!("  - secretbox: {{keys: [{{name: k1, secret: {BOX_KEY}}}]}}\n"),
        ] {
            let encryption = config(&providers);
            let sealed = encryption.seal(key, &plain).unwrap();
            assert!(sealed.starts_with(b"k8s:enc:"), "{sealed:?}");
            assert!(!sealed.windows(8).any(|w| w == b"czNjcmV0"), "no plaintext");
            assert_eq!(encryption.open(key, &sealed).unwrap(), plain);
        }
        // Other resources stay plain.
        let encryption = config(&format!(
            "  - aescbc: {{keys: [{{name: k1, secret: {AES_KEY}}}]}}\n"
        ));
        let cm = "/registry/core/configmaps/default/c";
        assert_eq!(encryption.seal(cm, &plain).unwrap(), plain);
        // Plain secrets need identity to be read.
        assert!(encryption.open(key, &plain).is_err());
    }

    #[test]
    fn keys_rotate_new_first_old_still_reads() {
        let plain = Bytes::from_static(b"{}");
        let key = "/registry/core/secrets/default/db";
        let old = config(&format!(
            "  - aescbc: {{keys: [{{name: old, secret: {AES_KEY}}}]}}\n"
        ));
        let sealed_old = old.seal(key, &plain).unwrap();
        let rotated = config(&format!(
            "  - secretbox: {{keys: [{{name: new, secret: {BOX_KEY}}}]}}\n  - aescbc: {{keys: [{{name: old, secret: {AES_KEY}}}]}}\n  - identity: {{}}\n"
        ));
        assert_eq!(rotated.open(key, &sealed_old).unwrap(), plain);
        assert!(rotated
            .seal(key, &plain)
            .unwrap()
            .starts_with(b"k8s:enc:secretbox:v1:new:"));
        assert_eq!(
            rotated.open(key, &plain).unwrap(),
            plain,
            "identity reads plain values"
        );
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Encryption::parse("kind: Nope\napiVersion: v1\nresources: []").is_err());
        let short = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: [{name: k, secret: c2hvcnQ=}]}\n";
        assert!(Encryption::parse(short)
            .unwrap_err()
            .contains("16, 24 or 32"));
        assert_eq!(
            key_prefix("deployments.apps").unwrap(),
            "/registry/apps/deployments/"
        );
        assert_eq!(key_prefix("*.apps").unwrap(), "/registry/apps/");
    }
}
