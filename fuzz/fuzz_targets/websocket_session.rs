//! A WebSocket exec session fed arbitrary client bytes (frames, channel
//! bytes, resize JSON, close signals): the session never panics, and what
//! reaches stdin and the resize channel is bounded by what was sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portal_streams::websocket::{self, Protocol};
use portal_streams::{Version, Wanted};
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    runtime.block_on(async {
        let (server, mut client) = tokio::io::duplex(1 << 16);
        let protocol = Protocol { version: Version::V5, base64: data.first() == Some(&b'b') };
        let wanted = Wanted { stdin: true, stdout: true, stderr: false, tty: true };
        let mut streams = websocket::exec(server, protocol, wanted);
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut received = 0;
        if let Some(stdin) = streams.stdin.as_mut() {
            while let Ok(Some(chunk)) =
                tokio::time::timeout(std::time::Duration::from_millis(50), stdin.recv()).await
            {
                received += chunk.len();
            }
        }
        assert!(received <= data.len());
        streams.finish(portal_streams::Outcome::Exited(0)).await;
    });
});
