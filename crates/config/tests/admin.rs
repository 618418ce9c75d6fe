//! `[admin]`: who may change state through the admin port.
use memroute_config::{parse, AdminToken, ErrorKind};

const POOL: &str =
    "[proxy]\nlisten = [\"127.0.0.1:11211\"]\n\n[pools.main]\nservers = [\"127.0.0.1:11311\"]\n";

fn admin(lines: &str) -> Result<Option<AdminToken>, Vec<String>> {
    parse(&format!(
        "{POOL}\n[admin]\nlisten = \"127.0.0.1:9150\"\n{lines}"
    ))
    .map(|c| c.admin.and_then(|a| a.token))
    .map_err(|e| e.0.iter().map(|e| e.to_string()).collect())
}

#[test]
fn a_token_is_inline_or_in_a_file_or_absent() {
    assert_eq!(admin(""), Ok(None));
    assert_eq!(
        admin("token = \"t0k\""),
        Ok(Some(AdminToken::Inline("t0k".into())))
    );
    assert_eq!(
        admin("token_file = \"/run/secrets/admin\""),
        Ok(Some(AdminToken::File("/run/secrets/admin".into())))
    );
}

#[test]
fn a_token_that_cannot_work_is_an_error_at_its_key() {
    for (lines, path, kind) in [
        ("token = \"\"", "admin.token", ErrorKind::Invalid),
        ("token_file = \"\"", "admin.token_file", ErrorKind::Invalid),
        (
            "token = \"a\"\ntoken_file = \"/f\"",
            "admin.token_file",
            ErrorKind::Conflict,
        ),
        ("token = 7", "admin.token", ErrorKind::WrongType),
    ] {
        let errors = parse(&format!(
            "{POOL}\n[admin]\nlisten = \"127.0.0.1:9150\"\n{lines}"
        ))
        .expect_err(lines);
        assert_eq!(errors.kinds(), [(path, kind)], "{lines}: {errors}");
    }
}

#[test]
fn relative_file_paths_are_the_config_files_neighbours() {
    let mut config = parse(
        "[proxy]\nlisten = [{ address = \"127.0.0.1:11211\", tls = { cert = \"server.pem\", key = \"/abs/server.key\" } }]\n\n\
         [pools.main]\nservers = [\"127.0.0.1:11311\"]\ntls = { ca = \"certs/ca.pem\" }\n\n\
         [discovery]\nhosts_file = \"hosts\"\n\n\
         [admin]\nlisten = \"127.0.0.1:9150\"\ntoken_file = \"token\"\n",
    )
    .expect("valid");
    config.resolve_paths(std::path::Path::new("/etc/memroute"));
    let tls = config
        .proxy
        .transport
        .listen_tls
        .values()
        .next()
        .expect("tls");
    assert_eq!(tls.cert, std::path::Path::new("/etc/memroute/server.pem"));
    assert_eq!(tls.key, std::path::Path::new("/abs/server.key"));
    let pool_tls = config.pools["main"].tls.as_ref().expect("pool tls");
    assert_eq!(
        pool_tls.ca.as_deref(),
        Some(std::path::Path::new("/etc/memroute/certs/ca.pem"))
    );
    assert_eq!(
        config.discovery.hosts_file.as_deref(),
        Some(std::path::Path::new("/etc/memroute/hosts"))
    );
    assert_eq!(
        config.admin.and_then(|a| a.token),
        Some(AdminToken::File("/etc/memroute/token".into()))
    );
}
