//! The behaviour every [`Store`] backend must show, written once. A backend's
//! tests call [`run_all`] with a function that opens it on a directory
//! (backends that keep no files ignore the directory); it is called twice,
//! the second time to check that what was acknowledged is still there.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use crate::{Error, EventKind, Op, Store, WatchStream};

const WAIT: Duration = Duration::from_secs(10);

/// Runs every check against the backend `open` makes.
pub async fn run_all<S: Store, F: Future<Output = S>>(open: impl Fn(&Path) -> F) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    crud(&store).await;
    preconditions(&store).await;
    transactions_are_atomic(&store).await;
    revisions_count_transactions(&store).await;
    list_by_prefix(&store).await;
    watch_live_in_order(&store).await;
    watch_replays_history(&store).await;
    watch_after_compaction_is_refused(&store).await;
    concurrent_writers_get_distinct_revisions(&store).await;
    // Everything acknowledged survives a reopen, and so does history.
    let (before, revision) = store.list("/conformance/").await.unwrap();
    drop(store);
    let store = open(dir.path()).await;
    let (after, reopened) = store.list("/conformance/").await.unwrap();
    assert_eq!(before, after);
    assert_eq!(revision, reopened);
    assert_eq!(store.current_revision().await.unwrap(), revision);
    let compacted_at = store.current_revision().await.unwrap() - 1;
    let mut stream = store.watch("/conformance/", compacted_at).await.unwrap();
    assert_eq!(next(&mut stream).await[0].revision(), revision);
}

fn bytes(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

fn create(key: &str, value: &str) -> Op {
    Op::Create {
        key: key.into(),
        value: bytes(value),
    }
}

async fn next(stream: &mut WatchStream) -> Vec<crate::Event> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("watch event in time")
        .unwrap()
        .unwrap()
}

async fn crud(store: &impl Store) {
    let rev = store
        .txn(vec![create("/conformance/crud/a", "one")])
        .await
        .unwrap();
    let got = store.get("/conformance/crud/a").await.unwrap().unwrap();
    assert_eq!(got.value, bytes("one"));
    assert_eq!((got.create_revision, got.mod_revision), (rev, rev));

    let update = Op::Update {
        key: "/conformance/crud/a".into(),
        value: bytes("two"),
        expected_revision: rev,
    };
    let rev2 = store.txn(vec![update]).await.unwrap();
    assert!(rev2 > rev);
    let got = store.get("/conformance/crud/a").await.unwrap().unwrap();
    assert_eq!(
        (got.value, got.create_revision, got.mod_revision),
        (bytes("two"), rev, rev2)
    );

    let delete = Op::Delete {
        key: "/conformance/crud/a".into(),
        expected_revision: Some(rev2),
    };
    store.txn(vec![delete]).await.unwrap();
    assert!(store.get("/conformance/crud/a").await.unwrap().is_none());
}

async fn preconditions(store: &impl Store) {
    let rev = store
        .txn(vec![create("/conformance/pre/a", "v")])
        .await
        .unwrap();
    let again = store.txn(vec![create("/conformance/pre/a", "w")]).await;
    assert!(
        matches!(again, Err(Error::AlreadyExists { .. })),
        "{again:?}"
    );

    let stale = Op::Update {
        key: "/conformance/pre/a".into(),
        value: bytes("w"),
        expected_revision: rev - 1,
    };
    let result = store.txn(vec![stale]).await;
    assert!(
        matches!(result, Err(Error::Conflict { found, .. }) if found == rev),
        "{result:?}"
    );

    let missing = Op::Update {
        key: "/conformance/pre/none".into(),
        value: bytes("w"),
        expected_revision: 1,
    };
    assert!(matches!(
        store.txn(vec![missing]).await,
        Err(Error::NotFound { .. })
    ));
    let missing = Op::Delete {
        key: "/conformance/pre/none".into(),
        expected_revision: None,
    };
    assert!(matches!(
        store.txn(vec![missing]).await,
        Err(Error::NotFound { .. })
    ));
    let stale = Op::Delete {
        key: "/conformance/pre/a".into(),
        expected_revision: Some(rev + 100),
    };
    assert!(matches!(
        store.txn(vec![stale]).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(
        store
            .get("/conformance/pre/a")
            .await
            .unwrap()
            .unwrap()
            .value,
        bytes("v")
    );
}

async fn transactions_are_atomic(store: &impl Store) {
    store
        .txn(vec![create("/conformance/atomic/a", "v")])
        .await
        .unwrap();
    let before = store.current_revision().await.unwrap();
    let result = store
        .txn(vec![
            create("/conformance/atomic/b", "v"),
            create("/conformance/atomic/a", "v"),
        ])
        .await;
    assert!(matches!(result, Err(Error::AlreadyExists { .. })));
    assert!(store.get("/conformance/atomic/b").await.unwrap().is_none());
    assert_eq!(
        store.current_revision().await.unwrap(),
        before,
        "a failed transaction takes no revision"
    );

    let dup = store
        .txn(vec![
            create("/conformance/atomic/c", "v"),
            create("/conformance/atomic/c", "w"),
        ])
        .await;
    assert!(matches!(dup, Err(Error::DuplicateKey { .. })));
}

async fn revisions_count_transactions(store: &impl Store) {
    let before = store.current_revision().await.unwrap();
    let rev = store
        .txn(vec![
            create("/conformance/rev/a", "1"),
            create("/conformance/rev/b", "2"),
        ])
        .await
        .unwrap();
    assert_eq!(rev, before + 1, "one transaction, one revision");
    let a = store.get("/conformance/rev/a").await.unwrap().unwrap();
    let b = store.get("/conformance/rev/b").await.unwrap().unwrap();
    assert_eq!((a.mod_revision, b.mod_revision), (rev, rev));
    assert_eq!(store.current_revision().await.unwrap(), rev);
}

async fn list_by_prefix(store: &impl Store) {
    for key in [
        "/conformance/list/x/2",
        "/conformance/list/x/1",
        "/conformance/list/xy/1",
    ] {
        store.txn(vec![create(key, "v")]).await.unwrap();
    }
    let (items, revision) = store.list("/conformance/list/x/").await.unwrap();
    let keys: Vec<_> = items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(
        keys,
        ["/conformance/list/x/1", "/conformance/list/x/2"],
        "sorted, prefix-exact"
    );
    assert_eq!(revision, store.current_revision().await.unwrap());
}

async fn watch_live_in_order(store: &impl Store) {
    let start = store.current_revision().await.unwrap();
    let mut stream = store.watch("/conformance/live/", start).await.unwrap();
    let r1 = store
        .txn(vec![create("/conformance/live/a", "1")])
        .await
        .unwrap();
    store
        .txn(vec![create("/conformance/other", "ignored")])
        .await
        .unwrap();
    let update = Op::Update {
        key: "/conformance/live/a".into(),
        value: bytes("2"),
        expected_revision: r1,
    };
    let r2 = store.txn(vec![update]).await.unwrap();
    let r3 = store
        .txn(vec![Op::Delete {
            key: "/conformance/live/a".into(),
            expected_revision: None,
        }])
        .await
        .unwrap();

    let e1 = next(&mut stream).await;
    assert_eq!(
        (e1[0].kind, e1[0].revision(), e1[0].prev.is_none()),
        (EventKind::Put, r1, true)
    );
    let e2 = next(&mut stream).await;
    assert_eq!((e2[0].kind, e2[0].revision()), (EventKind::Put, r2));
    assert_eq!(e2[0].prev.as_ref().unwrap().value, bytes("1"));
    let e3 = next(&mut stream).await;
    assert_eq!((e3[0].kind, e3[0].revision()), (EventKind::Delete, r3));
    assert_eq!(
        e3[0].prev.as_ref().unwrap().value,
        bytes("2"),
        "a delete carries the deleted value"
    );
}

async fn watch_replays_history(store: &impl Store) {
    let start = store.current_revision().await.unwrap();
    let mut revisions = Vec::new();
    for i in 0..5 {
        revisions.push(
            store
                .txn(vec![create(&format!("/conformance/replay/{i}"), "v")])
                .await
                .unwrap(),
        );
    }
    // Start in the middle of history: exactly the later events, then live.
    let mut stream = store
        .watch("/conformance/replay/", revisions[1])
        .await
        .unwrap();
    for expected in &revisions[2..] {
        assert_eq!(next(&mut stream).await[0].revision(), *expected);
    }
    let live = store
        .txn(vec![create("/conformance/replay/live", "v")])
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await[0].revision(), live);
    // From the very start too.
    let mut stream = store.watch("/conformance/replay/", start).await.unwrap();
    assert_eq!(next(&mut stream).await[0].revision(), revisions[0]);
}

async fn watch_after_compaction_is_refused(store: &impl Store) {
    let old = store
        .txn(vec![create("/conformance/compact/a", "v")])
        .await
        .unwrap();
    let newer = store
        .txn(vec![create("/conformance/compact/b", "v")])
        .await
        .unwrap();
    store.compact(newer - 1).await.unwrap();
    let result = store.watch("/conformance/compact/", old - 1).await;
    assert!(
        matches!(result, Err(Error::Compacted { .. })),
        "watch before compaction must fail"
    );
    let mut stream = store
        .watch("/conformance/compact/", newer - 1)
        .await
        .unwrap();
    assert_eq!(next(&mut stream).await[0].revision(), newer);
    // Compaction drops history, never current values.
    assert!(store.get("/conformance/compact/a").await.unwrap().is_some());
}

async fn concurrent_writers_get_distinct_revisions(store: &impl Store) {
    let writers = 32;
    let per_writer = 10;
    let results = futures_util::future::join_all((0..writers).map(|w| async move {
        let mut revisions = Vec::new();
        for i in 0..per_writer {
            let key = format!("/conformance/concurrent/{w}-{i}");
            revisions.push(store.txn(vec![create(&key, "v")]).await.unwrap());
        }
        revisions
    }))
    .await;
    let mut all: Vec<_> = results.into_iter().flatten().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        writers * per_writer,
        "every transaction has its own revision"
    );
    let (items, _) = store.list("/conformance/concurrent/").await.unwrap();
    assert_eq!(items.len(), writers * per_writer);
}
