//! No secret of a store URL reaches any output: random secrets (with `/`, `#`, `@`, `?`, `%`,
//! percent-escapes and non-ASCII letters), raw and percent-encoded, in every position the
//! drivers honour, must appear in none of `Display` and `Debug` of `RedisConfig`,
//! `PostgresConfig` and `distribution::Config`, the errors of connecting to an unreachable port
//! or to a server that refuses the credentials, the `Display` and `Debug` of a store that
//! connected with the secret, and everything logged at TRACE level meanwhile, the drivers' own
//! logs included (redis-rs logs through `log`, sqlx through `tracing`; both are captured).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use distribution::postgres::{sqlx, PostgresConfig, PostgresLeaseStore};
use distribution::redis::{RedisConfig, RedisLeaseStore};
use distribution::{redact_url, Config, LeaseStore, RunId, Ttl, WorkerId};
use lease_conformance::fixtures::{
    required, unavailable, unique_namespace, PostgresServer, RedisOptions, RedisServer, REDIS_HINT,
};
use lease_conformance::fuzz::secret;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

/// Everything logged in this test process, by `tracing` and by `log`, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

struct LogCapture(Captured);

impl log::Log for LogCapture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let mut out = self.0.clone();
        let _ = writeln!(
            out,
            "{} {}: {}",
            record.level(),
            record.target(),
            record.args()
        );
    }
    fn flush(&self) {}
}

/// Installs the capturing `tracing` subscriber and `log` logger, once per process.
fn capture() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Captured::default();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(captured.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
            log::set_logger(Box::leak(Box::new(LogCapture(captured.clone())))).expect("one logger");
            log::set_max_level(log::LevelFilter::Trace);
            captured
        })
        .clone()
}

fn encoded(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Panics if `text` shows any word of the secret, as written or percent-encoded.
fn assert_hidden(words: &[String], what: &str, text: &str) {
    for word in words {
        assert!(
            !text.contains(word.as_str()) && !text.contains(&encoded(word)),
            "{what} shows {word:?} of the secret:\n{text}"
        );
    }
}

/// Every position, with the secret as `s` (encoded or raw) and the server at `host:port`.
fn redis_urls(e: &str, raw: &str, at: &str) -> Vec<String> {
    vec![
        format!("redis://:{e}@{at}/0"),
        format!("redis://lease:{e}@{at}"),
        format!("redis://{e}@{at}"), // the user name as a token
        format!("redis://:{raw}@{at}"),
        format!("redis://lease:{raw}@{at}/1"),
        "redis+unix:///nonexistent/r.sock?pass=E".replace('E', e),
        format!("unix:///nonexistent/r.sock?db=0&pass={raw}"),
        format!("redis://{at}?password={e}"),
        format!("redis://{at}?pass={e}"),
        format!("redis://{at}?PASSWORD={e}"),
        format!("redis://{at}?api_token={e}"),
        format!("redis://{at}?secret_key={raw}"),
        format!("redis+cluster://u:{e}@{at},{at}"),
        format!("rediss+cluster://:{raw}@{at},{at}"),
        format!("redis+sentinel://u:{e}@{at},{at}/SERVICE"),
        format!("rediss+sentinel://:{raw}@{at}/SERVICE/1"),
    ]
}

fn postgres_urls(e: &str, raw: &str, at: &str, at2: &str) -> Vec<String> {
    vec![
        format!("postgres://lease_pw:{e}@{at}/postgres"),
        format!("postgres://lease_pw:{raw}@{at}/postgres"),
        format!("postgres://lease_pw@{at}/postgres?password={e}"),
        format!("postgres://lease_pw@{at}/postgres?password={raw}"),
        format!("postgres://lease_pw@{at}/postgres?pass={e}"),
        format!("postgres://lease_pw@{at}/postgres?PASSWORD={e}"),
        format!("postgres://lease_pw@{at}/postgres?api_token={e}"),
        format!("postgres://lease_pw@{at}/postgres?sslmode=disable&secret_key={e}"),
        format!("postgres://lease_pw:{e}@{at},{at2}/postgres"),
        format!("postgresql://lease_pw:{raw}@{at},{at2}/postgres?sslmode=disable"),
    ]
}

/// Checks the configurations' `Display` and `Debug`, and connects, checking the error (or the
/// connected store, which is then used once).
async fn check_url(url: String, words: Arc<Vec<String>>, must_connect: bool) {
    let facade = Config::default().with_store(url.clone());
    assert_hidden(&words, "distribution::Config Debug", &format!("{facade:?}"));
    assert_hidden(&words, "distribution::Config Display", &facade.to_string());
    if let Err(e) = facade.backend() {
        assert_hidden(&words, "ConfigError", &format!("{e} {e:?}"));
    }
    // Refused or unreachable: fail fast. Accepted: a connection must come, however loaded the
    // machine (a fresh-clone run beside other test binaries once took over 500 ms to
    // authenticate, and the accepted case failed on a slow server, not on a shown secret).
    let patience = if must_connect {
        Duration::from_secs(15)
    } else {
        Duration::from_millis(500)
    };
    let store: Arc<dyn LeaseStore> = if url.starts_with("postgres") {
        // The fixture server runs with fsync off: accepted explicitly, as every test does.
        let config = PostgresConfig::from_url(url.clone())
            .with_volatile(true)
            .with_schema(unique_namespace("secret"))
            .with_max_connections(2)
            .with_acquire_timeout(patience);
        assert_hidden(&words, "PostgresConfig Debug", &format!("{config:?}"));
        assert_hidden(&words, "PostgresConfig Display", &config.to_string());
        match PostgresLeaseStore::connect(config).await {
            Ok(store) => Arc::new(store),
            Err(e) if !must_connect => {
                if std::env::var_os("SHOW_ERRORS").is_some() {
                    eprintln!("{url} -> {e}");
                }
                return assert_hidden(&words, "postgres error", &format!("{e} {e:?}"));
            }
            Err(e) => panic!("{} did not connect: {e}", redact_url(&url)),
        }
    } else {
        let config = RedisConfig::from_url(&url)
            .with_namespace(unique_namespace("secret"))
            .with_connect_timeout(patience)
            .with_response_timeout(Duration::from_secs(2));
        assert_hidden(&words, "RedisConfig Debug", &format!("{config:?}"));
        assert_hidden(&words, "RedisConfig Display", &config.to_string());
        match RedisLeaseStore::connect(config).await {
            Ok(store) => Arc::new(store),
            Err(e) if !must_connect => {
                if std::env::var_os("SHOW_ERRORS").is_some() {
                    eprintln!("{url} -> {e}");
                }
                return assert_hidden(&words, "redis error", &format!("{e} {e:?}"));
            }
            Err(e) => panic!("{} did not connect: {e}", redact_url(&url)),
        }
    };
    assert_hidden(&words, "store Display", &store.to_string());
    assert_hidden(&words, "store Debug", &format!("{store:?}"));
    let run = RunId::new("secret-run").unwrap();
    store.create(&run).await.expect("create");
    let lease = store
        .claim(
            &run,
            &WorkerId::new("w").unwrap(),
            Ttl::from_secs(5).unwrap(),
        )
        .await
        .expect("claim");
    store.complete(&lease).await.expect("complete");
}

async fn check_all(urls: Vec<String>, words: &[String], must_connect: bool) {
    let words = Arc::new(words.to_vec());
    let mut checks = tokio::task::JoinSet::new();
    for url in urls {
        checks.spawn(check_url(url, words.clone(), must_connect));
    }
    while let Some(done) = checks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Unreachable servers (127.0.0.1:1 and 127.0.0.2:1): every position, every output.
#[test]
fn no_secret_reaches_any_output_with_an_unreachable_server() {
    let captured = capture();
    let rt = runtime();
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 12,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    runner
        .run(&secret(), |(secret, words)| {
            let (e, raw) = (encoded(&secret), secret.clone());
            let mut urls = redis_urls(&e, &raw, "127.0.0.1:1");
            urls.extend(postgres_urls(&e, &raw, "127.0.0.1:1", "127.0.0.2:1"));
            rt.block_on(check_all(urls, &words, false));
            assert_hidden(&words, "captured logs", &captured.text());
            Ok(())
        })
        .unwrap();
    assert!(
        captured.text().contains("TRACE") || captured.text().contains("DEBUG"),
        "the capture saw no driver logs at all; is it installed?"
    );
}

/// Servers that refuse the secret, then accept it: a private Redis whose default user has
/// another password and whose ACL user `lease` gets the secret, and a private Postgres whose
/// role `lease_pw` gets it.
#[test]
fn no_secret_reaches_any_output_with_a_refusing_or_accepting_server() {
    let captured = capture();
    let Some(redis) = required(
        "redis-server",
        RedisServer::start_options(RedisOptions::default().with_password("default-pw-7")),
        REDIS_HINT,
    ) else {
        return;
    };
    let postgres = match PostgresServer::start() {
        Ok(server) => server,
        Err(why) => return unavailable("postgres", why, "install postgresql").unwrap_or(()),
    };
    let rt = runtime();
    // The role's password is set through a bound parameter, so that sqlx's statement log,
    // captured too, never holds it.
    let admin = rt.block_on(async {
        let admin = PostgresLeaseStore::connect(
            PostgresConfig::from_url(postgres.url()).with_schema(unique_namespace("admin")),
        )
        .await
        .expect("connect as postgres");
        sqlx::query(
            "CREATE FUNCTION public.set_test_password(p text) RETURNS void LANGUAGE plpgsql \
             AS $$ BEGIN EXECUTE format('ALTER ROLE lease_pw PASSWORD %L', p); END $$",
        )
        .execute(admin.pool())
        .await
        .expect("create set_test_password");
        admin
    });
    let (redis_at, pg_port) = (format!("127.0.0.1:{}", redis.port()), postgres.port());
    let (pg_at, pg_at2) = (
        format!("127.0.0.1:{pg_port}"),
        format!("127.0.0.2:{pg_port}"),
    );
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 6,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    runner
        .run(&secret(), |(secret, words)| {
            let (e, raw) = (encoded(&secret), secret.clone());
            // Refused: the default user's password is another, the role's the last case's.
            let mut urls = redis_urls(&e, &raw, &redis_at);
            urls.extend(postgres_urls(&e, &raw, &pg_at, &pg_at2));
            rt.block_on(check_all(urls, &words, false));
            // Accepted: the same secret is now the password.
            redis
                .command(&[
                    "ACL",
                    "SETUSER",
                    "lease",
                    "on",
                    "resetpass",
                    &format!(">{secret}"),
                    "~*",
                    "&*",
                    "+@all",
                ])
                .expect("ACL SETUSER");
            rt.block_on(async {
                sqlx::query("SELECT public.set_test_password($1)")
                    .bind(&secret)
                    .execute(admin.pool())
                    .await
                    .expect("set the role's password");
                check_all(
                    vec![
                        format!("redis://lease:{e}@{redis_at}/0"),
                        format!("redis://lease:{e}@{redis_at}?replicas=0"),
                        format!("postgres://lease_pw:{e}@{pg_at}/postgres"),
                        format!("postgres://lease_pw@{pg_at}/postgres?password={e}"),
                        format!("postgres://lease_pw:{e}@{pg_at},{pg_at2}/postgres"),
                    ],
                    &words,
                    true,
                )
                .await;
            });
            assert_hidden(&words, "captured logs", &captured.text());
            Ok(())
        })
        .unwrap();
}
