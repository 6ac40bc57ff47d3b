//! Reading the settings: defaults, the file, then the environment, for the
//! platform and for the domain (its `[domain]` table and `SEAWALL_<KEY>`
//! variables), with every `SEAWALL_*` variable accounted for.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use super::service_links::is_service_link;
use super::{ConfigError, Settings, invalid};

/// `SEAWALL_*` variables that are not settings, so start-up does not refuse
/// them: read before the settings (`SEAWALL_CONFIG`, the logging ones), or
/// by the project's scripts and tests, which export them to every process
/// they start.
const NOT_SETTINGS: &[&str] = &[
    "CONFIG",
    "LOG",
    "LOG_FORMAT",
    "BIN",
    "KEEP_SERVICES",
    "SERVICES_DIR",
    "SERVICES_LOCK",
    "RUN_SERVICES_DIR",
    "FUZZ_SECONDS",
    "PG_PORT",
    "MYSQL_PORT",
    "NATS_PORT",
    "NATS_MON_PORT",
    "ETCD_PORT",
];

/// Prefixes of the scripts' and tests' own variable families (see
/// [`NOT_SETTINGS`]).
const NOT_SETTINGS_PREFIXES: &[&str] = &["TEST_", "BENCH_", "HA_"];

/// A domain's own settings (`service::domain::Settings` in this template):
/// read from the file's `[domain]` table and from `SEAWALL_<KEY>` variables,
/// checked at start-up like the platform's. Every key must serialize (an
/// unset `Option` as null), since the serialized default is what names the
/// keys the environment may set.
pub trait DomainSettings:
    Serialize + serde::de::DeserializeOwned + Default + Clone + std::fmt::Debug + Send + Sync + 'static
{
    /// Checks what deserializing cannot.
    ///
    /// # Errors
    /// The key and the problem.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        Ok(())
    }
}

/// The settings of a domain that has none.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

impl DomainSettings for NoSettings {}

/// Loaded settings plus what the loader learnt about where they came from.
#[derive(Debug, Clone)]
pub struct Loaded<D = NoSettings> {
    pub settings: Settings,
    /// The domain's own settings.
    pub domain: D,
    /// Whether `database_url` was set explicitly (file or environment), as
    /// opposed to the default. `seawall demo` uses a throwaway file otherwise.
    pub database_url_explicit: bool,
}

/// Names the key a figment error is about, in both its file and env spelling.
fn parse_error(err: figment::Error) -> ConfigError {
    let key = err.path.join(".").to_lowercase();
    let source = err
        .metadata
        .as_ref()
        .map(|m| format!(" (from {})", m.name))
        .unwrap_or_default();
    ConfigError::Parse {
        env: key.to_uppercase(),
        key,
        problem: format!("{}{source}", err.kind),
    }
}

/// The keys of a settings type: the names its serialized default has.
fn keys_of<T: Serialize>(value: &T) -> Vec<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Refuses a `SEAWALL_*` variable that is neither a setting (the platform's
/// or the domain's), one of [`NOT_SETTINGS`], nor a Kubernetes service
/// link (see [`super::service_links`]): a misspelt key would otherwise be
/// ignored, and its default used in silence.
fn check_environment(
    vars: impl IntoIterator<Item = (String, String)>,
    platform: &[String],
    domain: &[String],
) -> Result<(), ConfigError> {
    for (var, value) in vars {
        if is_service_link(&var, &value) {
            continue;
        }
        // The environment provider matches the prefix in any case, so this
        // check does too.
        let upper = var.to_uppercase();
        let Some(rest) = upper.strip_prefix("SEAWALL_") else {
            continue;
        };
        let key = rest.to_lowercase();
        let known = platform.contains(&key)
            || domain.contains(&key)
            || NOT_SETTINGS.contains(&rest)
            || NOT_SETTINGS_PREFIXES.iter().any(|p| rest.starts_with(p));
        if !known {
            return Err(ConfigError::UnknownVariable(var));
        }
    }
    Ok(())
}

/// The process's environment as text (a name or value that is not UTF-8
/// cannot be a setting).
fn environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// The keys (after `SEAWALL_`) of variables shaped like Kubernetes
/// service links that also name a setting: a fork whose setting `port`
/// runs beside its own Service `seawall` gets `SEAWALL_PORT=tcp://..`
/// from the kubelet. Such a value is the kubelet's, not the operator's, so
/// it is left out of the settings (with a warning naming the way out)
/// rather than stopping every pod on a value that cannot parse.
fn service_links_named_as_settings(platform: &[String], domain: &[String]) -> Vec<String> {
    environment()
        .filter(|(var, value)| is_service_link(var, value))
        .filter_map(|(var, _)| {
            let key = var.to_uppercase().strip_prefix("SEAWALL_")?.to_lowercase();
            (platform.contains(&key) || domain.contains(&key)).then_some(key)
        })
        .inspect(|key| {
            tracing::warn!(
                variable = %format!("SEAWALL_{}", key.to_uppercase()),
                "a Kubernetes service link shares a setting's name; it is ignored (set enableServiceLinks: false on the pod, or rename the Service, to set this key by the environment)"
            );
        })
        .collect()
}

/// Loads and validates the platform's settings and the domain's (`D`):
/// defaults, then the file, then `SEAWALL_*` variables.
///
/// # Errors
/// A missing file, a value that does not parse or is out of range, an
/// unknown `SEAWALL_*` variable: each naming the key or variable.
pub fn load<D: DomainSettings>(file: Option<&Path>) -> Result<Loaded<D>, ConfigError> {
    let platform_keys = keys_of(&Settings::default());
    let domain_keys = keys_of(&D::default());
    if let Some(clash) = domain_keys.iter().find(|k| platform_keys.contains(k)) {
        return Err(ConfigError::DomainKeyClash(clash.clone()));
    }
    check_environment(environment(), &platform_keys, &domain_keys)?;
    let mut user = Figment::new();
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::MissingFile(path.display().to_string()));
        }
        user = user.merge(Toml::file_exact(path));
    }
    let links = service_links_named_as_settings(&platform_keys, &domain_keys);
    let env = Env::prefixed("SEAWALL_").filter_map(move |key| {
        if links
            .iter()
            .any(|link| key.as_str().eq_ignore_ascii_case(link))
        {
            return None;
        }
        let key = key.as_str().to_lowercase();
        if platform_keys.contains(&key) {
            Some(key.into())
        } else if domain_keys.contains(&key) {
            Some(format!("domain.{key}").into())
        } else {
            None
        }
    });
    user = user.merge(env);
    let database_url_explicit = user.find_value("database_url").is_ok();
    let settings: Settings = Figment::from(Serialized::defaults(Settings::default()))
        .merge(user.clone())
        .extract()
        .map_err(parse_error)?;
    settings.validate()?;
    let domain: D = Figment::from(Serialized::defaults(D::default()))
        .merge(user.focus("domain"))
        .extract()
        .map_err(parse_error)?;
    domain
        .validate()
        .map_err(|(key, problem)| invalid(key, problem))?;
    Ok(Loaded {
        settings,
        domain,
        database_url_explicit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform's configuration reference, which every fork keeps
    /// (a fork rewrites the README).
    fn reference() -> &'static str {
        include_str!("../../docs/configuration.md")
    }

    #[test]
    fn the_configuration_reference_documents_every_setting_and_no_other() {
        let text = reference();
        let keys = keys_of(&Settings::default());
        for key in &keys {
            let upper = key.to_uppercase();
            assert!(
                text.contains(&format!("`{upper}`"))
                    || text.contains(&format!("`SEAWALL_{upper}`")),
                "docs/configuration.md does not name {upper}"
            );
        }
        // Every `SEAWALL_X` it names is a setting or a known non-setting.
        for word in text.split('`').skip(1).step_by(2) {
            if let Some(rest) = word.strip_prefix("SEAWALL_")
                && rest
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !rest.is_empty()
                && !rest.ends_with('_')
            {
                let known = keys.contains(&rest.to_lowercase()) || NOT_SETTINGS.contains(&rest);
                assert!(
                    known,
                    "docs/configuration.md names {word}, which is not a setting"
                );
            }
        }
    }

    #[test]
    fn unknown_variables_are_refused_and_the_tools_own_pass() {
        let platform = keys_of(&Settings::default());
        let domain = vec!["demo_work_ms".to_owned()];
        let check = |vars: &[&str]| {
            check_environment(
                vars.iter().map(|v| ((*v).to_owned(), "1".to_owned())),
                &platform,
                &domain,
            )
        };
        assert!(check(&["SEAWALL_RELAY_BATCH_SIZE", "SEAWALL_DEMO_WORK_MS", "PATH"]).is_ok());
        assert!(check(&["SEAWALL_TEST_PG_URL", "SEAWALL_HA_DIR", "SEAWALL_CONFIG"]).is_ok());
        assert!(matches!(
            check(&["SEAWALL_RELAY_BATCHSIZE"]),
            Err(ConfigError::UnknownVariable(v)) if v == "SEAWALL_RELAY_BATCHSIZE"
        ));
        // `domain` holds the file's table; it is not a variable.
        assert!(check(&["SEAWALL_DOMAIN"]).is_err());
        // The prefix is matched in any case, as the environment provider does.
        assert!(check(&["seawall_relay_batchsize"]).is_err());
        assert!(check(&["seawall_relay_batch_size", "SEAWALL_config"]).is_ok());
    }

    #[test]
    fn kubernetes_service_links_pass_and_a_lookalike_does_not() {
        let platform = keys_of(&Settings::default());
        let check = |vars: &[(&str, &str)]| {
            check_environment(
                vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
                &platform,
                &[],
            )
        };
        assert!(
            check(&[
                ("SEAWALL_API_SERVICE_HOST", "10.96.0.7"),
                ("SEAWALL_API_PORT_8080_TCP", "tcp://10.96.0.7:8080"),
                ("SEAWALL_PORT", "tcp://10.96.0.8:80"),
            ])
            .is_ok()
        );
        assert!(matches!(
            check(&[("SEAWALL_API_SERVICE_HOST", "api.internal")]),
            Err(ConfigError::UnknownVariable(v)) if v == "SEAWALL_API_SERVICE_HOST"
        ));
    }
}
