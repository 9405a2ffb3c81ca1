//! A real network partition between worker A and the database.
//!
//! A reaches the server through its own loopback address (127.0.0.2) while B uses 127.0.0.3.
//! As root with `iptables`, a DROP rule on A's address and the server's port cuts A alone, in the
//! kernel: packets in flight are dropped and retransmitted by TCP after the heal. Otherwise the
//! fallback is a TCP proxy on 127.0.0.2 that holds bytes in black-hole mode and delivers them
//! after the heal. Under `CI` the iptables mechanism is required. Rules are removed on drop,
//! which runs on panic too, and stale rules from a killed earlier run are removed first.

use std::process::Command;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::is_root;

/// A's loopback address.
pub(crate) const A_HOST: &str = "127.0.0.2";
/// B's (and the test's) loopback address.
pub(crate) const B_HOST: &str = "127.0.0.3";
const TAG: &str = "lease-it";

/// Prints past the test harness's output capture, so every run shows which mechanism ran.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// How the partition is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Iptables,
    Proxy,
}

pub(crate) struct Partition {
    mechanism: Mechanism,
    server_port: u16,
    /// The port A connects to on [`A_HOST`]: the server's, or the proxy's.
    a_port: u16,
    cut: Arc<watch::Sender<bool>>,
    rules_installed: bool,
}

fn iptables(args: &[&str]) -> Result<(), String> {
    // -w: wait for the xtables lock that another test process may hold, instead of failing.
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run iptables: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The two rules: A's packets to the server, and the server's packets to A.
fn rules(port: u16) -> [Vec<String>; 2] {
    let port = port.to_string();
    let comment = format!("{TAG}-{}", std::process::id());
    [
        vec!["-d", A_HOST, "-p", "tcp", "--dport", &port],
        vec!["-s", A_HOST, "-p", "tcp", "--sport", &port],
    ]
    .map(|r| {
        let mut r: Vec<String> = r.into_iter().map(String::from).collect();
        r.extend(["-m", "comment", "--comment", &comment, "-j", "DROP"].map(String::from));
        r
    })
}

/// Removes rules left by an earlier run of these tests that was killed before its cleanup: those
/// whose process (the pid in their comment) is gone. Another test process's rules stay: test
/// binaries run side by side.
fn remove_stale_rules() {
    let Ok(out) = Command::new("iptables")
        .args(["-w", "-S", "INPUT"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(spec) = line.strip_prefix("-A INPUT ") else {
            continue;
        };
        let owner = spec
            .split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{TAG}-")))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = owner {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let mut args = vec!["-D", "INPUT"];
                args.extend(spec.split_whitespace());
                let _ = iptables(&args);
            }
        }
    }
}

impl Partition {
    /// Chooses the mechanism and, for the proxy, starts it. Says which one runs.
    pub(crate) async fn prepare(server_port: u16) -> Partition {
        let iptables_ok = is_root() && Command::new("iptables").arg("-V").output().is_ok();
        let mechanism = if iptables_ok {
            Mechanism::Iptables
        } else if std::env::var_os("CI").is_some() {
            panic!("the iptables partition is required in CI: run as root with iptables installed (bash scripts/test.sh installs it)");
        } else {
            Mechanism::Proxy
        };
        let cut = Arc::new(watch::Sender::new(false));
        let a_port = match mechanism {
            Mechanism::Iptables => {
                remove_stale_rules();
                server_port
            }
            Mechanism::Proxy => start_proxy(server_port, cut.clone()).await,
        };
        say(&format!(
            "partition mechanism: {mechanism:?} (A via {A_HOST}:{a_port}, B via {B_HOST})"
        ));
        Partition {
            mechanism,
            server_port,
            a_port,
            cut,
            rules_installed: false,
        }
    }

    /// Rewrites a URL on 127.0.0.1:server_port to A's route.
    pub(crate) fn a_url(&self, url_via_a: &str) -> String {
        url_via_a.replace(
            &format!("{A_HOST}:{}", self.server_port),
            &format!("{A_HOST}:{}", self.a_port),
        )
    }

    /// Cuts A off from the server.
    pub(crate) fn cut(&mut self) {
        match self.mechanism {
            Mechanism::Iptables => {
                for rule in rules(self.server_port) {
                    let mut args = vec!["-I", "INPUT"];
                    args.extend(rule.iter().map(String::as_str));
                    iptables(&args).expect("install the partition rule");
                }
                self.rules_installed = true;
            }
            Mechanism::Proxy => {
                self.cut.send_replace(true);
            }
        }
        say(&format!("partition: A cut off ({:?})", self.mechanism));
    }

    /// Reconnects A (a no-op when A is not cut off).
    pub(crate) fn heal(&mut self) {
        let was_cut = self.rules_installed || *self.cut.borrow();
        if self.rules_installed {
            for rule in rules(self.server_port) {
                let mut args = vec!["-D", "INPUT"];
                args.extend(rule.iter().map(String::as_str));
                if let Err(e) = iptables(&args) {
                    say(&format!("warning: {e}"));
                }
            }
            self.rules_installed = false;
        }
        self.cut.send_replace(false);
        if was_cut {
            say("partition: healed");
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.heal();
    }
}

/// A proxy on A's address that forwards to the server, holding bytes while cut.
async fn start_proxy(server_port: u16, cut: Arc<watch::Sender<bool>>) -> u16 {
    let listener = TcpListener::bind((A_HOST, 0))
        .await
        .expect("bind the proxy");
    let port = listener.local_addr().expect("proxy address").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)).await else {
                    return;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, cut.subscribe()));
                tokio::spawn(pump(sr, cw, cut.subscribe()));
            });
        }
    });
    port
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Black hole: hold the bytes until the partition heals, like TCP retransmission.
        while *cut.borrow_and_update() {
            if cut.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
