//! The secrets memroute reads from files, at start and at every reload: the password each
//! pool logs in to its servers with, and the authfile each listener's clients log in
//! against. A file that cannot be read or used fails the start or the reload (the running
//! config stays), naming the setting.
use std::sync::Arc;

use memroute_config::{BackendAuth, Config, Password};
use memroute_net::BackendLogin;
use memroute_protocol::auth::Authfile;

use crate::error::ProxyError;

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
