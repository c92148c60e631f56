//! Transport IDs in SPDK's `key:value` syntax, e.g.
//! `trtype:soft backend:ram size:1GiB lbads:4096 ns:2 mdts:1 mqes:3` or
//! `trtype:pcie traddr:0000:00:01.0` or `trtype:tcp adrfam:ipv4
//! traddr:127.0.0.1 trsvcid:4420 subnqn:nqn... hostnqn:... hdgst:1 ddgst:1
//! ctrl_loss_tmo:600 reconnect_delay:10 fast_io_fail_tmo:-1`.
//!
//! NVMe/TCP takes DH-HMAC-CHAP in-band authentication keys as SPDK and
//! Linux name them: `dhchap_key:PATH` (the host's secret, a file holding
//! `DHHC-1:XX:...:` as `nvme gen-dhchap-key` writes it),
//! `dhchap_ctrlr_key:PATH` (the controller's secret: bidirectional
//! authentication), and `dhchap_digests:sha256,sha384,sha512` /
//! `dhchap_dhgroups:null,ffdhe2048,...` to restrict what is offered.
//!
//! `trtype:soft` (an emulated controller) parses into a plain
//! [`SoftTrid`], its controller limits (`mdts:`, `mqes:`) included: the
//! emulator the caller supplies (`crate::Emulator`) builds the controller
//! from all of it, so no key is dropped on the way.
use std::collections::BTreeMap;
use std::path::PathBuf;

use pollux_auth::DhchapKey;
use pollux_spec::fabrics::{DhGroupId, HashId};

/// Largest `mdts:` of an emulated controller (4 KiB << 16 = 256 MiB), the
/// emulator's own bound.
pub const MAX_MDTS: u8 = 16;

#[derive(Debug, thiserror::Error)]
pub enum TridError {
    #[error("transport ID '{0}': expected space-separated key:value pairs")]
    Syntax(String),
    #[error("transport ID: unknown trtype '{0}' (known: soft, pcie, tcp)")]
    UnknownType(String),
    #[error("transport ID: key '{key}' is not valid for trtype:{trtype}")]
    UnknownKey { key: String, trtype: &'static str },
    #[error("transport ID: bad value '{value}' for {key}: {why}")]
    BadValue {
        key: &'static str,
        value: String,
        why: String,
    },
    #[error("transport ID: trtype:{0} needs {1}")]
    Missing(&'static str, &'static str),
    /// A key given twice (which one would win is not obvious: refused).
    #[error("transport ID: key '{key}' given twice ('{first}' and '{second}'): give it once")]
    Duplicate {
        key: String,
        first: String,
        second: String,
    },
}

/// Controller limits of a `trtype:soft` transport ID; `None` keeps the
/// emulator's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoftLimits {
    /// `mdts:N`: maximum data transfer `4 KiB << N` (Identify MDTS);
    /// `mdts:0` means no limit. `0..=MAX_MDTS`.
    pub mdts: Option<u8>,
    /// `mqes:N`: CAP.MQES, 0's based: I/O queues of at most `N + 1`
    /// entries. `1..=65535`.
    pub mqes: Option<u16>,
}

impl SoftLimits {
    /// Takes `mdts` and `mqes` out of `kv`, validated.
    fn take(kv: &mut BTreeMap<String, String>) -> Result<SoftLimits, TridError> {
        let mdts = kv
            .remove("mdts")
            .map(|v| match v.parse::<u8>() {
                Ok(n) if n <= MAX_MDTS => Ok(n),
                _ => Err(TridError::BadValue {
                    key: "mdts",
                    value: v,
                    why: format!(
                        "expected 0..={MAX_MDTS} (max transfer 4 KiB << mdts; 0 = no limit)"
                    ),
                }),
            })
            .transpose()?;
        let mqes = kv
            .remove("mqes")
            .map(|v| match v.parse::<u16>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(TridError::BadValue {
                    key: "mqes",
                    value: v,
                    why: "expected 1..=65535 (0's based: queues of mqes + 1 entries)".into(),
                }),
            })
            .transpose()?;
        Ok(SoftLimits { mdts, mqes })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Null,
    Ram,
    File,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trid {
    Soft(SoftTrid),
    Pcie { traddr: String },
    Tcp(TcpTrid),
}

/// An emulated controller's transport ID (`trtype:soft`): what its
/// emulator builds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftTrid {
    /// `backend:null|ram|file` (default null).
    pub backend: Backend,
    /// `path:` of `backend:file`.
    pub path: Option<PathBuf>,
    /// `size:` of each namespace in bytes (default 1 TiB for null, 1 GiB
    /// for RAM, the file's for a file).
    pub size: u64,
    /// `lbads:512|4096`, as a shift (9 or 12).
    pub lba_shift: u8,
    /// `ns:N` namespaces, `1..=32` (default 1).
    pub namespaces: u32,
    /// `mdts:`, `mqes:`.
    pub limits: SoftLimits,
}

impl Default for SoftTrid {
    /// `trtype:soft`: one 1 TiB null namespace of 512-byte blocks.
    fn default() -> SoftTrid {
        SoftTrid {
            backend: Backend::Null,
            path: None,
            size: 1 << 40,
            lba_shift: 9,
            namespaces: 1,
            limits: SoftLimits::default(),
        }
    }
}

/// An NVMe/TCP transport ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpTrid {
    /// `adrfam:ipv4|ipv6` (default ipv4); checked against `traddr`.
    pub ipv6: bool,
    pub traddr: String,
    /// `trsvcid:` (default 4420).
    pub trsvcid: u16,
    /// `subnqn:`; None: not given (perf needs it; discover defaults to the
    /// discovery NQN).
    pub subnqn: Option<String>,
    /// `hostnqn:`; None: this machine's (`/etc/nvme/hostnqn` or derived).
    pub hostnqn: Option<String>,
    /// `hdgst:0|1`, `ddgst:0|1`.
    pub hdgst: bool,
    pub ddgst: bool,
    /// `sqflow:1`: keep SQ flow control on the I/O queues.
    pub sqflow: bool,
    /// Reconnecting, with Linux's option names, units (seconds) and
    /// defaults: `ctrl_loss_tmo:` (600; -1: forever), `reconnect_delay:`
    /// (10, at least 1), `fast_io_fail_tmo:` (-1: off).
    pub ctrl_loss_tmo: i32,
    pub reconnect_delay: u32,
    pub fast_io_fail_tmo: i32,
    /// `busy_poll:US`: `SO_BUSY_POLL` microseconds on the connections
    /// (0, the default: off).
    pub busy_poll: u32,
    /// `sock_impl:posix|uring`: how the I/O queues' sockets are driven
    /// (default posix; see `pollux_tcp::SockImpl`).
    pub sock_impl: pollux_tcp::SockImpl,
    /// With `sock_impl:uring`: `uring_direct:0|1` (PDUs parsed in the
    /// receive's provided buffers rather than copied first; default 1),
    /// `uring_rx_buffers:N` (provided buffers per connection, a power of
    /// two; default 64), `uring_rx_buffer_size:BYTES` (default 16384, at
    /// most 262144).
    pub uring: pollux_tcp::UringOptions,
    /// `dhchap_key:PATH`: the host's DH-HMAC-CHAP secret (DHHC-1 file),
    /// read by [`TcpTrid::options`].
    pub dhchap_key: Option<PathBuf>,
    /// `dhchap_ctrlr_key:PATH`: the controller's secret (bidirectional
    /// authentication); needs `dhchap_key:`.
    pub dhchap_ctrlr_key: Option<PathBuf>,
    /// `dhchap_digests:` (comma separated; empty: all).
    pub dhchap_digests: Vec<HashId>,
    /// `dhchap_dhgroups:` (comma separated; empty: all).
    pub dhchap_dhgroups: Vec<DhGroupId>,
}

/// Linux's defaults (drivers/nvme/host/fabrics.h: NVMF_DEF_CTRL_LOSS_TMO,
/// NVMF_DEF_RECONNECT_DELAY, NVMF_DEF_FAIL_FAST_TMO).
pub const DEF_CTRL_LOSS_TMO: i32 = 600;
pub const DEF_RECONNECT_DELAY: u32 = 10;
pub const DEF_FAST_IO_FAIL_TMO: i32 = -1;

impl TcpTrid {
    /// The transport's options (`subnqn` given or `default_subnqn`).
    pub fn options(
        &self,
        default_subnqn: Option<&str>,
    ) -> Result<pollux_tcp::TcpOptions, TridError> {
        let ip: std::net::IpAddr = self.traddr.parse().map_err(|_| TridError::BadValue {
            key: "traddr",
            value: self.traddr.clone(),
            why: "expected an IP address".into(),
        })?;
        let subnqn = match (&self.subnqn, default_subnqn) {
            (Some(s), _) => s.clone(),
            (None, Some(d)) => d.to_string(),
            (None, None) => return Err(TridError::Missing("tcp", "subnqn:")),
        };
        let mut o =
            pollux_tcp::TcpOptions::new(std::net::SocketAddr::new(ip, self.trsvcid), &subnqn);
        if let Some(h) = &self.hostnqn {
            o.hostnqn = h.clone();
        }
        o.digests = pollux_spec::tcp::Digests {
            header: self.hdgst,
            data: self.ddgst,
        };
        o.sq_flow = self.sqflow;
        let secs = |s: i32| (s >= 0).then(|| std::time::Duration::from_secs(s as u64));
        o.ctrl_loss_tmo = secs(self.ctrl_loss_tmo);
        o.reconnect_delay = std::time::Duration::from_secs(self.reconnect_delay as u64);
        o.fast_io_fail_tmo = secs(self.fast_io_fail_tmo);
        o.busy_poll_us = self.busy_poll;
        o.sock_impl = self.sock_impl;
        o.uring = self.uring;
        let key = |k: &'static str, p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| {
                    DhchapKey::from_file(p).map_err(|e| TridError::BadValue {
                        key: k,
                        value: p.display().to_string(),
                        why: e.to_string(),
                    })
                })
                .transpose()
        };
        o.auth.key = key("dhchap_key", &self.dhchap_key)?;
        o.auth.ctrl_key = key("dhchap_ctrlr_key", &self.dhchap_ctrlr_key)?;
        o.auth.digests = self.dhchap_digests.clone();
        o.auth.dhgroups = self.dhchap_dhgroups.clone();
        Ok(o)
    }
}

/// A number of seconds of `key` in `min..=86400 * 365`.
fn seconds(
    kv: &mut BTreeMap<String, String>,
    key: &'static str,
    min: i64,
    default: i64,
    why: &str,
) -> Result<i64, TridError> {
    let Some(v) = kv.remove(key) else {
        return Ok(default);
    };
    match v.parse::<i64>() {
        Ok(n) if (min..=86400 * 365).contains(&n) => Ok(n),
        _ => Err(TridError::BadValue {
            key,
            value: v,
            why: why.into(),
        }),
    }
}

fn parse_tcp(kv: &mut BTreeMap<String, String>) -> Result<TcpTrid, TridError> {
    let flag = |kv: &mut BTreeMap<String, String>, key: &'static str| -> Result<bool, TridError> {
        match kv.remove(key).as_deref() {
            None | Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(o) => Err(TridError::BadValue {
                key,
                value: o.into(),
                why: "expected 0 or 1".into(),
            }),
        }
    };
    let traddr = kv
        .remove("traddr")
        .ok_or(TridError::Missing("tcp", "traddr:"))?;
    let ipv6 = match kv
        .remove("adrfam")
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("ipv4") => false,
        Some("ipv6") => true,
        Some(o) => {
            return Err(TridError::BadValue {
                key: "adrfam",
                value: o.into(),
                why: "expected ipv4 or ipv6".into(),
            })
        }
    };
    let ip: std::net::IpAddr = traddr.parse().map_err(|_| TridError::BadValue {
        key: "traddr",
        value: traddr.clone(),
        why: format!("expected an IPv{} address", if ipv6 { 6 } else { 4 }),
    })?;
    if ip.is_ipv6() != ipv6 {
        return Err(TridError::BadValue {
            key: "traddr",
            value: traddr,
            why: format!(
                "is not an IPv{} address (adrfam:{})",
                if ipv6 { 6 } else { 4 },
                if ipv6 { "ipv6" } else { "ipv4" }
            ),
        });
    }
    let trsvcid = match kv.remove("trsvcid") {
        None => pollux_spec::tcp::DEFAULT_PORT,
        Some(v) => match v.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(TridError::BadValue {
                    key: "trsvcid",
                    value: v,
                    why: "expected a TCP port 1..=65535".into(),
                })
            }
        },
    };
    let mut nqn = |key: &'static str| -> Result<Option<String>, TridError> {
        kv.remove(key)
            .map(|v| match pollux_spec::fabrics::check_nqn(&v) {
                Ok(()) => Ok(v),
                Err(e) => Err(TridError::BadValue {
                    key,
                    value: v,
                    why: e.to_string(),
                }),
            })
            .transpose()
    };
    let subnqn = nqn("subnqn")?;
    let hostnqn = nqn("hostnqn")?;
    let hdgst = flag(kv, "hdgst")?;
    let ddgst = flag(kv, "ddgst")?;
    let sqflow = flag(kv, "sqflow")?;
    let ctrl_loss_tmo = seconds(
        kv,
        "ctrl_loss_tmo",
        -1,
        DEF_CTRL_LOSS_TMO as i64,
        "expected seconds (-1: reconnect forever)",
    )? as i32;
    let reconnect_delay = seconds(
        kv,
        "reconnect_delay",
        1,
        DEF_RECONNECT_DELAY as i64,
        "expected seconds, at least 1",
    )? as u32;
    let fast_io_fail_tmo = seconds(
        kv,
        "fast_io_fail_tmo",
        -1,
        DEF_FAST_IO_FAIL_TMO as i64,
        "expected seconds (-1: off, I/O held until reconnected)",
    )? as i32;
    let busy_poll = match kv.remove("busy_poll") {
        None => 0,
        Some(v) => {
            v.parse::<u32>()
                .ok()
                .filter(|&n| n <= 1_000_000)
                .ok_or(TridError::BadValue {
                    key: "busy_poll",
                    value: v,
                    why: "expected microseconds, 0..=1000000".into(),
                })?
        }
    };
    let sock_impl = match kv.remove("sock_impl") {
        None => pollux_tcp::SockImpl::default(),
        Some(v) => pollux_tcp::SockImpl::from_name(&v).ok_or(TridError::BadValue {
            key: "sock_impl",
            value: v,
            why: "expected posix or uring".into(),
        })?,
    };
    let mut uring = pollux_tcp::UringOptions::default();
    match kv.remove("uring_direct").as_deref() {
        None | Some("1") => {}
        Some("0") => uring.direct = false,
        Some(o) => {
            return Err(TridError::BadValue {
                key: "uring_direct",
                value: o.into(),
                why: "expected 0 or 1".into(),
            })
        }
    }
    if let Some(v) = kv.remove("uring_rx_buffers") {
        uring.rx_buffers = v
            .parse::<u16>()
            .ok()
            .filter(|n| n.is_power_of_two() && *n <= 32768)
            .ok_or(TridError::BadValue {
                key: "uring_rx_buffers",
                value: v,
                why: "expected a power of two, 1..=32768".into(),
            })?;
    }
    if let Some(v) = kv.remove("uring_rx_buffer_size") {
        let max = pollux_tcp::RX_BUFFER_SIZE_MAX;
        uring.rx_buffer_size = v
            .parse::<u32>()
            .ok()
            .filter(|n| (512..=max).contains(n))
            .ok_or(TridError::BadValue {
                key: "uring_rx_buffer_size",
                value: v,
                why: format!("expected bytes, 512..={max}"),
            })?;
    }
    let dhchap_key = kv.remove("dhchap_key").map(PathBuf::from);
    let dhchap_ctrlr_key = kv.remove("dhchap_ctrlr_key").map(PathBuf::from);
    if dhchap_ctrlr_key.is_some() && dhchap_key.is_none() {
        return Err(TridError::Missing(
            "tcp with dhchap_ctrlr_key:",
            "dhchap_key: (bidirectional authentication needs the host's key too)",
        ));
    }
    let dhchap_digests = list(
        kv,
        "dhchap_digests",
        HashId::from_name,
        "sha256, sha384, sha512",
    )?;
    let dhchap_dhgroups = list(
        kv,
        "dhchap_dhgroups",
        DhGroupId::from_name,
        "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
    )?;
    if fast_io_fail_tmo >= 0 && ctrl_loss_tmo >= 0 && fast_io_fail_tmo > ctrl_loss_tmo {
        // As Linux: allowed, but the controller is given up first.
        tracing::warn!(
            "fast_io_fail_tmo ({fast_io_fail_tmo} s) is larger than ctrl_loss_tmo ({ctrl_loss_tmo} s)"
        );
    }
    if let Some(k) = kv.keys().next() {
        return Err(TridError::UnknownKey {
            key: k.clone(),
            trtype: "tcp",
        });
    }
    Ok(TcpTrid {
        ipv6,
        traddr,
        trsvcid,
        subnqn,
        hostnqn,
        hdgst,
        ddgst,
        sqflow,
        ctrl_loss_tmo,
        reconnect_delay,
        fast_io_fail_tmo,
        busy_poll,
        sock_impl,
        uring,
        dhchap_key,
        dhchap_ctrlr_key,
        dhchap_digests,
        dhchap_dhgroups,
    })
}

/// A comma-separated list of names of `key` (none repeated), each
/// turned into its id by `id`; `known` names them all for the error.
fn list<T: PartialEq>(
    kv: &mut BTreeMap<String, String>,
    key: &'static str,
    id: fn(&str) -> Option<T>,
    known: &str,
) -> Result<Vec<T>, TridError> {
    let Some(v) = kv.remove(key) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in v.split(',') {
        let bad = |why: String| TridError::BadValue {
            key,
            value: v.clone(),
            why,
        };
        let x = id(name).ok_or_else(|| bad(format!("unknown '{name}' (known: {known})")))?;
        if out.contains(&x) {
            return Err(bad(format!("'{name}' given twice")));
        }
        out.push(x);
    }
    Ok(out)
}

/// Parses sizes like `4096`, `4k`, `4KiB`, `1GiB`, `512M` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown unit '{u}' in '{s}'")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

impl std::str::FromStr for Trid {
    type Err = TridError;

    /// Parses a transport ID (the module docs show the keys).
    fn from_str(s: &str) -> Result<Self, TridError> {
        parse(s)
    }
}

/// Parses a transport ID (the module docs show the keys).
pub fn parse(s: &str) -> Result<Trid, TridError> {
    let mut kv = BTreeMap::new();
    for tok in s.split_whitespace() {
        let (k, v) = tok
            .split_once([':', '='])
            .ok_or_else(|| TridError::Syntax(s.to_string()))?;
        if k.is_empty() || v.is_empty() {
            return Err(TridError::Syntax(s.to_string()));
        }
        let key = k.to_ascii_lowercase();
        if let Some(first) = kv.get(&key) {
            return Err(TridError::Duplicate {
                first: format!("{key}:{first}"),
                key,
                second: tok.to_string(),
            });
        }
        kv.insert(key, v.to_string());
    }
    let trtype = kv
        .remove("trtype")
        .ok_or(TridError::Missing("<any>", "trtype:"))?;
    match trtype.to_ascii_lowercase().as_str() {
        "soft" => {
            let backend = match kv
                .remove("backend")
                .as_deref()
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                None | Some("null") => Backend::Null,
                Some("ram") => Backend::Ram,
                Some("file") => Backend::File,
                Some(o) => {
                    return Err(TridError::BadValue {
                        key: "backend",
                        value: o.into(),
                        why: "expected null, ram or file".into(),
                    })
                }
            };
            let path = kv.remove("path").map(PathBuf::from);
            if backend == Backend::File && path.is_none() {
                return Err(TridError::Missing("soft backend:file", "path:"));
            }
            let default_size = match backend {
                Backend::Null => 1 << 40,
                Backend::Ram => 1 << 30,
                Backend::File => 0,
            };
            let size = match kv.remove("size") {
                Some(v) => parse_size(&v).map_err(|why| TridError::BadValue {
                    key: "size",
                    value: v,
                    why,
                })?,
                None => default_size,
            };
            let lba_shift = match kv.remove("lbads").as_deref() {
                None | Some("512") | Some("9") => 9,
                Some("4096") | Some("12") => 12,
                Some(o) => {
                    return Err(TridError::BadValue {
                        key: "lbads",
                        value: o.into(),
                        why: "expected 512 or 4096".into(),
                    })
                }
            };
            let namespaces = match kv.remove("ns") {
                None => 1,
                Some(v) => match v.parse::<u32>() {
                    Ok(n @ 1..=32) => n,
                    _ => {
                        return Err(TridError::BadValue {
                            key: "ns",
                            value: v,
                            why: "expected 1..=32".into(),
                        })
                    }
                },
            };
            let limits = SoftLimits::take(&mut kv)?;
            if let Some(k) = kv.keys().next() {
                return Err(TridError::UnknownKey {
                    key: k.clone(),
                    trtype: "soft",
                });
            }
            Ok(Trid::Soft(SoftTrid {
                backend,
                path,
                size,
                lba_shift,
                namespaces,
                limits,
            }))
        }
        "pcie" => {
            let traddr = kv
                .remove("traddr")
                .ok_or(TridError::Missing("pcie", "traddr:"))?;
            if let Some(k) = kv.keys().next() {
                return Err(TridError::UnknownKey {
                    key: k.clone(),
                    trtype: "pcie",
                });
            }
            Ok(Trid::Pcie { traddr })
        }
        "tcp" => Ok(Trid::Tcp(parse_tcp(&mut kv)?)),
        o => Err(TridError::UnknownType(o.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_defaults_and_keys() {
        let t: Trid = "trtype:soft".parse().unwrap();
        assert_eq!(
            t,
            Trid::Soft(SoftTrid {
                backend: Backend::Null,
                path: None,
                size: 1 << 40,
                lba_shift: 9,
                namespaces: 1,
                limits: SoftLimits::default(),
            })
        );
        assert_eq!(t, Trid::Soft(SoftTrid::default()));
        let t: Trid = "trtype:SOFT backend:ram size:64MiB lbads:4096 ns:3"
            .parse()
            .unwrap();
        assert_eq!(
            t,
            Trid::Soft(SoftTrid {
                backend: Backend::Ram,
                path: None,
                size: 64 << 20,
                lba_shift: 12,
                namespaces: 3,
                limits: SoftLimits::default(),
            })
        );
    }

    #[test]
    fn pcie() {
        let t: Trid = "trtype:PCIe traddr:0000:00:01.0".parse().unwrap();
        assert_eq!(
            t,
            Trid::Pcie {
                traddr: "0000:00:01.0".into()
            }
        );
    }

    #[test]
    fn errors_are_clear() {
        assert!(matches!(
            "trtype:rdma".parse::<Trid>(),
            Err(TridError::UnknownType(_))
        ));
        assert!(matches!(
            "trtype:soft backend:file".parse::<Trid>(),
            Err(TridError::Missing(..))
        ));
        assert!(matches!(
            "trtype:soft lbads:1024".parse::<Trid>(),
            Err(TridError::BadValue { .. })
        ));
        assert!(matches!(
            "trtype:soft colour:blue".parse::<Trid>(),
            Err(TridError::UnknownKey { .. })
        ));
        assert!(matches!(
            "backend:null".parse::<Trid>(),
            Err(TridError::Missing(..))
        ));
        assert!(matches!(
            "trtype:soft ns:0".parse::<Trid>(),
            Err(TridError::BadValue { .. })
        ));
    }

    /// `mdts:` and `mqes:` travel in the transport ID to the emulator
    /// (the CLI's emulator applies them: its tests check the controller).
    #[test]
    fn soft_limits_are_part_of_the_trid() {
        let t = parse("trtype:soft backend:ram size:1MiB mdts:1 mqes:3").unwrap();
        let Trid::Soft(t) = t else { panic!("{t:?}") };
        assert_eq!(t.backend, Backend::Ram);
        assert_eq!(
            t.limits,
            SoftLimits {
                mdts: Some(1),
                mqes: Some(3)
            }
        );
        // Unset limits keep the emulator's defaults.
        let Trid::Soft(t) = parse("trtype:soft").unwrap() else {
            panic!()
        };
        assert_eq!(t.limits, SoftLimits::default());
        // The extremes the parser accepts.
        for (s, mdts, mqes) in [
            ("trtype:soft mdts:0 mqes:1", 0, 1),
            ("trtype:soft MDTS:16 MQES:65535", MAX_MDTS, 65535),
        ] {
            let Trid::Soft(t) = parse(s).unwrap() else {
                panic!("{s}")
            };
            assert_eq!(
                (t.limits.mdts, t.limits.mqes),
                (Some(mdts), Some(mqes)),
                "{s}"
            );
        }
    }

    #[test]
    fn soft_limit_errors_name_the_key() {
        for (s, key) in [
            ("trtype:soft mdts:17", "mdts"),
            ("trtype:soft mdts:-1", "mdts"),
            ("trtype:soft mdts:8k", "mdts"),
            ("trtype:soft mqes:0", "mqes"),
            ("trtype:soft mqes:65536", "mqes"),
            ("trtype:soft mqes:many", "mqes"),
        ] {
            match parse(s) {
                Err(e @ TridError::BadValue { key: k, .. }) => {
                    assert_eq!(k, key, "{s}");
                    let msg = e.to_string();
                    assert!(msg.contains(key), "{s}: {msg}");
                }
                other => panic!("{s}: {other:?}"),
            }
        }
        // Keys of an emulated controller only, never dropped elsewhere.
        for s in [
            "trtype:pcie traddr:0000:00:01.0 mdts:1",
            "trtype:tcp traddr:127.0.0.1 mqes:3",
        ] {
            assert!(matches!(parse(s), Err(TridError::UnknownKey { .. })), "{s}");
        }
    }

    #[test]
    fn tcp_keys() {
        let t: Trid = "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4421 subnqn:nqn.2026-01.io.pollux:a hostnqn:nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555 hdgst:1 ddgst:0 sqflow:1"
            .parse()
            .unwrap();
        let Trid::Tcp(t) = t else { panic!("{t:?}") };
        assert_eq!(t.traddr, "127.0.0.1");
        assert_eq!(t.trsvcid, 4421);
        assert_eq!(t.subnqn.as_deref(), Some("nqn.2026-01.io.pollux:a"));
        assert!(t.hostnqn.as_deref().unwrap().ends_with("555555555555"));
        assert!(t.hdgst && !t.ddgst && t.sqflow);
        let o = t.options(None).unwrap();
        assert_eq!(o.addr.to_string(), "127.0.0.1:4421");
        assert!(o.digests.header && !o.digests.data);
        // Reconnecting: Linux's defaults.
        assert_eq!(o.ctrl_loss_tmo, Some(std::time::Duration::from_secs(600)));
        assert_eq!(o.reconnect_delay, std::time::Duration::from_secs(10));
        assert_eq!(o.fast_io_fail_tmo, None);
        let Trid::Tcp(t) =
            "trtype:tcp traddr:127.0.0.1 ctrl_loss_tmo:-1 reconnect_delay:2 fast_io_fail_tmo:5"
                .parse()
                .unwrap()
        else {
            panic!()
        };
        let o = t.options(Some("nqn.2026-01.io.pollux:a")).unwrap();
        assert_eq!(o.ctrl_loss_tmo, None);
        assert_eq!(o.reconnect_delay, std::time::Duration::from_secs(2));
        assert_eq!(o.fast_io_fail_tmo, Some(std::time::Duration::from_secs(5)));
        assert_eq!(o.busy_poll_us, 0);
        // Busy polling: microseconds, bounded.
        let Trid::Tcp(t) = "trtype:tcp traddr:127.0.0.1 busy_poll:50".parse().unwrap() else {
            panic!()
        };
        assert_eq!(
            t.options(Some("nqn.2026-01.io.pollux:a"))
                .unwrap()
                .busy_poll_us,
            50
        );
        for v in ["x", "-1", "1000001"] {
            let s = format!("trtype:tcp traddr:127.0.0.1 busy_poll:{v}");
            assert!(
                matches!(
                    s.parse::<Trid>(),
                    Err(TridError::BadValue {
                        key: "busy_poll",
                        ..
                    })
                ),
                "{s}"
            );
        }
        // Socket implementation: posix by default, uring when asked, and
        // anything else refused naming the key and the value.
        assert_eq!(o.sock_impl, pollux_tcp::SockImpl::Posix);
        assert_eq!(o.uring, pollux_tcp::UringOptions::default());
        let Trid::Tcp(t) = "trtype:tcp traddr:127.0.0.1 sock_impl:uring uring_direct:0"
            .parse()
            .unwrap()
        else {
            panic!()
        };
        assert!(
            !t.options(Some("nqn.2026-01.io.pollux:a"))
                .unwrap()
                .uring
                .direct
        );
        let Trid::Tcp(t) =
            "trtype:tcp traddr:127.0.0.1 uring_rx_buffers:16 uring_rx_buffer_size:65536"
                .parse()
                .unwrap()
        else {
            panic!()
        };
        let u = t.options(Some("nqn.2026-01.io.pollux:a")).unwrap().uring;
        assert_eq!((u.rx_buffers, u.rx_buffer_size), (16, 65536));
        for (k, v) in [
            ("uring_direct", "2"),
            ("uring_rx_buffers", "48"),
            ("uring_rx_buffers", "0"),
            ("uring_rx_buffer_size", "262145"),
            ("uring_rx_buffer_size", "x"),
        ] {
            let s = format!("trtype:tcp traddr:127.0.0.1 {k}:{v}");
            match s.parse::<Trid>() {
                Err(TridError::BadValue { key, value, .. }) => {
                    assert_eq!((key, value.as_str()), (k, v))
                }
                r => panic!("{s}: {r:?}"),
            }
        }
        let Trid::Tcp(t) = "trtype:tcp traddr:127.0.0.1 sock_impl:uring"
            .parse()
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(
            t.options(Some("nqn.2026-01.io.pollux:a"))
                .unwrap()
                .sock_impl,
            pollux_tcp::SockImpl::Uring
        );
        for v in ["epoll", "URING", "io_uring"] {
            let s = format!("trtype:tcp traddr:127.0.0.1 sock_impl:{v}");
            let e = s.parse::<Trid>().unwrap_err();
            assert!(
                matches!(
                    e,
                    TridError::BadValue {
                        key: "sock_impl",
                        ..
                    }
                ),
                "{s}: {e}"
            );
            let m = e.to_string();
            assert!(
                m.contains("sock_impl")
                    && m.contains(&format!("'{v}'"))
                    && m.contains("posix or uring"),
                "{m}"
            );
        }
        // Defaults: port 4420, no digests, this machine's host NQN.
        let Trid::Tcp(t) = "trtype:TCP traddr:::1 adrfam:IPv6".parse().unwrap() else {
            panic!()
        };
        assert_eq!(
            (t.trsvcid, t.hdgst, t.ddgst, t.ipv6),
            (4420, false, false, true)
        );
        assert!(matches!(
            t.options(None),
            Err(TridError::Missing("tcp", "subnqn:"))
        ));
        assert_eq!(
            t.options(Some(pollux_spec::fabrics::DISCOVERY_NQN))
                .unwrap()
                .subnqn,
            pollux_spec::fabrics::DISCOVERY_NQN
        );
    }

    #[test]
    fn tcp_errors_name_the_key() {
        for (s, key) in [
            ("trtype:tcp traddr:127.0.0.1 hdgst:yes", "hdgst"),
            ("trtype:tcp traddr:127.0.0.1 ddgst:2", "ddgst"),
            ("trtype:tcp traddr:127.0.0.1 trsvcid:0", "trsvcid"),
            ("trtype:tcp traddr:127.0.0.1 trsvcid:http", "trsvcid"),
            ("trtype:tcp traddr:localhost", "traddr"),
            ("trtype:tcp traddr:::1", "traddr"),
            ("trtype:tcp traddr:127.0.0.1 adrfam:ib", "adrfam"),
            ("trtype:tcp traddr:127.0.0.1 subnqn:a\u{7}b", "subnqn"),
            (
                "trtype:tcp traddr:127.0.0.1 reconnect_delay:0",
                "reconnect_delay",
            ),
            (
                "trtype:tcp traddr:127.0.0.1 ctrl_loss_tmo:-2",
                "ctrl_loss_tmo",
            ),
            (
                "trtype:tcp traddr:127.0.0.1 ctrl_loss_tmo:10m",
                "ctrl_loss_tmo",
            ),
            (
                "trtype:tcp traddr:127.0.0.1 fast_io_fail_tmo:-5",
                "fast_io_fail_tmo",
            ),
        ] {
            match s.parse::<Trid>() {
                Err(e @ TridError::BadValue { key: k, .. }) => {
                    assert_eq!(k, key, "{s}");
                    assert!(e.to_string().contains(key), "{e}");
                }
                other => panic!("{s}: {other:?}"),
            }
        }
        assert!(matches!(
            "trtype:tcp trsvcid:4420".parse::<Trid>(),
            Err(TridError::Missing("tcp", "traddr:"))
        ));
        match "trtype:tcp traddr:127.0.0.1 colour:blue".parse::<Trid>() {
            Err(TridError::UnknownKey { key, trtype }) => {
                assert_eq!((key.as_str(), trtype), ("colour", "tcp"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    /// A key given twice is refused naming it (before, the last one won
    /// silently).
    #[test]
    fn a_key_given_twice_is_refused_naming_it() {
        for (t, key) in [
            (
                "trtype:tcp traddr:10.0.0.1 traddr:10.0.0.2 subnqn:nqn.a:b",
                "traddr",
            ),
            ("trtype:soft backend:ram size:1MiB size:2MiB", "size"),
            ("trtype:tcp trtype:pcie traddr:10.0.0.1", "trtype"),
            (
                "trtype:tcp traddr:10.0.0.1 TRSVCID=4420 trsvcid:4421",
                "trsvcid",
            ),
        ] {
            match parse(t) {
                Err(e @ TridError::Duplicate { .. }) => {
                    let m = e.to_string();
                    assert!(m.contains(&format!("key '{key}' given twice")), "{t}: {m}");
                }
                other => panic!("{t}: {other:?}"),
            }
        }
        let m = parse("trtype:tcp traddr:a traddr:b")
            .unwrap_err()
            .to_string();
        assert!(m.contains("'traddr:a' and 'traddr:b'"), "{m}");
    }

    /// subnqn: and hostnqn: are NQNs: "nqn." and at most 223 bytes.
    #[test]
    fn nqns_are_checked_where_given() {
        let base = "trtype:tcp traddr:127.0.0.1 trsvcid:4420";
        for (extra, key) in [
            ("subnqn:cnode1", "subnqn"),
            ("subnqn:nqn.2016-06.io.spdk:c hostnqn:myhost", "hostnqn"),
        ] {
            match parse(&format!("{base} {extra}")) {
                Err(TridError::BadValue { key: k, why, .. }) => {
                    assert_eq!(k, key);
                    assert!(why.contains("nqn."), "{why}");
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
        let long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(204));
        match parse(&format!("{base} subnqn:{long}")) {
            Err(TridError::BadValue { key, why, .. }) => {
                assert_eq!(key, "subnqn");
                assert!(why.contains("224") && why.contains("223"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let ok = format!(
            "{base} subnqn:nqn.2014-08.org.nvmexpress.discovery hostnqn:nqn.2014-08.org.nvmexpress:uuid:3d1219c7-c4c5-404a-aa1f-6d2a48adfda4"
        );
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn dhchap_keys() {
        let dir = std::env::temp_dir().join(format!("pollux-trid-dhchap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hk = dir.join("host.key");
        let ck = dir.join("ctrl.key");
        std::fs::write(
            &hk,
            "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n",
        )
        .unwrap();
        std::fs::write(
            &ck,
            "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        )
        .unwrap();
        let base = "trtype:tcp traddr:127.0.0.1 subnqn:nqn.2026-01.io.pollux:a";
        let Trid::Tcp(t) = parse(&format!(
            "{base} dhchap_key:{} dhchap_ctrlr_key:{} dhchap_digests:sha512,sha256 dhchap_dhgroups:ffdhe3072,null",
            hk.display(),
            ck.display()
        ))
        .unwrap() else {
            panic!("tcp")
        };
        assert_eq!(t.dhchap_digests, vec![HashId::Sha512, HashId::Sha256]);
        assert_eq!(
            t.dhchap_dhgroups,
            vec![DhGroupId::Ffdhe3072, DhGroupId::Null]
        );
        let o = t.options(None).unwrap();
        let key = o.auth.key.as_ref().expect("host key");
        assert_eq!(key.transform_hash(), Some(HashId::Sha256));
        assert_eq!(
            o.auth.ctrl_key.as_ref().expect("ctrl key").transform_hash(),
            None
        );
        assert_eq!(o.auth.digests, t.dhchap_digests);
        // No keys: no authentication settings.
        let Trid::Tcp(t) = parse(base).unwrap() else {
            panic!("tcp")
        };
        let o = t.options(None).unwrap();
        assert!(o.auth.key.is_none() && o.auth.ctrl_key.is_none() && o.auth.digests.is_empty());
        // The controller's key needs the host's.
        let e = parse(&format!("{base} dhchap_ctrlr_key:{}", ck.display())).unwrap_err();
        assert!(e.to_string().contains("dhchap_key:"), "{e}");
        for (extra, want) in [
            ("dhchap_digests:sha1", "unknown 'sha1'"),
            ("dhchap_digests:sha256,sha256", "given twice"),
            ("dhchap_dhgroups:ffdhe1024", "unknown 'ffdhe1024'"),
        ] {
            let e = parse(&format!("{base} {extra}")).unwrap_err();
            assert!(e.to_string().contains(want), "{extra}: {e}");
        }
        // A key file that is missing or not DHHC-1: named with the key.
        std::fs::write(
            &ck,
            "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaS:",
        )
        .unwrap();
        for (k, path, want) in [
            (
                "dhchap_key",
                dir.join("missing"),
                "reading DH-HMAC-CHAP key file",
            ),
            ("dhchap_key", ck.clone(), "CRC-32"),
        ] {
            let Trid::Tcp(t) = parse(&format!("{base} {k}:{}", path.display())).unwrap() else {
                panic!("tcp")
            };
            let e = t.options(None).unwrap_err();
            let s = e.to_string();
            assert!(s.contains(k) && s.contains(want), "{s}");
            assert!(!s.contains("AAECAwQF"), "the secret is never printed: {s}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
