//! One script call on one connection, as it goes on the wire: `EVALSHA` (loading the script on
//! `NOSCRIPT`), alone or in a pipeline with a barrier write and `WAIT`, on a direct or a
//! Cluster connection (there, on the master that serves the namespace's slot).

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, Value};

use crate::call::{Call, Lua};

/// One connection: to one server, or a Cluster connection (one per node, routed by slot).
#[derive(Clone)]
pub(crate) enum Conn {
    Direct(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn query(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            Conn::Direct(conn) => cmd.query_async(conn).await,
            Conn::Cluster(conn) => cmd.query_async(conn).await,
        }
    }

    /// Loads `script` (`SCRIPT LOAD`) on the server, or on a Cluster on the master serving
    /// `key` only: the driver would send it to every master, and one dead master elsewhere
    /// would fail a call that never needed it.
    pub(crate) async fn load(&mut self, script: &Lua, key: &str) -> redis::RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script.source());
        match self {
            Conn::Direct(conn) => load.query_async::<Value>(conn).await.map(drop),
            Conn::Cluster(conn) => on_home_node(conn, load, key)
                .await?
                .extract_error()
                .map(drop),
        }
    }

    /// Sends `pipe` as one unit on one connection (on a Cluster, to the master serving
    /// `key`), and returns one value per command, errors included as values.
    pub(crate) async fn pipeline(
        &mut self,
        pipe: Pipeline,
        key: &str,
    ) -> redis::RedisResult<Vec<Value>> {
        let count = pipe.len();
        match self {
            Conn::Direct(conn) => conn.req_packed_commands(&pipe, 0, count).await,
            Conn::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                conn.route_pipeline(pipe, 0, count, SingleNodeRoutingInfo::SpecificNode(route))
                    .await
            }
        }
    }
}

/// Runs `call` (`EVALSHA`, loading the script on `NOSCRIPT`).
pub(crate) async fn eval(
    conn: &mut Conn,
    call: &Call<'_>,
    home: &str,
) -> redis::RedisResult<Value> {
    let cmd = call.cmd();
    match conn.query(&cmd).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            conn.load(call.script(), home).await?;
            conn.query(&cmd).await
        }
        other => other,
    }
}

/// Runs `call`, then `INCR barrier`, then `WAIT wanted timeout_ms`, as one pipeline; returns
/// the script's value and the number of replicas that acknowledged.
pub(crate) async fn eval_acked(
    conn: &mut Conn,
    call: &Call<'_>,
    barrier: &str,
    wanted: u32,
    timeout_ms: u64,
) -> redis::RedisResult<(Value, i64)> {
    let mut loaded = false;
    loop {
        let mut pipe = redis::pipe();
        pipe.add_command(call.cmd())
            .cmd("INCR")
            .arg(barrier)
            .cmd("WAIT")
            .arg(wanted)
            .arg(timeout_ms);
        let values = conn.pipeline(pipe, barrier).await?;
        let [script, barrier_reply, wait]: [Value; 3] = values.try_into().map_err(|v| {
            redis::RedisError::from((
                redis::ErrorKind::Parse,
                "expected three replies to script, INCR, WAIT",
                format!("{v:?}"),
            ))
        })?;
        let script = match script.extract_error() {
            Err(e)
                if !loaded
                    && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // The script did not run; the barrier and WAIT that followed are harmless.
                conn.load(call.script(), barrier).await?;
                loaded = true;
                continue;
            }
            other => other?,
        };
        barrier_reply.extract_error()?;
        let acked = match wait.extract_error()? {
            Value::Int(n) => n,
            other => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "expected a count of replicas from WAIT",
                    format!("{other:?}"),
                )))
            }
        };
        return Ok((script, acked));
    }
}

/// Runs `cmd` on the Cluster master that serves `key`'s slot.
pub(crate) async fn on_home_node(
    conn: &mut ClusterConnection,
    cmd: Cmd,
    key: &str,
) -> redis::RedisResult<Value> {
    let route = Route::with_key(key, SlotAddr::Master);
    conn.route_command(
        cmd,
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
    )
    .await
}
