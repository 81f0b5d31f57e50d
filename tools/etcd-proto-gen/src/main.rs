//! Regenerates `crates/portal-store/src/etcd/api/*.rs`, the etcd v3 client
//! code, from the `.proto` files in `crates/portal-store/proto/`.
//!
//! The generated code is committed so that building Portal needs nothing
//! but a Rust toolchain: `protox` compiles the protos in pure Rust (no
//! `protoc`), and `tonic-prost-build` writes the messages and gRPC clients
//! from the descriptors. Run it after changing the protos:
//!
//! ```text
//! cargo run -p etcd-proto-gen            # rewrite the generated files
//! cargo run -p etcd-proto-gen -- --check # fail if they are out of date
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The etcd API files Portal talks to; their imports come along.
const PROTOS: &[&str] = &[
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/api/authpb/auth.proto",
];

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/portal-store");
    let target = store.join("src/etcd/api");
    match generate(&store.join("proto")) {
        Ok(generated) if check => compare(&generated, &target),
        Ok(generated) => write(&generated, &target),
        Err(error) => {
            eprintln!("etcd-proto-gen: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Compiles the protos into a scratch directory and returns it.
fn generate(protos: &Path) -> Result<PathBuf, String> {
    let descriptors = protox::compile(PROTOS, [protos]).map_err(|e| format!("{e:?}"))?;
    let out = std::env::temp_dir().join(format!("etcd-proto-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        // Values as `Bytes`: written and read without a copy of the object.
        .bytes(".mvccpb.KeyValue.value")
        .bytes(".etcdserverpb.PutRequest.value")
        .out_dir(&out)
        .compile_fds(descriptors)
        .map_err(|e| format!("generating: {e}"))?;
    Ok(out)
}

/// The generated files worth keeping: one per protobuf package, minus the
/// annotation-only ones (`google.api`, the OpenAPI options).
fn kept(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".rs") && !name.starts_with("google.") && !name.starts_with("grpc.")
        })
        .collect();
    files.sort();
    Ok(files)
}

fn write(generated: &Path, target: &Path) -> ExitCode {
    let result = (|| -> Result<(), String> {
        std::fs::create_dir_all(target).map_err(|e| format!("{}: {e}", target.display()))?;
        for file in kept(generated)? {
            let to = target.join(file.file_name().unwrap_or_default());
            std::fs::copy(&file, &to).map_err(|e| format!("{}: {e}", to.display()))?;
            println!("wrote {}", to.display());
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(generated);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("etcd-proto-gen: {error}");
            ExitCode::FAILURE
        }
    }
}

fn compare(generated: &Path, target: &Path) -> ExitCode {
    let mut stale = Vec::new();
    match kept(generated) {
        Ok(files) => {
            for file in files {
                let to = target.join(file.file_name().unwrap_or_default());
                if std::fs::read(&file).ok() != std::fs::read(&to).ok() {
                    stale.push(to.display().to_string());
                }
            }
        }
        Err(error) => stale.push(error),
    }
    let _ = std::fs::remove_dir_all(generated);
    if stale.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "etcd-proto-gen: out of date (run `cargo run -p etcd-proto-gen`): {}",
            stale.join(", ")
        );
        ExitCode::FAILURE
    }
}
