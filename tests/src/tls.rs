//! TLS for the end-to-end tests: certificates made with the `openssl` command for each
//! test (a CA, server and client certificates, and a second CA nobody trusts), and a
//! blocking rustls client that reports whether its handshake was resumed.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, RootCertStore, StreamOwned};

use crate::{TempDir, IO_TIMEOUT};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Test PKI: `ca` signs `server` (localhost, 127.0.0.1) and `client`; `rogue_ca` signs
/// `rogue_server` and `rogue_client`, which nothing trusts.
#[derive(Debug)]
pub struct Pki {
    pub ca: PathBuf,
    pub server: CertFiles,
    pub client: CertFiles,
    pub rogue_ca: PathBuf,
    pub rogue_server: CertFiles,
    pub rogue_client: CertFiles,
    /// The server certificate with the client's key: a mismatched pair.
    pub mismatched: CertFiles,
    dir: TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (scripts/test installs it)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
    args.extend(EC);
    let (key, cert, subject) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={name}"),
    );
    args.extend(["-keyout", &key, "-out", &cert, "-subj", &subject]);
    openssl(dir, &args);
    dir.join(cert)
}

fn make_leaf(dir: &Path, ca: &str, name: &str) -> CertFiles {
    let (key, csr, cert, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("write ext file");
    let mut args = vec!["req", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
    openssl(dir, &args);
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &cert,
            "-extfile",
            &ext,
        ],
    );
    CertFiles {
        cert: dir.join(cert),
        key: dir.join(key),
    }
}

impl Pki {
    pub fn generate() -> Pki {
        let dir = TempDir::new("pki");
        let path = dir.path().to_path_buf();
        let ca = make_ca(&path, "ca");
        let server = make_leaf(&path, "ca", "server");
        let client = make_leaf(&path, "ca", "client");
        let rogue_ca = make_ca(&path, "rogue");
        let rogue_server = make_leaf(&path, "rogue", "rogue-server");
        let rogue_client = make_leaf(&path, "rogue", "rogue-client");
        let mismatched = CertFiles {
            cert: server.cert.clone(),
            key: client.key.clone(),
        };
        Pki {
            ca,
            server,
            client,
            rogue_ca,
            rogue_server,
            rogue_client,
            mismatched,
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client certificate signed by `ca` that expired in 2020 (valid 2020-01-01 to
    /// 2020-01-02). `openssl x509 -req` of this Debian openssl (3.0) has no way to set
    /// past dates, so it is signed with `openssl ca -startdate/-enddate`.
    pub fn expired_client(&self) -> CertFiles {
        let dir = self.dir.path();
        std::fs::write(
            dir.join("expired-ca.cnf"),
            "[ca]\ndefault_ca = d\n[d]\ndatabase = expired-index.txt\nnew_certs_dir = .\n\
             serial = expired-serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n\
             [p]\ncommonName = supplied\n",
        )
        .expect("write ca config");
        std::fs::write(dir.join("expired-index.txt"), "").expect("write index");
        std::fs::write(dir.join("expired-serial"), "1000\n").expect("write serial");
        std::fs::write(
            dir.join("expired.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
        )
        .expect("write ext file");
        let mut args = vec!["req", "-nodes"];
        args.extend(EC);
        args.extend([
            "-keyout",
            "expired.key",
            "-out",
            "expired.csr",
            "-subj",
            "/CN=expired",
        ]);
        openssl(dir, &args);
        openssl(
            dir,
            &[
                "ca",
                "-batch",
                "-config",
                "expired-ca.cnf",
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
                "-in",
                "expired.csr",
                "-out",
                "expired.pem",
                "-keyfile",
                "ca.key",
                "-cert",
                "ca.pem",
                "-notext",
                "-extfile",
                "expired.ext",
            ],
        );
        CertFiles {
            cert: dir.join("expired.pem"),
            key: dir.join("expired.key"),
        }
    }

    /// `memcached -Z` arguments serving `cert`.
    pub fn memcached_args(cert: &CertFiles) -> Vec<String> {
        vec![
            "-Z".to_string(),
            "-o".to_string(),
            format!(
                "ssl_chain_cert={},ssl_key={}",
                cert.cert.display(),
                cert.key.display()
            ),
        ]
    }
}

/// A rustls client config trusting `ca`, presenting `client` when given. Its session
/// store (rustls's default in-memory one) makes later connections resume.
pub fn client_config(ca: &Path, client: Option<&CertFiles>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read CA") {
        roots.add(cert.expect("CA PEM")).expect("add CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let config = match client {
        Some(c) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&c.cert)
                    .expect("read client cert")
                    .map(|c| c.expect("client cert PEM"))
                    .collect(),
                PrivateKeyDer::from_pem_file(&c.key).expect("read client key"),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// A blocking TLS connection to memroute (reads time out after [`IO_TIMEOUT`]).
#[derive(Debug)]
pub struct TlsConn {
    stream: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl TlsConn {
    /// Connects and completes the handshake, or says why it failed.
    pub fn connect(addr: &str, config: &Arc<ClientConfig>) -> Result<TlsConn, String> {
        let sock = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        sock.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        sock.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
        let name = ServerName::try_from("localhost").expect("name");
        let conn = ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
        let mut stream = StreamOwned::new(conn, sock);
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .map_err(|e| e.to_string())?;
        }
        Ok(TlsConn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Full or resumed.
    pub fn handshake_kind(&self) -> Option<HandshakeKind> {
        self.stream.conn.handshake_kind()
    }

    /// Sends `request` and reads until the buffered reply ends with `terminator`; the
    /// error says what was read (or why nothing was).
    pub fn roundtrip(&mut self, request: &[u8], terminator: &[u8]) -> Result<Vec<u8>, String> {
        self.stream
            .write_all(request)
            .and_then(|()| self.stream.flush())
            .map_err(|e| format!("write: {e}"))?;
        let mut chunk = [0u8; 64 * 1024];
        while !self.buf.ends_with(terminator) {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(format!("EOF after {:?}", crate::show(&self.buf))),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e} after {:?}", crate::show(&self.buf))),
            }
        }
        Ok(std::mem::take(&mut self.buf))
    }
}
