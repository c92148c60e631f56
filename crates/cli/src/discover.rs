//! `pollux discover TRID`: reads the Discovery Log Page of an NVMe/TCP
//! discovery controller (`trtype:tcp traddr:... trsvcid:...`; `subnqn:`
//! defaults to the well-known discovery NQN) and prints its entries like
//! `nvme discover`, or as JSON.
//!
//! Without `trsvcid:` it connects to port 8009, the IANA NVMe/TCP
//! discovery port, as `nvme discover -t tcp` does (I/O controllers default
//! to 4420 elsewhere). `pollux target` serves its discovery controller on
//! every address it listens on (`--listen`, default 127.0.0.1:4420), so
//! when nothing answers the error says which port was tried and suggests
//! the target's.
use std::net::SocketAddr;

use clap::Args;
use pollux_spec::fabrics::{adrfam, subtype, trtype, DiscoveryLogEntry, DISCOVERY_NQN};
use pollux_spec::tcp::{DEFAULT_PORT, DISCOVERY_PORT};
use serde_json::json;

use pollux_host::{trid, TcpTrid, Trid};

#[derive(Args, Debug)]
pub struct DiscoverArgs {
    /// Transport ID, e.g. `trtype:tcp traddr:127.0.0.1 trsvcid:4420`
    /// (several words are joined; without trsvcid: port 8009, the
    /// NVMe/TCP discovery port, as nvme discover).
    #[arg(required = true, num_args = 1..)]
    pub trid: Vec<String>,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Trid(#[from] pollux_host::TridError),
    #[error("transport ID '{0}': discovery needs trtype:tcp")]
    NotTcp(String),
    #[error("{0}")]
    Connect(#[from] pollux_host::ConnectError),
    /// The connection to the discovery controller could not be set up.
    #[error("{source}; {}", unreachable_hint(addr.port(), *defaulted))]
    Unreachable {
        addr: SocketAddr,
        /// No `trsvcid:` was given (the discovery port was tried).
        defaulted: bool,
        #[source]
        source: pollux_host::ConnectError,
    },
}

/// What to try when nothing answered on `port`.
fn unreachable_hint(port: u16, defaulted: bool) -> String {
    let tried = if defaulted {
        format!(
            "no NVMe/TCP discovery controller answered on port {port} (the NVMe/TCP discovery port, tried when no trsvcid is given, as nvme discover does)"
        )
    } else {
        format!("no NVMe/TCP discovery controller answered on port {port}")
    };
    let suggest = if port == DEFAULT_PORT {
        String::new()
    } else {
        format!(", e.g. trsvcid:{DEFAULT_PORT}, its default")
    };
    format!(
        "{tried}; `pollux target` serves discovery on each address it listens on (--listen, default 127.0.0.1:{DEFAULT_PORT}; printed at start){suggest}"
    )
}

/// The discovery controller's transport ID from the words given, and
/// whether the port was defaulted (no `trsvcid:`): then it is
/// [`DISCOVERY_PORT`], not the I/O controllers' 4420.
fn discovery_trid(words: &[String]) -> Result<(TcpTrid, bool), DiscoverError> {
    let s = words.join(" ");
    let t = trid::parse(&s)?;
    let Trid::Tcp(mut t) = t else {
        return Err(DiscoverError::NotTcp(s));
    };
    // (The transport ID parser's tokens: `key:value` or `key=value`.)
    let given = s
        .split_whitespace()
        .filter_map(|w| w.split_once([':', '=']))
        .any(|(k, _)| k.eq_ignore_ascii_case("trsvcid"));
    if !given {
        t.trsvcid = DISCOVERY_PORT;
    }
    Ok((t, !given))
}

fn name(v: u8, table: &[(u8, &'static str)]) -> String {
    table
        .iter()
        .find(|(k, _)| *k == v)
        .map_or_else(|| format!("unknown ({v})"), |(_, n)| n.to_string())
}

fn fields(e: &DiscoveryLogEntry) -> [(&'static str, String); 8] {
    [
        (
            "trtype",
            name(
                e.trtype,
                &[
                    (trtype::TCP, "tcp"),
                    (trtype::RDMA, "rdma"),
                    (trtype::FC, "fc"),
                ],
            ),
        ),
        (
            "adrfam",
            name(e.adrfam, &[(adrfam::IPV4, "ipv4"), (adrfam::IPV6, "ipv6")]),
        ),
        (
            "subtype",
            name(
                e.subtype,
                &[
                    (subtype::NVM, "nvme subsystem"),
                    (subtype::DISCOVERY_REFERRAL, "discovery subsystem referral"),
                    (subtype::CURRENT_DISCOVERY, "current discovery subsystem"),
                ],
            ),
        ),
        ("treq", format!("{:#x}", e.treq)),
        ("portid", e.portid.to_string()),
        ("trsvcid", e.trsvcid_str().into_owned()),
        (
            "subnqn",
            e.subnqn()
                .map_or_else(|err| format!("(invalid: {err})"), str::to_string),
        ),
        ("traddr", e.traddr_str().into_owned()),
    ]
}

pub fn run(a: DiscoverArgs) -> Result<Vec<DiscoveryLogEntry>, DiscoverError> {
    let (t, defaulted) = discovery_trid(&a.trid)?;
    let addr = t.options(Some(DISCOVERY_NQN))?.addr;
    let entries = pollux_host::discover(&t).map_err(|source| {
        if source.is_unreachable() {
            DiscoverError::Unreachable {
                addr,
                defaulted,
                source,
            }
        } else {
            DiscoverError::Connect(source)
        }
    })?;
    if a.json {
        let list: Vec<_> = entries
            .iter()
            .map(|e| {
                let m: serde_json::Map<String, serde_json::Value> = fields(e)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect();
                serde_json::Value::Object(m)
            })
            .collect();
        println!("{}", json!({ "records": entries.len(), "entries": list }));
    } else {
        println!("\nDiscovery Log Number of Records {}", entries.len());
        for (i, e) in entries.iter().enumerate() {
            println!("=====Discovery Log Entry {i}======");
            for (k, v) in fields(e) {
                println!("{:<8} {v}", format!("{k}:"));
            }
        }
    }
    Ok(entries)
}

/// The subcommand's exit status: 0, or 2 with the error on stderr.
pub fn main(a: DiscoverArgs) -> i32 {
    match run(a) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("pollux discover: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_port_defaults_to_the_discovery_port() {
        let (t, defaulted) = discovery_trid(&words("trtype:tcp traddr:127.0.0.1")).unwrap();
        let o = t.options(Some(DISCOVERY_NQN)).unwrap();
        assert_eq!((o.addr.port(), defaulted), (8009, true));
        assert_eq!(o.subnqn, DISCOVERY_NQN);
        for (w, port) in [
            ("trtype:tcp traddr:127.0.0.1 trsvcid:4420", 4420),
            ("trtype:tcp traddr:127.0.0.1 trsvcid:8009", 8009),
            ("trtype:tcp traddr:127.0.0.1 TRSVCID=4421", 4421),
            ("trtype=tcp trsvcid=1234 traddr=::1 adrfam:ipv6", 1234),
        ] {
            let (t, defaulted) = discovery_trid(&words(w)).unwrap();
            assert_eq!((t.trsvcid, defaulted), (port, false), "{w}");
        }
        // A bad port is still refused, naming the key.
        let e = discovery_trid(&words("trtype:tcp traddr:127.0.0.1 trsvcid:0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("trsvcid"), "{e}");
    }

    /// Nobody listens: the error names the address tried and where
    /// `pollux target` listens.
    #[test]
    fn a_refused_connect_names_the_port_and_the_targets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let a = DiscoverArgs {
            trid: words(&format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port}")),
            json: false,
        };
        let e = run(a).unwrap_err();
        assert!(
            matches!(
                e,
                DiscoverError::Unreachable {
                    defaulted: false,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(e.contains(&format!("port {port}")), "{e}");
        assert!(e.contains("--listen") && e.contains("trsvcid:4420"), "{e}");
        // The defaulted port says so.
        let h = unreachable_hint(8009, true);
        assert!(
            h.contains("8009") && h.contains("no trsvcid is given") && h.contains("trsvcid:4420"),
            "{h}"
        );
        // Tried 4420 already: no suggestion of it.
        assert!(!unreachable_hint(4420, false).contains("e.g. trsvcid:4420"));
    }
}
