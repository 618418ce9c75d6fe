//! The secrets memroute reads from files, at start and at every reload: the password each
//! pool logs in to its servers with, and the authfile each listener's clients log in
//! against. A file that cannot be read or used fails the start or the reload (the running
//! config stays), naming the setting. The controller reads them into each generation (the
//! backend connectors' logins, the listeners' authfiles); the data plane only checks a
//! client's login against the authfile it is handed (memroute-proxy's `client_auth`).
use std::sync::Arc;

use memroute_config::{BackendAuth, Config, Password};
use memroute_net::BackendLogin;
use memroute_protocol::auth::Authfile;

use memroute_proxy::generation::Generation;
use memroute_proxy::ProxyError;

/// The user and password of a pool's `auth`, its password file read now (at start and at
/// every reload, so a rotated Secret applies on the next reload). A trailing newline in the
/// file is not part of the password (`echo secret > file` writes one).
pub(crate) fn backend_login(auth: &BackendAuth) -> Result<BackendLogin, ProxyError> {
    let (password, setting) = match &auth.password {
        Password::Inline(password) => (password.clone(), format!("{}.password", auth.key_path)),
        Password::File(path) => {
            let setting = format!("{}.password_file", auth.key_path);
            let text = std::fs::read_to_string(path).map_err(|error| ProxyError::Auth {
                setting: setting.clone(),
                reason: format!("cannot read {}: {error}", path.display()),
            })?;
            (text.trim_end_matches(['\r', '\n']).to_string(), setting)
        }
    };
    if let Some(problem) = memroute_config::login_word_problem(&password) {
        return Err(ProxyError::Auth {
            setting,
            reason: format!("the password {problem}"),
        });
    }
    Ok(BackendLogin {
        username: auth.username.clone(),
        password,
    })
}

/// The authfile of each listener that requires a login, by its place in `proxy.listen`
/// (`None`: its clients need none).
pub(crate) fn listener_authfiles(
    config: &Config,
) -> Result<Vec<Option<Arc<Authfile>>>, ProxyError> {
    config
        .proxy
        .listen
        .iter()
        .map(|address| {
            let Some(auth) = config.proxy.listen_auth.get(address) else {
                return Ok(None);
            };
            let failed = |reason: String| ProxyError::Auth {
                setting: auth.key_path.clone(),
                reason,
            };
            let text = std::fs::read(&auth.authfile).map_err(|error| {
                failed(format!("cannot read {}: {error}", auth.authfile.display()))
            })?;
            let authfile = Authfile::parse(&text)
                .map_err(|error| failed(format!("{}: {error}", auth.authfile.display())))?;
            Ok(Some(Arc::new(authfile)))
        })
        .collect()
}

/// Whether the secret files of the running generation now hold something else (or cannot
/// be read): a SIGHUP or `POST /reload` then applies the running config again, so an
/// edited authfile or a rotated password takes effect without a change to the config file.
pub fn changed_since(generation: &Generation) -> bool {
    let config = &generation.config;
    let authfiles_changed = match listener_authfiles(config) {
        Ok(now) => now != generation.client_logins,
        Err(_) => true,
    };
    let passwords_changed = generation
        .routes
        .pool_names
        .iter()
        .zip(&generation.connectors)
        .any(|(name, connectors)| {
            let Some(auth) = config.pools.get(name).and_then(|p| p.auth.as_ref()) else {
                return false;
            };
            match backend_login(auth) {
                Ok(login) => connectors.iter().any(|c| c.login() != Some(&login)),
                Err(_) => true,
            }
        });
    authfiles_changed || passwords_changed
}

/// What `memroute --check` says about logins: each listener that wants one (its authfile
/// read, its users counted) and each pool that gives one (its password file read). The
/// errors, each naming its setting, come back in the second element.
pub fn check_logins(config: &Config) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut errors = Vec::new();
    for (address, auth) in &config.proxy.listen_auth {
        let users = std::fs::read(&auth.authfile)
            .map_err(|e| e.to_string())
            .and_then(|text| Authfile::parse(&text).map_err(|e| e.to_string()));
        match users {
            Ok(users) => out.push_str(&format!(
                "listener {address}: clients log in ({} users in {})\n",
                users.len(),
                auth.authfile.display()
            )),
            Err(error) => errors.push(format!(
                "{}: {}: {error}",
                auth.key_path,
                auth.authfile.display()
            )),
        }
    }
    for (name, pool) in &config.pools {
        let Some(auth) = &pool.auth else { continue };
        match backend_login(auth) {
            Ok(_) => out.push_str(&format!(
                "pool {name}: logs in to its servers as {}\n",
                auth.username
            )),
            Err(error) => errors.push(error.to_string()),
        }
    }
    (out, errors)
}
