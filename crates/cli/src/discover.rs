//! `pollux discover TRID`: reads the Discovery Log Page of an NVMe/TCP
//! discovery controller (`trtype:tcp traddr:... trsvcid:...`; `subnqn:`
//! defaults to the well-known discovery NQN) and prints its entries like
//! `nvme discover`, or as JSON.
use clap::Args;
use pollux_spec::fabrics::{adrfam, subtype, trtype, DiscoveryLogEntry, DISCOVERY_NQN};
use serde_json::json;

use crate::perf::{parse_with_limits, Trid};

#[derive(Args, Debug)]
pub struct DiscoverArgs {
    /// Transport ID, e.g. `trtype:tcp traddr:127.0.0.1 trsvcid:4420`
    /// (several words are joined).
    #[arg(required = true, num_args = 1..)]
    pub trid: Vec<String>,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Trid(#[from] crate::perf::TridError),
    #[error("transport ID '{0}': discovery needs trtype:tcp")]
    NotTcp(String),
    #[error("{0}")]
    Driver(#[from] pollux_nvme::Error),
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
    let s = a.trid.join(" ");
    let (t, _) = parse_with_limits(&s)?;
    let Trid::Tcp(t) = t else {
        return Err(DiscoverError::NotTcp(s));
    };
    let o = t.options(Some(DISCOVERY_NQN))?;
    let entries = pollux_tcp::discover(o)?;
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
