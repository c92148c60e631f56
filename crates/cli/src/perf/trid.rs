//! Transport IDs in SPDK's `key:value` syntax, e.g.
//! `trtype:soft backend:ram size:1GiB lbads:4096 ns:2` or
//! `trtype:pcie traddr:0000:00:01.0`.
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TridError {
    #[error("transport ID '{0}': expected space-separated key:value pairs")]
    Syntax(String),
    #[error("transport ID: unknown trtype '{0}' (known: soft, pcie)")]
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Null,
    Ram,
    File,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trid {
    Soft {
        backend: Backend,
        path: Option<PathBuf>,
        size: u64,
        lba_shift: u8,
        namespaces: u32,
    },
    Pcie {
        traddr: String,
    },
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

    fn from_str(s: &str) -> Result<Self, TridError> {
        let mut kv = BTreeMap::new();
        for tok in s.split_whitespace() {
            let (k, v) = tok
                .split_once([':', '='])
                .ok_or_else(|| TridError::Syntax(s.to_string()))?;
            if k.is_empty() || v.is_empty() {
                return Err(TridError::Syntax(s.to_string()));
            }
            kv.insert(k.to_ascii_lowercase(), v.to_string());
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
                if let Some(k) = kv.keys().next() {
                    return Err(TridError::UnknownKey {
                        key: k.clone(),
                        trtype: "soft",
                    });
                }
                Ok(Trid::Soft {
                    backend,
                    path,
                    size,
                    lba_shift,
                    namespaces,
                })
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
            o => Err(TridError::UnknownType(o.into())),
        }
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
            Trid::Soft {
                backend: Backend::Null,
                path: None,
                size: 1 << 40,
                lba_shift: 9,
                namespaces: 1
            }
        );
        let t: Trid = "trtype:SOFT backend:ram size:64MiB lbads:4096 ns:3"
            .parse()
            .unwrap();
        assert_eq!(
            t,
            Trid::Soft {
                backend: Backend::Ram,
                path: None,
                size: 64 << 20,
                lba_shift: 12,
                namespaces: 3
            }
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
            "trtype:tcp".parse::<Trid>(),
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

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
