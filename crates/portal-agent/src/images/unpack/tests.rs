use super::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

/// A layer's tar, built entry by entry (root-owned, mtime 0 unless said).
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Tar(tar::Builder::new(Vec::new()))
    }

    fn header(kind: EntryType, mode: u32) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(0);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header
    }

    fn dir(self, name: &str) -> Self {
        self.with(Self::header(EntryType::Directory, 0o755), name, b"")
    }

    fn file(self, name: &str, text: &str) -> Self {
        self.with(
            Self::header(EntryType::Regular, 0o644),
            name,
            text.as_bytes(),
        )
    }

    fn with(mut self, mut header: tar::Header, name: &str, data: &[u8]) -> Self {
        header.set_size(data.len() as u64);
        self.0.append_data(&mut header, name, data).unwrap();
        self
    }

    fn link(mut self, kind: EntryType, name: &str, target: impl AsRef<Path>) -> Self {
        // A hard link's header carries its file's mode, as tar writes it.
        let mode = if kind == EntryType::Symlink {
            0o777
        } else {
            0o644
        };
        let mut header = Self::header(kind, mode);
        self.0.append_link(&mut header, name, target).unwrap();
        self
    }

    fn symlink(self, name: &str, target: impl AsRef<Path>) -> Self {
        self.link(EntryType::Symlink, name, target)
    }

    fn hard_link(self, name: &str, target: impl AsRef<Path>) -> Self {
        self.link(EntryType::Link, name, target)
    }

    /// A file whose name the `tar` crate would refuse to write (`..`).
    fn raw_file(mut self, name: &str, text: &str) -> Self {
        let mut header = Self::header(EntryType::Regular, 0o644);
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(text.len() as u64);
        header.set_cksum();
        self.0.append(&header, text.as_bytes()).unwrap();
        self
    }

    fn pax(mut self, records: &[(&str, &[u8])]) -> Self {
        self.0
            .append_pax_extensions(records.iter().map(|&(k, v)| (k, v)))
            .unwrap();
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    root: PathBuf,
    layers: usize,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        Fixture {
            dir,
            root,
            layers: 0,
        }
    }

    /// Writes `bytes` as the next layer blob and applies it.
    fn apply_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.layers += 1;
        let path = self.dir.path().join(format!("layer{}", self.layers));
        std::fs::write(&path, bytes).unwrap();
        apply_layer(&path, &self.root)
    }

    /// Applies `tar` gzip-compressed, as registries mostly serve layers.
    fn apply(&mut self, tar: Tar) -> io::Result<()> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &tar.bytes()).unwrap();
        self.apply_bytes(&gz.finish().unwrap())
    }

    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.at(path)).unwrap()
    }

    /// Names next to the root: the root and the layer blobs, plus `also`.
    fn assert_outside_untouched(&self, also: &[&str]) {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "root" && !n.starts_with("layer"))
            .collect();
        names.sort();
        assert_eq!(names, also, "something was made next to the root");
    }
}

#[test]
fn layers_stack_with_whiteouts() {
    let mut fx = Fixture::new();
    fx.apply(
        Tar::new()
            .dir("etc/")
            .file("etc/a", "a1")
            .file("etc/b", "b1")
            .dir("var/")
            .dir("var/cache/")
            .file("var/cache/old", "x"),
    )
    .unwrap();
    fx.apply(
        Tar::new()
            .file("etc/a", "a2")
            .file("etc/.wh.b", "")
            // The marker after a sibling of this layer: the sibling stays.
            .file("var/cache/new", "y")
            .file("var/cache/.wh..wh..opq", ""),
    )
    .unwrap();
    assert_eq!(fx.read("etc/a"), "a2");
    assert!(!fx.at("etc/b").exists());
    assert!(!fx.at("var/cache/old").exists());
    assert_eq!(fx.read("var/cache/new"), "y");
    assert!(!fx.at("etc/.wh.b").exists());
    assert!(!fx.at("var/cache/.wh..wh..opq").exists());
}

#[test]
fn an_absolute_symlink_directory_is_followed_inside_the_root() {
    let mut fx = Fixture::new();
    // Debian: `var/run -> /run`, and `var/lock -> /run/lock` whose target
    // no lower layer made.
    fx.apply(
        Tar::new()
            .dir("run/")
            .dir("var/")
            .symlink("var/run", "/run")
            .symlink("var/lock", "/run/lock"),
    )
    .unwrap();
    fx.apply(
        Tar::new()
            .dir("var/run/nginx/")
            .file("var/run/nginx/pid", "1")
            .file("var/lock/nginx.lock", "l"),
    )
    .unwrap();
    assert_eq!(fx.read("run/nginx/pid"), "1");
    assert_eq!(fx.read("run/lock/nginx.lock"), "l");
    assert!(fx.at("run/nginx").symlink_metadata().unwrap().is_dir());
    assert_eq!(
        std::fs::read_link(fx.at("var/run")).unwrap(),
        Path::new("/run")
    );
    assert_eq!(
        std::fs::read_link(fx.at("var/lock")).unwrap(),
        Path::new("/run/lock")
    );
    fx.assert_outside_untouched(&[]);
}

#[test]
fn relative_symlink_chains_resolve() {
    let mut fx = Fixture::new();
    fx.apply(
        Tar::new()
            .dir("usr/")
            .dir("usr/lib/")
            .symlink("lib", "usr/lib")
            .symlink("a", "b")
            .symlink("b", "lib/../lib/deep")
            .dir("usr/lib/deep/"),
    )
    .unwrap();
    fx.apply(Tar::new().file("a/x", "chained").file("lib/libc.so", "c"))
        .unwrap();
    assert_eq!(fx.read("usr/lib/deep/x"), "chained");
    assert_eq!(fx.read("usr/lib/libc.so"), "c");
    assert!(fx.at("a").symlink_metadata().unwrap().is_symlink());
    assert!(fx.at("lib").symlink_metadata().unwrap().is_symlink());
}

#[test]
fn a_symlink_climbing_out_stays_in_the_root() {
    let mut fx = Fixture::new();
    std::fs::create_dir(fx.dir.path().join("etc")).unwrap();
    fx.apply(
        Tar::new()
            .dir("x/")
            .symlink("x/up", "../../../../etc")
            .symlink("loop", "loop"),
    )
    .unwrap();
    fx.apply(Tar::new().file("x/up/file", "in")).unwrap();
    assert_eq!(fx.read("etc/file"), "in");
    assert!(!fx.dir.path().join("etc/file").exists());
    // A loop is an error, not a hang.
    assert!(fx.apply(Tar::new().file("loop/x", "")).is_err());
    fx.assert_outside_untouched(&["etc"]);
}

#[test]
fn a_file_replaces_a_symlink_without_writing_through_it() {
    let mut fx = Fixture::new();
    let victim = fx.dir.path().join("victim");
    std::fs::write(&victim, "host").unwrap();
    fx.apply(Tar::new().dir("etc/").symlink("etc/shadow", &victim))
        .unwrap();
    fx.apply(Tar::new().file("etc/shadow", "image")).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host");
    assert!(fx.at("etc/shadow").symlink_metadata().unwrap().is_file());
    assert_eq!(fx.read("etc/shadow"), "image");
}

#[test]
fn opaque_whiteout_and_hard_links_across_layers() {
    let mut fx = Fixture::new();
    fx.apply(
        Tar::new()
            .dir("bin/")
            .file("bin/tool", "binary")
            .dir("d/")
            .file("d/old", "lower")
            .dir("d/sub/")
            .file("d/sub/lower", "lower"),
    )
    .unwrap();
    fx.apply(
        Tar::new()
            // Written before the marker, its directory made implicitly.
            .file("d/sub/upper", "upper")
            .file("d/.wh..wh..opq", "")
            .file("d/new", "upper")
            .dir("links/")
            .hard_link("links/tool", "bin/tool")
            .hard_link("d/tool", "./bin/../bin/tool"),
    )
    .unwrap();
    assert!(!fx.at("d/old").exists());
    assert!(!fx.at("d/sub/lower").exists());
    assert_eq!(fx.read("d/sub/upper"), "upper");
    assert_eq!(fx.read("d/new"), "upper");
    let inode = |p: &str| fx.at(p).metadata().unwrap().ino();
    assert_eq!(inode("links/tool"), inode("bin/tool"));
    assert_eq!(inode("d/tool"), inode("bin/tool"));
    assert_eq!(fx.at("bin/tool").metadata().unwrap().nlink(), 3);
    // A link to what no layer made is an error.
    assert!(fx.apply(Tar::new().hard_link("x", "bin/missing")).is_err());
}

#[test]
fn a_malicious_layer_is_refused_and_nothing_outside_is_touched() {
    let mut fx = Fixture::new();
    let victim = fx.dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "host").unwrap();
    let mode = |p: &Path| p.metadata().unwrap().permissions().mode();
    let victim_mode = mode(&victim);
    // A symlink out of the root: what goes through it lands inside.
    fx.apply(
        Tar::new()
            .symlink("a", &victim)
            // A hard link to the symlink: its mode must not reach the host.
            .hard_link("b", "a")
            .symlink("rel", "../victim")
            .file("a/keep", "image")
            .file("a/.wh.keep", "")
            .file("rel/evil", "x")
            .file("rel/.wh..wh..opq", ""),
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(victim.join("keep")).unwrap(),
        "host"
    );
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
    assert_eq!(mode(&victim), victim_mode);
    assert!(fx.at("b").symlink_metadata().unwrap().is_symlink());
    let inside = fx.root.join(victim.strip_prefix("/").unwrap());
    assert!(!inside.join("keep").exists(), "the whiteout applies inside");
    assert_eq!(fx.read("victim/evil"), "x");
    // An absolute hard link, one that climbs, and a `../` name.
    let host_file = victim.join("keep");
    for evil in [
        Tar::new().hard_link("stolen", &host_file),
        Tar::new().hard_link("stolen", "../victim/keep"),
        Tar::new().raw_file("../escape", "x"),
        Tar::new().raw_file("a/../../escape", "x"),
    ] {
        let error = fx.apply(evil).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    }
    assert!(!fx.at("stolen").exists());
    assert_eq!(host_file.metadata().unwrap().nlink(), 1);
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "host");
    fx.assert_outside_untouched(&["victim"]);
}

#[test]
fn kinds_and_metadata() {
    let mut fx = Fixture::new();
    let mut setuid = Tar::header(EntryType::Regular, 0o4755);
    setuid.set_uid(1000);
    setuid.set_gid(1001);
    setuid.set_mtime(1_700_000_000);
    let mut private = Tar::header(EntryType::Directory, 0o700);
    private.set_mtime(1_600_000_000);
    let mut device = Tar::header(EntryType::Char, 0o666);
    device.set_device_major(1).unwrap();
    device.set_device_minor(3).unwrap();
    fx.apply(
        Tar::new()
            .dir("replaced/")
            .file("replaced/x", "")
            .file("becomes-dir", "")
            .with(private, "private/", b"")
            .file("private/inside", "")
            .with(setuid, "private/su", b"#!")
            .with(Tar::header(EntryType::Fifo, 0o600), "fifo", b"")
            .with(device, "null", b"")
            .pax(&[("mtime", &b"1234.5"[..])])
            .file("precise", ""),
    )
    .unwrap();
    fx.apply(Tar::new().file("replaced", "file").dir("becomes-dir/"))
        .unwrap();
    let su = fx.at("private/su").metadata().unwrap();
    assert_eq!(su.permissions().mode() & 0o7777, 0o4755);
    assert_eq!(
        (su.uid(), su.gid(), su.mtime()),
        (1000, 1001, 1_700_000_000)
    );
    let dir = fx.at("private").metadata().unwrap();
    assert_eq!(dir.permissions().mode() & 0o7777, 0o700);
    assert_eq!(dir.mtime(), 1_600_000_000, "set after the entries inside");
    assert!(fx.at("fifo").metadata().unwrap().file_type().is_fifo());
    assert!(!fx.at("null").exists(), "device nodes are skipped");
    let precise = fx.at("precise").metadata().unwrap();
    assert_eq!((precise.mtime(), precise.mtime_nsec()), (1234, 500_000_000));
    assert_eq!(fx.read("replaced"), "file");
    assert!(fx.at("becomes-dir").symlink_metadata().unwrap().is_dir());
}

#[test]
fn extended_attributes_are_applied() {
    // tmpfs takes `user.*` only on recent kernels; the test says so and
    // checks nothing where the temporary directory takes none.
    let mut fx = Fixture::new();
    let probe = fx.dir.path().join("probe");
    std::fs::write(&probe, "").unwrap();
    let user = rustix::fs::lsetxattr(&probe, "user.probe", b"1", rustix::fs::XattrFlags::empty());
    let capability = rustix::fs::lsetxattr(
        &probe,
        "security.capability",
        &PING,
        rustix::fs::XattrFlags::empty(),
    );
    std::fs::remove_file(&probe).unwrap();
    let mut owned = Tar::header(EntryType::Regular, 0o755);
    // Not root: the chown would clear the capability were it set first.
    owned.set_uid(1000);
    let mut tar = Tar::new()
        .dir("bin/")
        .pax(&[("SCHILY.xattr.trusted.overlay.opaque", &b"y"[..])])
        .file("bin/plain", "");
    if user.is_ok() {
        tar = tar
            .pax(&[("SCHILY.xattr.user.portal", &b"yes"[..])])
            .file("bin/tagged", "")
            // `user.*` cannot go on a symlink: skipped, as containerd does.
            .pax(&[("SCHILY.xattr.user.portal", &b"yes"[..])])
            .symlink("bin/link", "tagged");
    } else {
        eprintln!("user.* extended attributes unsupported here ({user:?}): not checked");
    }
    if capability.is_ok() {
        tar = tar
            .pax(&[("SCHILY.xattr.security.capability", &PING[..])])
            .with(owned, "bin/ping", b"\x7fELF");
    } else {
        eprintln!("security.capability cannot be set here ({capability:?}): not checked");
    }
    fx.apply(tar).unwrap();
    let get = |path: &str, name: &str| {
        let mut value = [0; 64];
        rustix::fs::lgetxattr(fx.at(path), name, &mut value[..])
            .map(|n| value[..n].to_vec())
            .ok()
    };
    assert_eq!(get("bin/plain", "trusted.overlay.opaque"), None);
    if user.is_ok() {
        assert_eq!(
            get("bin/tagged", "user.portal").as_deref(),
            Some(&b"yes"[..])
        );
    }
    if capability.is_ok() {
        assert_eq!(
            get("bin/ping", "security.capability").as_deref(),
            Some(&PING[..])
        );
        assert_eq!(fx.at("bin/ping").metadata().unwrap().uid(), 1000);
    }
}

/// `cap_net_raw+ep` (Debian's ping) as `security.capability` (v2).
const PING: [u8; 20] = [
    1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// A file spanning many compressed blocks.
fn big() -> String {
    (0..20_000).map(|i| format!("line {i}\n")).collect()
}

fn sample() -> Tar {
    Tar::new()
        .dir("etc/")
        .file("etc/os-release", "debian")
        .file("etc/big", &big())
}

#[test]
fn zstd_layers_of_one_or_many_frames() {
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};
    let tar = sample().bytes();
    let mut fx = Fixture::new();
    fx.apply_bytes(&compress_to_vec(&tar[..], CompressionLevel::Fastest))
        .unwrap();
    assert_eq!(fx.read("etc/os-release"), "debian");
    // Two frames with a skippable frame between them (zstd:chunked).
    let (first, second) = tar.split_at(tar.len() / 2);
    let mut chunked = compress_to_vec(first, CompressionLevel::Fastest);
    chunked.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]);
    chunked.extend(compress_to_vec(second, CompressionLevel::Uncompressed));
    let mut fx = Fixture::new();
    fx.apply_bytes(&chunked).unwrap();
    assert_eq!(fx.read("etc/big"), big());
}

#[test]
fn zstd_from_the_reference_encoder() {
    // What registries serve is made by libzstd: its frames (with
    // checksums) are checked when the `zstd` tool is here.
    let tar = sample().bytes();
    let child = std::process::Command::new("zstd")
        .args(["-q", "-c", "-19"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("no zstd tool: not checked");
        return;
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || io::Write::write_all(&mut stdin, &tar));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success());
    let mut fx = Fixture::new();
    fx.apply_bytes(&output.stdout).unwrap();
    assert_eq!(fx.read("etc/os-release"), "debian");
    let mut corrupt = output.stdout.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let mut fx = Fixture::new();
    assert!(fx.apply_bytes(&corrupt).is_err(), "checksum not checked");
}

#[test]
fn plain_and_multi_member_gzip_layers() {
    let tar = sample().bytes();
    let mut fx = Fixture::new();
    fx.apply_bytes(&tar).unwrap();
    assert_eq!(fx.read("etc/os-release"), "debian");
    let (first, second) = tar.split_at(700);
    let mut members = Vec::new();
    for part in [first, second] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, part).unwrap();
        members.extend(gz.finish().unwrap());
    }
    let mut fx = Fixture::new();
    fx.apply_bytes(&members).unwrap();
    assert_eq!(fx.read("etc/os-release"), "debian");
    assert_eq!(fx.read("etc/big"), big());
}
