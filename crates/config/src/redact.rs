//! The config as the admin endpoint shows it: the operator's TOML with the value of every
//! secret key replaced (`admin.token`, a pool's `auth.password`), by a rule on key names so
//! that one added later is never served by `GET /config` either. File paths
//! (`password_file`, TLS keys, an authfile) are not secrets and are shown.
use toml::Value;

/// What a secret's value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Whether a key's value is a secret: `password`, `secret`, `token`, `passphrase` or
/// `credentials`, alone or as the end of a name (`sasl_password`, `auth_token`).
fn is_secret(key: &str) -> bool {
    const SECRETS: [&str; 5] = ["password", "secret", "token", "passphrase", "credentials"];
    let key = key.to_ascii_lowercase();
    SECRETS
        .iter()
        .any(|s| key == *s || key.ends_with(&format!("_{s}")))
}

fn redact(value: &mut Value) {
    match value {
        Value::Table(table) => {
            for (key, value) in table.iter_mut() {
                if is_secret(key) {
                    *value = Value::String(REDACTED.to_string());
                } else {
                    redact(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// `text` (a config that parsed) re-rendered with every secret value replaced. Comments
/// and layout are not kept: the point is what memroute runs with.
pub fn redacted(text: &str) -> String {
    let mut value: Value = match text.parse::<toml::Table>() {
        Ok(table) => Value::Table(table),
        Err(_) => return "# the running config's text does not parse as TOML\n".to_string(),
    };
    redact(&mut value);
    toml::to_string_pretty(&value)
        .unwrap_or_else(|_| "# the running config cannot be shown\n".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_replaced_and_paths_kept() {
        let text = "[pools.a]\nservers = [\"h:1\"]\nsasl_password = \"hunter2\"\n\
                    [pools.a.tls]\nkey = \"/etc/k.pem\"\n[[x]]\ntoken = \"t\"\n";
        let shown = redacted(text);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("\"t\""), "{shown}");
        assert!(shown.contains("/etc/k.pem"), "{shown}");
        assert_eq!(shown.matches(REDACTED).count(), 2, "{shown}");
    }
}
