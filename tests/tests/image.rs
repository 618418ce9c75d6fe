//! The container image, tested without running a container (these machines cannot): build it
//! with scripts/image (static binary on the host, then podman), `podman create` + `podman
//! export` its filesystem, check what is in it, and run the exported binary chrooted into
//! the exported tree as the image's user, so it has exactly what a `FROM scratch` container
//! has: no shared libraries, no NSS modules, no /etc/resolv.conf. It serves a round trip to
//! a real memcached found by DNS through a real DNS server (dnsmasq).
//!
//! ```text
//!   scripts/image --profile dev -> podman create -> podman export | tar -x -> ROOT/
//!   chroot --userspec=65532:65532 ROOT /usr/local/bin/memroute --config /etc/memroute/test.toml
//!       (the image's default config, with loopback ports and [discovery] nameservers)
//!   test client -> memroute -> dnsmasq says memcached = 127.0.0.1 -> memcached
//! ```
//!
//! The image's binary is the `dev` profile's (scripts/image --profile dev): the crates the test
//! build compiled, linked statically (crt-static on the final crate), so the test compiles
//! one crate, not every crate again. It is the same source as the release image's binary,
//! without optimisation: the test makes one round trip through it. Releases use
//! `scripts/image` (profile `release`).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use memroute_tests::*;

#[path = "common/dnsmasq.rs"]
mod dnsmasq;
use dnsmasq::Dnsmasq;

const TAG: &str = "localhost/memroute:image-test";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// podman is needed. When scripts/test could not install it, it says why in
/// MEMROUTE_IMAGE_TEST_SKIP and the test prints that and stops; anywhere else a missing
/// podman is a failure, not a silent pass.
fn podman_or_skip() -> bool {
    if installed("podman") {
        return true;
    }
    match std::env::var("MEMROUTE_IMAGE_TEST_SKIP") {
        Ok(reason) => {
            skipped(
                "image",
                &format!("the container image test needs podman: {reason}"),
            );
            false
        }
        Err(_) => panic!(
            "podman is not installed: run scripts/test (it installs podman and buildah) or `apt-get install -y podman buildah`"
        ),
    }
}

/// Runs a command to completion; panics with its output unless it succeeds.
fn run(command: &mut Command) -> String {
    let shown = format!("{command:?}");
    let output = command.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{shown} failed ({})\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A created (never started) container, removed on drop.
struct Created(String);

impl Drop for Created {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Every regular file under `root`, as absolute paths inside the image.
fn files_in(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read exported dir") {
            let entry = entry.expect("dir entry");
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                let inside = entry.path();
                let inside = inside.strip_prefix(root).expect("under root");
                out.push(format!("/{}", inside.display()));
            }
        }
    }
    out.sort();
    out
}

/// True when the ELF file has a PT_INTERP program header (it needs a dynamic loader).
fn needs_a_loader(elf: &[u8]) -> bool {
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "not a 64-bit ELF");
    let table = u64::from_le_bytes(elf[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (entry_size, entries) = (u16_at(0x36), u16_at(0x38));
    (0..entries).any(|i| {
        let at = table + i * entry_size;
        u32::from_le_bytes(elf[at..at + 4].try_into().expect("4 bytes")) == 3 // PT_INTERP
    })
}

#[test]
fn the_image_is_static_non_root_and_its_exported_binary_serves_from_a_scratch_root() {
    if !podman_or_skip() {
        return;
    }
    run(Command::new(repository().join("scripts/image"))
        .args(["--profile", "dev", "--tag", TAG])
        .current_dir(repository()));

    // What the image says about itself.
    let config = run(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Cmd}}",
        TAG,
    ]));
    assert_eq!(
        config.trim(),
        "65532:65532|[\"/usr/local/bin/memroute\"]|[\"--config\",\"/etc/memroute/memroute.toml\"]"
    );

    // Its filesystem, exported from a container that is created but never run.
    let created = Created(
        run(Command::new("podman").args(["create", TAG]))
            .trim()
            .to_string(),
    );
    let root_dir = TempDir::new("image-root");
    let root = root_dir.path().join("root");
    std::fs::create_dir(&root).expect("root dir");
    let tar = root_dir.path().join("image.tar");
    run(Command::new("podman")
        .args(["export", "-o"])
        .arg(&tar)
        .arg(&created.0));
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&root));
    drop(created);
    assert_eq!(
        files_in(&root),
        [
            "/etc/group",
            "/etc/memroute/memroute.toml",
            "/etc/passwd",
            "/etc/ssl/certs/ca-certificates.crt",
            "/usr/local/bin/memroute",
        ],
        "a scratch image holds the binary, its config, its user and the CA bundle, nothing else"
    );
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("memroute:x:65532:65532:")),
        "{passwd}"
    );
    let ca = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).expect("CA");
    assert!(ca.matches("BEGIN CERTIFICATE").count() > 10, "CA bundle");
    let binary = root.join("usr/local/bin/memroute");
    let elf = std::fs::read(&binary).expect("binary");
    assert!(!needs_a_loader(&elf), "the binary needs a dynamic loader");
    println!(
        "image: binary {:.1} MB (dev profile), statically linked",
        elf.len() as f64 / 1e6
    );

    // The default config as shipped is valid.
    let check = run(Command::new(&binary)
        .arg("--check")
        .arg("--config")
        .arg(root.join("etc/memroute/memroute.toml")));
    assert!(
        check.contains("servers from DNS memcached:11211"),
        "{check}"
    );

    // A round trip, from the scratch root: the default config with loopback ports, and a
    // DNS server that says where `memcached` is.
    let memcached = Memcached::start();
    let dns = Dnsmasq::start(&["127.0.0.1 memcached".to_string()], &[], 5);
    let listen = format!("127.0.0.1:{}", free_port());
    let default =
        std::fs::read_to_string(root.join("etc/memroute/memroute.toml")).expect("default");
    let toml = format!(
        "{}\n[discovery]\nnameservers = [\"127.0.0.1:{}\"]\n",
        default
            .replace("0.0.0.0:11211", &listen)
            .replace("0.0.0.0:9150", &format!("127.0.0.1:{}", free_port()))
            .replace("memcached:11211", &format!("memcached:{}", memcached.port)),
        dns.port
    );
    let config = root.join("etc/memroute/test.toml");
    std::fs::write(&config, &toml).expect("test config");
    let as_root = run(Command::new("id").arg("-u")).trim() == "0";
    let command = if as_root {
        let mut command = Command::new("chroot");
        command.arg("--userspec=65532:65532").arg(&root).args([
            "/usr/local/bin/memroute",
            "--config",
            "/etc/memroute/test.toml",
        ]);
        command
    } else {
        // chroot needs root: the binary still runs, but with the host's files around it.
        println!("image: not root, so the exported binary runs without chroot");
        let mut command = Command::new(&binary);
        command.arg("--config").arg(&config);
        command
    };
    let proxy = Memroute::start_command(command, &toml, config, root_dir);
    proxy.wait_stats("pool:main:servers == 1", Duration::from_secs(15), |s| {
        stat_u64(s, "pool:main:servers") == Some(1)
    });
    let mut c = proxy.connect();
    c.set("image-key", b"from the scratch root");
    assert_eq!(
        c.get("image-key").as_deref(),
        Some(&b"from the scratch root"[..])
    );
    assert_eq!(
        memcached.connect().get("image-key").as_deref(),
        Some(&b"from the scratch root"[..]),
        "the value did not reach memcached"
    );
    assert!(
        dns.log().contains("query[A] memcached"),
        "memroute did not ask the DNS server\n{}",
        dns.log()
    );
}
