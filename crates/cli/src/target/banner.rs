//! What `pollux target` serves, printed once it listens: its subsystems,
//! their namespaces, listeners and hosts, and its cores.
use std::net::SocketAddr;

use pollux_nvmf::TargetConfig;
use pollux_spec::fabrics::DISCOVERY_NQN;

use crate::common::cores::fmt_cores;

/// One subsystem as the banner shows it.
pub struct SubsysLines {
    pub nqn: String,
    /// `1: Null0, 1 GiB (2097152 x 512 B)`.
    pub namespaces: Vec<String>,
    /// `any`, or the host NQNs.
    pub hosts: String,
}

/// What the banner needs of the configuration (taken before the target
/// starts with it).
pub fn subsystems(cfg: &TargetConfig) -> Vec<SubsysLines> {
    cfg.subsystems
        .iter()
        .map(|s| SubsysLines {
            nqn: s.nqn.clone(),
            namespaces: cfg
                .namespaces(s)
                .into_iter()
                .map(|(nsid, b)| {
                    let i = b.info();
                    format!(
                        "{nsid}: {}, {} ({} x {} B)",
                        i.name,
                        size(i.num_blocks.saturating_mul(i.block_size as u64)),
                        i.num_blocks,
                        i.block_size
                    )
                })
                .collect(),
            hosts: if s.allow_any_host {
                "any".into()
            } else if s.hosts.is_empty() {
                "none listed".into()
            } else {
                s.hosts.join(", ")
            },
        })
        .collect()
}

/// `1 GiB` for a whole number of a unit, else `1.5 MiB`.
fn size(n: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    for (u, s) in UNITS {
        if n >= 1 << s {
            return if n.is_multiple_of(1 << s) {
                format!("{} {u}", n >> s)
            } else {
                format!("{:.1} {u}", n as f64 / (1u64 << s) as f64)
            };
        }
    }
    format!("{n} B")
}

/// The banner's lines after "listening on" (each starts with
/// "pollux target: "): per subsystem its namespaces, listeners and
/// hosts; then discovery and the cores.
pub fn lines(
    subs: &[SubsysLines],
    listeners: &[(String, Vec<SocketAddr>)],
    cores: &[usize],
) -> Vec<String> {
    let mut out = Vec::new();
    for s in subs {
        out.push(format!("subsystem {}", s.nqn));
        if s.namespaces.is_empty() {
            out.push("  namespaces: none".into());
        }
        for ns in &s.namespaces {
            out.push(format!("  namespace {ns}"));
        }
        let addrs = listeners
            .iter()
            .find(|(n, _)| *n == s.nqn)
            .map(|(_, a)| a.iter().map(|a| a.to_string()).collect::<Vec<_>>())
            .unwrap_or_default();
        out.push(format!("  listeners: {}", addrs.join(", ")));
        out.push(format!("  hosts: {}", s.hosts));
    }
    out.push(format!("discovery: {DISCOVERY_NQN} on every listener"));
    out.push(format!(
        "cores: {} ({} thread{})",
        fmt_cores(cores),
        cores.len(),
        if cores.len() == 1 { "" } else { "s" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_units() {
        assert_eq!(size(1 << 30), "1 GiB");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(3 << 19), "1.5 MiB");
        assert_eq!(size(512), "512 B");
    }

    #[test]
    fn lines_name_every_part() {
        let subs = [SubsysLines {
            nqn: "nqn.a:b".into(),
            namespaces: vec!["1: Null0, 1 GiB (2097152 x 512 B)".into()],
            hosts: "any".into(),
        }];
        let l = lines(
            &subs,
            &[("nqn.a:b".into(), vec!["127.0.0.1:4420".parse().unwrap()])],
            &[0, 1],
        );
        assert_eq!(
            l,
            [
                "subsystem nqn.a:b",
                "  namespace 1: Null0, 1 GiB (2097152 x 512 B)",
                "  listeners: 127.0.0.1:4420",
                "  hosts: any",
                "discovery: nqn.2014-08.org.nvmexpress.discovery on every listener",
                "cores: 0-1 (2 threads)",
            ]
        );
    }
}
