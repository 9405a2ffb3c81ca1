//! The configuration's parsing and checks: URLs, files, environment, refusals.

use super::*;

/// There is no default store: a configuration naming none, from the defaults, a file or
/// the environment, is refused before any I/O with one sentence naming `LEASE_STORE` and
/// `--store`; `memory:` works only written out.
#[tokio::test]
async fn a_configuration_without_a_store_is_refused_naming_lease_store() {
    let unset = |_: &str| None;
    for config in [
        Config::default(),
        Config::default().with_vars(unset).unwrap(),
        Config::from_toml("ttl_ms = 5000\nnamespace = \"billing\"\n").unwrap(),
        Config::default().with_store("  "),
    ] {
        let err = config.backend().unwrap_err();
        assert!(matches!(err, ConfigError::NoStore), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains("LEASE_STORE") && message.contains("--store"),
            "{message}"
        );
        assert!(matches!(connect(&config).await, Err(ConfigError::NoStore)));
    }
    let memory = Config::default().with_store("memory:");
    assert_eq!(memory.backend().unwrap(), Backend::Memory);
    assert!(connect(&memory).await.is_ok());
}

/// Run by CI with `--no-default-features --features postgres` (and `redis`): a URL of a
/// backend left out of the build is refused before any I/O, naming the feature.
#[test]
fn a_url_of_a_backend_left_out_names_its_feature() {
    let urls = [
        (Backend::Postgres, "postgres://app:hunter2@db/runs"),
        (Backend::Redis, "redis://:hunter2@cache:6379"),
        (Backend::Redis, "redis+cluster://:hunter2@a:1,b:2"),
        (Backend::Etcd, "etcd://app:hunter2@a:2379,b:2379/jobs"),
        (Backend::Etcd, "etcd://a:2379"),
    ];
    for (backend, url) in urls {
        let config = Config::default().with_store(url);
        match config.backend() {
            Ok(found) => {
                assert!(backend.is_built(), "{url} accepted by a build without it");
                assert_eq!(found, backend);
            }
            Err(ConfigError::FeatureDisabled {
                backend: name,
                feature,
            }) => {
                assert!(!backend.is_built(), "{url} refused by a build with it");
                assert_eq!(Some(feature), backend.feature());
                let message = config.backend().unwrap_err().to_string();
                assert!(
                    message.contains(&format!("`{feature}` feature")) && message.contains(name),
                    "{message}"
                );
                assert!(!message.contains("hunter2"), "{message}");
            }
            Err(other) => panic!("{url}: {other}"),
        }
    }
    assert!(Backend::Memory.is_built() && Backend::Memory.feature().is_none());
}

/// Run by CI with `--no-default-features --features postgres`: without a TLS feature, a
/// URL that demands TLS is refused before any I/O, naming the features (not left to fail
/// at the handshake with a driver message).
#[cfg(all(
    feature = "postgres",
    not(any(feature = "tls-rustls", feature = "tls-native-tls"))
))]
#[tokio::test]
async fn a_url_that_needs_tls_names_the_tls_features_in_a_build_without_them() {
    let config =
        Config::default().with_store("postgres://app:hunter2@127.0.0.1:1/db?sslmode=require");
    let err = connect(&config).await.expect_err("TLS is not built");
    let message = err.to_string();
    assert!(
        matches!(
            &err,
            ConfigError::Store(lease_core::Error::Misconfigured { .. })
        ) && message.contains("`tls-rustls` or `tls-native-tls` feature")
            && !message.contains("hunter2"),
        "{message}"
    );
}

#[test]
fn config_nests_in_an_application_config_with_every_check() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct App {
        lease: Config,
    }
    let app: App = toml::from_str(
        "[lease]\nstore = \"postgres://app:pw@db/x\"\nttl_ms = 1500\nmax_connections = 4\nmigrate = false\n",
    )
    .unwrap();
    assert_eq!(
        (
            app.lease.ttl.as_millis(),
            app.lease.max_connections,
            app.lease.migrate
        ),
        (1500, Some(4), Some(false))
    );
    // The same checks as the file: a TTL out of range and an unknown key are refused.
    let bad = toml::from_str::<App>("[lease]\nttl_ms = 0\n")
        .unwrap_err()
        .to_string();
    assert!(bad.contains("ttl_ms"), "{bad}");
    let unknown = toml::from_str::<App>("[lease]\nstore = \"memory:\"\nttl = 5\n")
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown field `ttl`"), "{unknown}");
    let env = Config::default()
        .with_vars(|k| (k == "LEASE_MIGRATE").then(|| "maybe".to_string()))
        .unwrap_err();
    assert!(env.to_string().contains("LEASE_MIGRATE"), "{env}");
}

/// `ENV_VARS` names every variable the configuration reads, and no other: the `lease`
/// command keeps exactly these from its children.
#[test]
fn env_vars_are_the_variables_read() {
    let asked = std::sync::Mutex::new(Vec::new());
    Config::default()
        .with_vars(|k| {
            asked.lock().unwrap().push(k.to_owned());
            None
        })
        .unwrap();
    let mut asked = asked.into_inner().unwrap();
    let mut listed: Vec<String> = Config::ENV_VARS.iter().map(|v| v.to_string()).collect();
    asked.sort();
    listed.sort();
    assert_eq!(asked, listed);
}

#[test]
fn precedence_is_file_then_env_then_flags() {
    let file =
        Config::from_toml("store = \"redis://file\"\nttl_ms = 1000\nnamespace = \"f\"").unwrap();
    let env = file
        .with_vars(|k| match k {
            "LEASE_STORE" => Some("postgres://env/db".into()),
            "LEASE_TTL_MS" => Some("2000".into()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (
            env.store.as_str(),
            env.ttl.as_millis(),
            env.namespace.as_deref()
        ),
        ("postgres://env/db", 2000, Some("f"))
    );
    let flags = env.with_store("memory:");
    assert_eq!(flags.backend().unwrap(), Backend::Memory);
}

#[test]
fn load_reads_the_file_when_given_and_names_a_missing_one() {
    let path = std::env::temp_dir().join(format!("lease-load-{}.toml", std::process::id()));
    std::fs::write(&path, "max_connections = 7\nttl_ms = 4321\n").unwrap();
    let loaded = Config::load(Some(&path));
    std::fs::remove_file(&path).unwrap();
    let loaded = loaded.unwrap();
    // The environment may override these only through LEASE_* variables, unset in tests.
    assert_eq!(
        (loaded.max_connections, loaded.ttl.as_millis()),
        (Some(7), 4321)
    );
    match Config::load(Some(&path)) {
        Err(ConfigError::File { path: named, .. }) => {
            assert_eq!(named, path.display().to_string())
        }
        other => panic!("a missing file must be ConfigError::File, got {other:?}"),
    }
}

// Needs both backends built (the default features).
#[cfg(all(feature = "postgres", feature = "redis"))]
#[test]
fn replica_settings_come_from_file_and_environment() {
    let config =
        Config::from_toml("replicas = 1\nreplica_timeout_ms = 250\nsync_replicas = 2").unwrap();
    assert_eq!(config.replicas, Some(1));
    assert_eq!(config.replica_timeout, Some(Duration::from_millis(250)));
    assert_eq!(config.sync_replicas, Some(2));
    let env = |key: &str| match key {
        "LEASE_REPLICAS" => Some("2".to_string()),
        "LEASE_SYNC_REPLICAS" => Some("one".to_string()),
        _ => None,
    };
    let err = Config::default().with_vars(env).unwrap_err();
    assert!(err.to_string().contains("LEASE_SYNC_REPLICAS"), "{err}");
    assert!(Config::from_toml("replica_timeout_ms = 0").is_err());
    let cluster = Config::default().with_store("redis+cluster://:pw@h1:1,h2:2");
    assert_eq!(cluster.backend().unwrap(), Backend::Redis);
    assert!(!format!("{cluster:?}").contains("pw"));
    let hosts = Config::default().with_store("postgres://app:pw@h1:5432,h2:5433/runs");
    assert_eq!(hosts.backend().unwrap(), Backend::Postgres);
    assert!(!format!("{hosts:?}").contains("pw"));
}

#[test]
fn the_pool_size_comes_from_file_environment_or_flag_within_range() {
    let config = Config::from_toml("max_connections = 32").unwrap();
    assert_eq!(config.max_connections, Some(32));
    let config = config
        .with_vars(|k| (k == "LEASE_MAX_CONNECTIONS").then(|| "48".into()))
        .unwrap();
    assert_eq!(config.max_connections, Some(48));
    assert_eq!(
        config.with_max_connections(16).unwrap().max_connections,
        Some(16)
    );
    for bad in ["max_connections = 0", "max_connections = 1001"] {
        let err = Config::from_toml(bad).unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadSetting { key, reason } if key == "max_connections" && reason.contains("1 to 1000")),
            "{bad}: {err}"
        );
    }
    let err = Config::default()
        .with_vars(|k| (k == "LEASE_MAX_CONNECTIONS").then(|| "many".into()))
        .unwrap_err();
    assert!(matches!(&err, ConfigError::BadSetting { key, .. } if key == "LEASE_MAX_CONNECTIONS"));
    assert!(Config::default().with_max_connections(0).is_err());
}

// Needs both backends built (the default features).
#[cfg(all(feature = "postgres", feature = "redis"))]
#[test]
fn one_namespace_rule_on_every_backend() {
    for store in [
        "memory:",
        "postgres://app@db/runs",
        "redis://127.0.0.1:6379",
    ] {
        for bad in ["a}b", "{a}", "a:b", "a b", "", "ünï", &"n".repeat(64)] {
            let err = Config::default()
                .with_store(store)
                .with_namespace(bad)
                .backend()
                .unwrap_err();
            assert!(
                matches!(&err, ConfigError::BadSetting { key, reason } if key == "namespace" && reason.contains("1 to 63 ASCII letters")),
                "{store} {bad:?}: {err}"
            );
        }
        for good in ["billing", "tenant-7.prod_eu", &"n".repeat(63)] {
            Config::default()
                .with_store(store)
                .with_namespace(good)
                .backend()
                .unwrap_or_else(|e| panic!("{store} {good:?}: {e}"));
        }
    }
}

#[test]
fn bad_settings_name_their_source() {
    let err = Config::default()
        .with_vars(|k| (k == "LEASE_TTL_MS").then(|| "0".into()))
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::BadSetting { key, .. } if key == "LEASE_TTL_MS"),
        "{err}"
    );
    let err = Config::default()
        .with_vars(|k| (k == "LEASE_TTL_MS").then(|| "soon".into()))
        .unwrap_err();
    assert!(err.to_string().contains("LEASE_TTL_MS"), "{err}");
    assert!(matches!(
        Config::from_toml("stroe = \"memory:\""),
        Err(ConfigError::File { .. })
    ));
}

#[test]
fn the_leaking_urls_of_issue_14_are_redacted_in_debug_and_display() {
    for (url, expected) in [
        (
            "redis+unix:///tmp/r.sock?pass=hunter2",
            "redis+unix:///tmp/r.sock?pass=******",
        ),
        ("redis://:hun/ter2@h:6379", "redis://:******@h:6379"),
        ("redis://:hun#ter2@h:6379", "redis://:******"),
        (
            "postgres://app@db/x?password=hunter2",
            "postgres://app@db/x?password=******",
        ),
        ("postgres://app:hun/ter2@db/x", "postgres://app:******@db/x"),
        (
            "postgres://app@db/x?PASSWORD=hunter2",
            "postgres://app@db/x?PASSWORD=******",
        ),
        (
            "postgres://app@db/x?api_token=hunter2",
            "postgres://app@db/x?api_token=******",
        ),
        (
            "redis://h:6379?api_token=hunter2",
            "redis://h:6379?api_token=******",
        ),
        (
            "redis://h:6379?PASSWORD=hunter2",
            "redis://h:6379?PASSWORD=******",
        ),
    ] {
        assert_eq!(redact_url(url), expected, "{url}");
        let config = Config::default().with_store(url);
        let debug = format!("{config:?}");
        assert!(debug.contains(&format!("{expected:?}")), "{debug}");
        assert!(config.to_string().starts_with(expected), "{config}");
        let err = config
            .backend()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        for shown in [debug, config.to_string(), err] {
            assert!(!shown.contains("hun"), "{shown}");
        }
    }
}

// Needs both backends built (the default features).
#[cfg(all(feature = "postgres", feature = "redis"))]
/// Every backend refuses a parameter it does not document, naming it, before any I/O
/// (port 1 is never dialled: the URL is refused first).
#[tokio::test]
async fn unknown_url_parameters_are_refused_by_name_on_every_backend() {
    let err = Config::default()
        .with_store("memory:?replicas=1")
        .backend()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::MalformedUrl { reason, .. } if reason.contains("\"replicas\"")),
        "{err}"
    );
    for (store, named) in [
        (
            "postgres://app:pw1234@127.0.0.1:1/db?volatle=true",
            "\"volatle\"",
        ),
        ("postgres://app@127.0.0.1:1/db?pass=pw1234", "\"pass\""),
        (
            "postgres://app@127.0.0.1:1/db?PASSWORD=pw1234",
            "\"PASSWORD\"",
        ),
        (
            "postgres://app:pw1234@127.0.0.1:1,127.0.0.2:1/db?replicas=1",
            "\"replicas\"",
        ),
        (
            "redis://:pw1234@127.0.0.1:1?sync_replicas=1",
            "\"sync_replicas\"",
        ),
        ("redis://127.0.0.1:1?password=pw1234", "\"password\""),
        (
            "redis+cluster://:pw1234@127.0.0.1:1,127.0.0.1:2?volatle=true",
            "\"volatle\"",
        ),
        (
            "redis+sentinel://127.0.0.1:1/svc?api_token=pw1234",
            "\"api_token\"",
        ),
    ] {
        let err = connect(&Config::default().with_store(store))
            .await
            .err()
            .unwrap_or_else(|| panic!("{store} was accepted"));
        assert!(
            matches!(
                &err,
                ConfigError::Store(lease_core::Error::Misconfigured { .. })
            ),
            "{store}: {err:?}"
        );
        assert!(!err.is_retryable());
        let shown = format!("{err} {err:?}");
        assert!(shown.contains(named), "{store}: {shown}");
        assert!(!shown.contains("pw1234"), "{store}: {shown}");
    }
}

#[test]
fn urls_are_classified_without_echoing_passwords() {
    let cfg = Config::default().with_store("mysql://u:secret@h/db");
    let err = cfg.backend().unwrap_err();
    assert!(matches!(&err, ConfigError::UnknownScheme { scheme } if scheme == "mysql"));
    let cfg = Config::default().with_store("postgres://u:secret@/db");
    let err = cfg.backend().unwrap_err();
    assert!(matches!(err, ConfigError::MalformedUrl { .. }), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
    let err = Config::default()
        .with_store("not a url :secret@")
        .backend()
        .unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
    assert_eq!(
        redact_url("redis://:s3cr3t@localhost:6379/0"),
        "redis://:******@localhost:6379/0"
    );
    assert!(!format!("{:?}", Config::default().with_store("rediss://u:pw@h")).contains("pw@"));
}
