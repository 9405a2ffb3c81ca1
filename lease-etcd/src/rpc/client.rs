//! The connection to an etcd cluster: endpoints, timeouts, keep-alive, TLS, the auth token
//! and require-leader metadata on every call, and the per-service clients over it.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::codegen::http::Uri;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::generated::etcdserverpb as pb;
use super::generated::etcdserverpb::auth_client::AuthClient;
use super::generated::etcdserverpb::kv_client::KvClient as PbKvClient;
use super::generated::etcdserverpb::lease_client::LeaseClient as PbLeaseClient;
use super::generated::etcdserverpb::maintenance_client::MaintenanceClient as PbMaintenanceClient;
use super::generated::etcdserverpb::watch_client::WatchClient;
use super::generated::v3lockpb;
use super::generated::v3lockpb::lock_client::LockClient;
use super::kv::{GetOptions, GetResponse, ResponseHeader, Txn, TxnResponse};
use super::watch::{WatchOptions, WatchStream};
use super::{Error, Result};

/// TLS settings for `https://` endpoints (rustls).
#[cfg(feature = "tls")]
pub type TlsOptions = tonic::transport::ClientTlsConfig;

/// The answer to a lease grant.
pub type LeaseGrantResponse = pb::LeaseGrantResponse;
/// The answer to a lease's time-to-live.
pub type LeaseTimeToLiveResponse = pb::LeaseTimeToLiveResponse;
/// A member's status.
pub type StatusResponse = pb::StatusResponse;
/// The answer to a lock: the key that holds it.
pub type LockResponse = v3lockpb::LockResponse;
/// The answer to an unlock.
pub type UnlockResponse = v3lockpb::UnlockResponse;

/// The metadata etcd reads the auth token from.
const TOKEN: &str = "token";
/// The metadata that asks a member to refuse a request at once when it has no leader.
const HAS_LEADER: &str = "hasleader";

/// How [`Client::connect`] connects.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    user: Option<(String, String)>,
    keep_alive: Option<(Duration, Duration)>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: Option<TlsOptions>,
    require_leader: bool,
    auto_token_refresh: bool,
}

impl ConnectOptions {
    /// No user, no timeouts, no keep-alive, plain HTTP/2.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Authenticates as `user` at connect (and again when a token is refreshed).
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// HTTP/2 keep-alive pings every `interval`, also while no call is in flight; the
    /// connection is dropped when one is not answered within `timeout`.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// The bound on each call (until its answer's headers, for a stream).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The bound on setting up a connection.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// TLS for the endpoints: `https://` ones, and those given without a scheme.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sends etcd's require-leader metadata (`hasleader: true`) on every call: a member that
    /// has lost its leader refuses at once ("no leader") instead of holding the call.
    pub fn with_require_leader(mut self, on: bool) -> Self {
        self.require_leader = on;
        self
    }

    /// Authenticates again and sends a call once more when etcd refused it for an invalid or
    /// expired token (with a user only).
    pub fn with_auto_token_refresh(mut self, on: bool) -> Self {
        self.auto_token_refresh = on;
        self
    }

    /// The endpoint for `url`, with these settings.
    fn endpoint(&self, url: &str) -> Result<Endpoint> {
        #[cfg(feature = "tls")]
        let tls = self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        let tls = false;
        let url = if url.contains("://") {
            url.to_owned()
        } else if tls {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| Error::InvalidUri(format!("{url:?}: {e}")))?;
        let mut endpoint = match uri.scheme_str() {
            Some("http") if tls => {
                return Err(Error::InvalidArgs(format!(
                    "{url}: TLS is set for http:// endpoints"
                )))
            }
            Some("http") => Endpoint::from(uri),
            #[cfg(feature = "tls")]
            Some("https") => {
                Endpoint::from(uri).tls_config(self.tls.clone().unwrap_or_default())?
            }
            #[cfg(not(feature = "tls"))]
            Some("https") => {
                return Err(Error::InvalidArgs(format!(
                    "{url}: https:// endpoints need lease-etcd's `tls` feature"
                )))
            }
            _ => {
                return Err(Error::InvalidUri(format!(
                    "{url}: not an http:// or https:// endpoint"
                )))
            }
        };
        if let Some((interval, timeout)) = self.keep_alive {
            endpoint = endpoint
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(true);
        }
        if let Some(timeout) = self.timeout {
            endpoint = endpoint.timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(timeout);
        }
        Ok(endpoint)
    }
}

/// Never shows the password.
impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("keep_alive", &self.keep_alive)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("require_leader", &self.require_leader)
            .field("auto_token_refresh", &self.auto_token_refresh)
            .finish_non_exhaustive()
    }
}

/// The current auth token, shared by every client of a connection.
type Token = Arc<RwLock<Option<AsciiMetadataValue>>>;

/// Adds the auth token (if any) and the require-leader metadata to every call.
#[derive(Clone)]
struct Metadata {
    /// `None` on the channel `Authenticate` goes through: it takes no token.
    token: Option<Token>,
    require_leader: bool,
}

impl tonic::service::Interceptor for Metadata {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let token = self.token.as_ref().and_then(|t| read(t).clone());
        if let Some(token) = token {
            request.metadata_mut().insert(TOKEN, token);
        }
        if self.require_leader {
            request
                .metadata_mut()
                .insert(HAS_LEADER, AsciiMetadataValue::from_static("true"));
        }
        Ok(request)
    }
}

/// A channel that carries the metadata.
type Link = InterceptedService<Channel, Metadata>;

fn read(token: &Token) -> std::sync::RwLockReadGuard<'_, Option<AsciiMetadataValue>> {
    token
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A connection's credentials and token.
struct Auth {
    user: Option<(String, String)>,
    auto_refresh: bool,
    token: Token,
    /// One refresh at a time: the calls refused with one stale token share its refresh.
    refreshing: tokio::sync::Mutex<()>,
    client: AuthClient<Link>,
}

impl Auth {
    /// Authenticates again (with a user; without one, drops any token).
    async fn refresh(&self) -> Result<()> {
        let Some((name, password)) = &self.user else {
            *self.token.write().unwrap_or_else(|p| p.into_inner()) = None;
            return Ok(());
        };
        let request = pb::AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        };
        let answer = self.client.clone().authenticate(request).await?;
        let token = AsciiMetadataValue::try_from(answer.into_inner().token)
            .map_err(|_| Status::internal("etcd answered an auth token that is not ASCII"))?;
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
        Ok(())
    }

    /// Sends `request` through `client`; when etcd refuses it for its token (and refreshing
    /// is on), authenticates again, unless a concurrent call already did, and sends it once
    /// more.
    async fn call<C, Q, P, F, Fut>(&self, client: &C, request: Q, send: F) -> Result<P>
    where
        C: Clone,
        Q: Clone,
        F: Fn(C, Q) -> Fut,
        Fut: Future<Output = std::result::Result<Response<P>, Status>>,
    {
        if !self.auto_refresh || self.user.is_none() {
            return Ok(send(client.clone(), request).await?.into_inner());
        }
        let sent_with = read(&self.token).clone();
        match send(client.clone(), request.clone()).await {
            Err(status) if is_invalid_token(&status) => {
                {
                    let _one = self.refreshing.lock().await;
                    if *read(&self.token) == sent_with {
                        self.refresh().await?;
                    }
                }
                Ok(send(client.clone(), request).await?.into_inner())
            }
            answer => Ok(answer?.into_inner()),
        }
    }
}

/// Whether etcd refused a call for its token ("invalid auth token": expired or unknown).
fn is_invalid_token(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message() == "etcdserver: invalid auth token",
        _ => false,
    }
}

/// A connection to an etcd cluster (one endpoint, or several balanced), cheap to clone.
#[derive(Clone)]
pub struct Client {
    link: Link,
    auth: Arc<Auth>,
}

/// Never shows the password.
impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("user", &self.auth.user.as_ref().map(|(user, _)| user))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of `endpoints` (`http://host:port`, `https://host:port`, or `host:port`),
    /// balanced over them when there are several. Connections are made on the first call and
    /// made again after a failure; with a user, this authenticates first.
    ///
    /// # Errors
    /// [`Error::InvalidArgs`] / [`Error::InvalidUri`] for no or a bad endpoint; with a user,
    /// the `Authenticate` call's failure.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl AsRef<[E]>,
        options: Option<ConnectOptions>,
    ) -> Result<Client> {
        let options = options.unwrap_or_default();
        let endpoints = endpoints
            .as_ref()
            .iter()
            .map(|e| options.endpoint(e.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let channel = match endpoints.as_slice() {
            [] => return Err(Error::InvalidArgs("no endpoint".to_owned())),
            [one] => one.connect_lazy(),
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        let token = Token::default();
        let link = |token: Option<Token>| {
            InterceptedService::new(
                channel.clone(),
                Metadata {
                    token,
                    require_leader: options.require_leader,
                },
            )
        };
        let auth = Arc::new(Auth {
            user: options.user.clone(),
            auto_refresh: options.auto_token_refresh,
            token: token.clone(),
            refreshing: tokio::sync::Mutex::new(()),
            client: AuthClient::new(link(None)),
        });
        let client = Client {
            link: link(Some(token)),
            auth,
        };
        if client.auth.user.is_some() {
            client.auth.refresh().await?;
        }
        Ok(client)
    }

    /// Authenticates again with the client's user (without one: drops any token).
    ///
    /// # Errors
    /// The `Authenticate` call's failure.
    pub async fn refresh_token(&self) -> Result<()> {
        self.auth.refresh().await
    }

    /// The KV service.
    pub fn kv_client(&self) -> KvClient {
        KvClient {
            inner: PbKvClient::new(self.link.clone()),
            auth: self.auth.clone(),
        }
    }

    /// The Lease service.
    pub fn lease_client(&self) -> LeaseClient {
        LeaseClient {
            inner: PbLeaseClient::new(self.link.clone()),
            auth: self.auth.clone(),
        }
    }

    /// The Maintenance service.
    pub fn maintenance_client(&self) -> MaintenanceClient {
        MaintenanceClient {
            inner: PbMaintenanceClient::new(self.link.clone()),
            auth: self.auth.clone(),
        }
    }

    /// Reads `key` (and the range `options` give).
    ///
    /// # Errors
    /// The call's failure.
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        self.kv_client().get(key, options).await
    }

    /// Grants an etcd lease of `ttl` seconds.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn lease_grant(&mut self, ttl: i64) -> Result<LeaseGrantResponse> {
        self.lease_client().grant(ttl).await
    }

    /// Takes etcd's lock `name` (the Lock service) under etcd lease `lease`, waiting until
    /// it is free.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn lock(&mut self, name: impl Into<Vec<u8>>, lease: i64) -> Result<LockResponse> {
        let request = v3lockpb::LockRequest {
            name: name.into(),
            lease,
        };
        let client = LockClient::new(self.link.clone());
        self.auth
            .call(&client, request, |mut c, r| async move { c.lock(r).await })
            .await
    }

    /// Releases the lock held by `key` (a [`LockResponse`]'s key).
    ///
    /// # Errors
    /// The call's failure.
    pub async fn unlock(&mut self, key: impl Into<Vec<u8>>) -> Result<UnlockResponse> {
        let request = v3lockpb::UnlockRequest { key: key.into() };
        let client = LockClient::new(self.link.clone());
        self.auth
            .call(
                &client,
                request,
                |mut c, r| async move { c.unlock(r).await },
            )
            .await
    }

    /// Watches `key` (and what `options` add) from now on.
    ///
    /// # Errors
    /// When the stream cannot be opened.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let create = options.unwrap_or_default().request(key.into());
        let client = WatchClient::new(self.link.clone());
        self.auth
            .call(&client, create, |mut c, create| async move {
                let (requests, mut pending) = tokio::sync::mpsc::channel(1);
                requests
                    .send(create)
                    .await
                    .map_err(|_| Status::internal("the watch request was dropped"))?;
                let outgoing = futures_util::stream::poll_fn(move |cx| pending.poll_recv(cx));
                let answer = c.watch(outgoing).await?;
                Ok(answer.map(|responses| WatchStream::new(requests, responses)))
            })
            .await
    }
}

/// The KV service of a [`Client`].
#[derive(Clone)]
pub struct KvClient {
    inner: PbKvClient<Link>,
    auth: Arc<Auth>,
}

impl KvClient {
    /// Accepts answers up to `limit` bytes (tonic's default: 4 MiB).
    pub fn max_decoding_message_size(mut self, limit: usize) -> KvClient {
        self.inner = self.inner.max_decoding_message_size(limit);
        self
    }

    /// Reads `key` (and the range `options` give).
    ///
    /// # Errors
    /// The call's failure.
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        let request = options.unwrap_or_default().request(key);
        self.auth
            .call(
                &self.inner,
                request,
                |mut c, r| async move { c.range(r).await },
            )
            .await
    }

    /// Applies `txn` atomically.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn txn(&mut self, txn: Txn) -> Result<TxnResponse> {
        let request = txn.into_request();
        self.auth
            .call(
                &self.inner,
                request,
                |mut c, r| async move { c.txn(r).await },
            )
            .await
    }
}

/// The Lease service of a [`Client`].
#[derive(Clone)]
pub struct LeaseClient {
    inner: PbLeaseClient<Link>,
    auth: Arc<Auth>,
}

impl LeaseClient {
    /// Grants an etcd lease of `ttl` seconds, its id chosen by etcd.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn grant(&mut self, ttl: i64) -> Result<LeaseGrantResponse> {
        let request = pb::LeaseGrantRequest { ttl, id: 0 };
        self.auth
            .call(&self.inner, request, |mut c, r| async move {
                c.lease_grant(r).await
            })
            .await
    }

    /// The seconds etcd lease `id` has left as the leader counts them (-1: expired or
    /// unknown).
    ///
    /// # Errors
    /// The call's failure.
    pub async fn time_to_live(&mut self, id: i64) -> Result<LeaseTimeToLiveResponse> {
        let request = pb::LeaseTimeToLiveRequest { id, keys: false };
        self.auth
            .call(&self.inner, request, |mut c, r| async move {
                c.lease_time_to_live(r).await
            })
            .await
    }
}

/// The Maintenance service of a [`Client`].
#[derive(Clone)]
pub struct MaintenanceClient {
    inner: PbMaintenanceClient<Link>,
    auth: Arc<Auth>,
}

impl MaintenanceClient {
    /// The status of the member this client's connection reaches.
    ///
    /// # Errors
    /// The call's failure.
    pub async fn status(&mut self) -> Result<StatusResponse> {
        self.auth
            .call(&self.inner, pb::StatusRequest {}, |mut c, r| async move {
                c.status(r).await
            })
            .await
    }
}

impl pb::LeaseGrantResponse {
    /// The lease's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The lease's TTL in seconds, as granted.
    pub fn ttl(&self) -> i64 {
        self.ttl
    }

    /// Why etcd could not grant it (empty when granted).
    pub fn error(&self) -> &str {
        &self.error
    }
}

impl pb::LeaseTimeToLiveResponse {
    /// The seconds the lease has left (-1: expired or unknown).
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

impl pb::StatusResponse {
    /// The header, absent only from a malformed answer.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The member's highest committed Raft index.
    pub fn raft_index(&self) -> u64 {
        self.raft_index
    }
}

impl v3lockpb::LockResponse {
    /// The key that holds the lock: the name, a slash, the lease id in hex.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = "pw-never-shown-7d1f";

    #[tokio::test]
    async fn a_failed_authentication_never_shows_the_password() {
        // A port nothing listens on: Authenticate fails at the transport.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let options = ConnectOptions::new()
            .with_user("root", PASSWORD)
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_millis(500));
        assert!(!format!("{options:?}").contains(PASSWORD));
        let err = Client::connect([format!("http://127.0.0.1:{port}")], Some(options))
            .await
            .expect_err("nothing listens there");
        for shown in [format!("{err}"), format!("{err:?}")] {
            assert!(!shown.contains(PASSWORD), "{shown}");
        }
        // As etcd refuses a wrong password.
        let refused = Error::from(Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        ));
        for shown in [format!("{refused}"), format!("{refused:?}")] {
            assert!(!shown.contains(PASSWORD), "{shown}");
        }
    }

    #[tokio::test]
    async fn endpoints_are_checked_before_any_call() {
        let none: [&str; 0] = [];
        assert!(matches!(
            Client::connect(none, None).await,
            Err(Error::InvalidArgs(_))
        ));
        assert!(matches!(
            Client::connect(["http://bad host:1"], None).await,
            Err(Error::InvalidUri(_))
        ));
        assert!(matches!(
            Client::connect(["ftp://h:1"], None).await,
            Err(Error::InvalidUri(_))
        ));
        #[cfg(not(feature = "tls"))]
        assert!(matches!(
            Client::connect(["https://h:1"], None).await,
            Err(Error::InvalidArgs(_))
        ));
        let client = Client::connect(["h:1"], None).await.unwrap();
        assert!(!format!("{client:?}").is_empty());
    }

    #[test]
    fn the_metadata_holds_the_token_and_asks_for_a_leader() {
        use tonic::service::Interceptor;
        let token = Token::default();
        *token.write().unwrap() = Some(AsciiMetadataValue::from_static("t0k"));
        let mut with = Metadata {
            token: Some(token.clone()),
            require_leader: true,
        };
        let request = with.call(Request::new(())).unwrap();
        assert_eq!(request.metadata().get(TOKEN).unwrap(), "t0k");
        assert_eq!(request.metadata().get(HAS_LEADER).unwrap(), "true");
        let mut without = Metadata {
            token: None,
            require_leader: false,
        };
        let request = without.call(Request::new(())).unwrap();
        assert!(request.metadata().get(TOKEN).is_none());
        assert!(request.metadata().get(HAS_LEADER).is_none());
    }
}
