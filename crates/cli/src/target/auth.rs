//! `pollux target`'s DH-HMAC-CHAP flags: `--dhchap-key FILE` and
//! `--dhchap-ctrl-key FILE` give the `--host` before them its key (and
//! the controller's, for bidirectional authentication), read as SPDK's
//! `keyring_file_add_key` reads a key (a DHHC-1 secret in a file only its
//! owner may access); `--dhchap-digests` and `--dhchap-dhgroups` restrict
//! what the target offers (SPDK's `nvmf_set_config` names);
//! `--dhchap-dh-threads` sizes the DH worker pool.
use std::path::{Path, PathBuf};

use clap::{ArgMatches, Args};
use pollux_nvmf::{
    names_to_mask, HostKeys, KeyFile, SubsystemConfig, TargetConfig, DHGROUPS, DIGESTS,
};

use crate::common::opts::BadOption;

fn bad(option: &'static str, value: impl std::fmt::Display, why: impl Into<String>) -> BadOption {
    BadOption::new(option, value, why)
}

#[derive(Args, Debug, Clone, Default)]
pub struct DhchapArgs {
    /// DH-HMAC-CHAP: the preceding --host must authenticate with the
    /// DHHC-1 secret in FILE (as `nvme gen-dhchap-key` writes it; the file
    /// readable by its owner only).
    #[arg(long = "dhchap-key", value_name = "FILE")]
    pub dhchap_key: Vec<String>,
    /// DH-HMAC-CHAP, bidirectional: the controller proves itself to the
    /// preceding --host with the DHHC-1 secret in FILE (needs
    /// --dhchap-key).
    #[arg(long = "dhchap-ctrl-key", value_name = "FILE")]
    pub dhchap_ctrl_key: Vec<String>,
    /// DH-HMAC-CHAP digests offered, comma-separated (default all:
    /// sha256,sha384,sha512).
    #[arg(long = "dhchap-digests", value_name = "LIST")]
    pub dhchap_digests: Option<String>,
    /// DH-HMAC-CHAP DH groups offered, comma-separated (default all:
    /// null,ffdhe2048,ffdhe3072,ffdhe4096,ffdhe6144,ffdhe8192).
    #[arg(long = "dhchap-dhgroups", value_name = "LIST")]
    pub dhchap_dhgroups: Option<String>,
    /// DH-HMAC-CHAP: threads that compute the Diffie-Hellman values
    /// (off the reactor threads; JSON `nvmf_set_config`
    /// `dhchap_dh_threads`; default 1).
    #[arg(long = "dhchap-dh-threads", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=pollux_nvmf::MAX_DH_THREADS as i64))]
    pub dhchap_dh_threads: Option<u32>,
    /// --host, --dhchap-key and --dhchap-ctrl-key in command-line order
    /// (from the parser's matches: `record_order`).
    #[arg(skip)]
    pub order: Vec<(usize, Flag, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    Host,
    Key,
    CtrlKey,
}

impl DhchapArgs {
    /// Records where each --host, --dhchap-key and --dhchap-ctrl-key
    /// stands on the command line (`m`: the `target` subcommand's
    /// matches), so each key goes to the --host before it.
    pub fn record_order(&mut self, m: &ArgMatches) {
        self.order.clear();
        for (id, flag) in [
            ("host", Flag::Host),
            ("dhchap_key", Flag::Key),
            ("dhchap_ctrl_key", Flag::CtrlKey),
        ] {
            let (Some(ix), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) else {
                continue;
            };
            self.order
                .extend(ix.zip(vals).map(|(i, v)| (i, flag, v.clone())));
        }
        self.order.sort_by_key(|(i, _, _)| *i);
    }

    /// The keys given: any --dhchap-* flag.
    pub fn any_key(&self) -> bool {
        !self.dhchap_key.is_empty() || !self.dhchap_ctrl_key.is_empty()
    }

    /// Applies the digests and DH groups to `cfg`.
    pub fn apply_options(&self, cfg: &mut TargetConfig) -> Result<(), BadOption> {
        if let Some(v) = &self.dhchap_digests {
            cfg.auth.digests =
                names_to_mask(&DIGESTS, v.split(',')).map_err(|e| bad("--dhchap-digests", v, e))?;
        }
        if let Some(v) = &self.dhchap_dhgroups {
            cfg.auth.dhgroups = names_to_mask(&DHGROUPS, v.split(','))
                .map_err(|e| bad("--dhchap-dhgroups", v, e))?;
        }
        if let Some(n) = self.dhchap_dh_threads {
            cfg.auth.dh_threads = n;
        }
        Ok(())
    }

    /// Puts the hosts' keys into `cfg`'s keyring (named `key<N>` and
    /// `ckey<N>`, N the host's place among the --host flags) and into
    /// subsystem `s`.
    pub fn apply_keys(
        &self,
        cfg: &mut TargetConfig,
        s: &mut SubsystemConfig,
    ) -> Result<(), BadOption> {
        if !self.any_key() {
            return Ok(());
        }
        let mut order = self.order.clone();
        if order.is_empty() {
            // Not parsed from a command line (no positions): refuse
            // rather than guess.
            return Err(bad(
                "--dhchap-key",
                "",
                "the key flags' positions are unknown",
            ));
        }
        let mut host: Option<(usize, String)> = None;
        let mut n = 0;
        let mut entries: Vec<HostKeys> = Vec::new();
        for (_, flag, v) in order.drain(..) {
            let (option, ctrl) = match flag {
                Flag::Host => {
                    host = Some((n, v));
                    n += 1;
                    continue;
                }
                Flag::Key => ("--dhchap-key", false),
                Flag::CtrlKey => ("--dhchap-ctrl-key", true),
            };
            let Some((k, h)) = &host else {
                return Err(bad(
                    option,
                    &v,
                    "comes before any --host (it applies to the --host before it)",
                ));
            };
            let name = format!("{}{k}", if ctrl { "ckey" } else { "key" });
            let path = absolute(Path::new(&v)).map_err(|e| bad(option, &v, e))?;
            let key = KeyFile::load(&name, &path).map_err(|e| bad(option, &v, e.to_string()))?;
            let e = match entries.iter_mut().find(|e| &e.host == h) {
                Some(e) => e,
                None => {
                    entries.push(HostKeys {
                        host: h.clone(),
                        key: String::new(),
                        ctrlr_key: None,
                    });
                    entries.last_mut().expect("just pushed")
                }
            };
            let twice = if ctrl {
                e.ctrlr_key.replace(name.clone()).is_some()
            } else {
                !std::mem::replace(&mut e.key, name.clone()).is_empty()
            };
            if twice {
                return Err(bad(option, &v, format!("a second one for --host {h}")));
            }
            cfg.keyring
                .add(key)
                .map_err(|e| bad(option, &v, e.to_string()))?;
        }
        for e in &entries {
            if e.key.is_empty() {
                return Err(bad(
                    "--dhchap-ctrl-key",
                    &e.host,
                    "a controller key needs a host key (--dhchap-key) for the same --host",
                ));
            }
        }
        s.host_keys = entries;
        Ok(())
    }
}

/// `p` made absolute against the working directory.
fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .map_err(|e| format!("the working directory: {e}"))
}
