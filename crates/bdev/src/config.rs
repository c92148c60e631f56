//! Bdevs from SPDK's JSON configuration (what `spdk_tgt --json` and
//! `bdevperf -c` read, and `save_config` writes):
//!
//! ```json
//! {"subsystems": [{"subsystem": "bdev", "config": [
//!   {"method": "bdev_null_create",
//!    "params": {"name": "Null0", "num_blocks": 262144, "block_size": 4096}},
//!   {"method": "bdev_malloc_create",
//!    "params": {"name": "Malloc0", "num_blocks": 16384, "block_size": 512}}
//! ]}]}
//! ```
//!
//! # Methods
//!
//! With SPDK's parameter names (`jsonrpc.md`):
//!
//! | method | creates | parameters |
//! |---|---|---|
//! | `bdev_null_create` | [`Bdev::null`] | `name`, `num_blocks`, `block_size`, `uuid`; `md_size`, `dif_type`, `dif_pi_format` only 0, `dif_is_head_of_md` only false, `physical_block_size` only 0 or `block_size` |
//! | `bdev_malloc_create` | [`Bdev::ram`] | as null, plus `optimal_io_boundary` (accepted, ignored), `md_interleave` only false |
//! | `bdev_uring_create` | [`Bdev::uring`] (O_DIRECT, else the page cache) | `name`, `filename`, `block_size` (0 or absent: the file's), `uuid` |
//! | `bdev_nvme_attach_controller` | `<name>n<nsid>` per namespace | `name`, `trtype`, `traddr`, any other: handed to the caller |
//!
//! A later `bdev_nvme_attach_controller` of the same `name` with
//! `"multipath": "multipath"` adds a path to that controller's namespace
//! (SPDK's multipath mode); [`Entry::saved_configs`] writes such a
//! controller back as one entry per path, so it loads again.
//!
//! `name` is optional for null and malloc bdevs as in SPDK (`Null<k>` /
//! `Malloc<k>` are made up); a name used twice is an error.
//!
//! NVMe controllers are opened by the caller (this crate does not depend
//! on a transport): [`Config::create`] calls it with each
//! [`NvmeAttach`] and takes the bdevs it returns.
//!
//! # What is refused, what is ignored
//!
//! Refused with an error naming the culprit: malformed JSON (with its line
//! and column), a missing `subsystems` array or `bdev` subsystem, an
//! unknown method in the `bdev` subsystem, an unknown, missing or
//! ill-typed parameter (naming method and parameter), metadata or
//! protection information (unsupported), a duplicate bdev name.
//!
//! Ignored with a warning (logged and kept in [`Config::warnings`]): other
//! subsystems (`accel`, `sock`, `iobuf`, ...: they create no bdevs, and
//! SPDK's `save_config` writes them into every file), and the tuning
//! methods SPDK writes into the `bdev` subsystem (`*_set_options`,
//! `bdev_nvme_set_hotplug`), which have nothing to tune here.
//! `bdev_wait_for_examine` is accepted silently: bdevs here exist once
//! created, there is nothing to wait for.
use serde_json::{Map, Value};

use crate::bdev::Bdev;
use crate::local::config as local_config;
pub use crate::local::config::LocalParams;
use crate::nvme::config as nvme_config;
pub use crate::nvme::config::{multipath_mode, NvmeAttach};
pub use crate::params::ParamError;
use crate::uring::config as uring_config;
pub use crate::uring::config::UringParams;

/// The methods of the `bdev` subsystem that create bdevs.
pub const SUPPORTED_METHODS: &str =
    "bdev_null_create, bdev_malloc_create, bdev_uring_create, bdev_nvme_attach_controller";

/// The `"subsystems"` array of an SPDK JSON configuration document (the
/// shape every reader of one checks first).
pub fn subsystems(doc: &Value) -> Result<&[Value]> {
    let shape = |m: &str| ConfigError::Shape(m.to_string());
    Ok(doc
        .as_object()
        .ok_or_else(|| shape("the document is not a JSON object"))?
        .get("subsystems")
        .ok_or_else(|| shape("no \"subsystems\" array at the top level"))?
        .as_array()
        .ok_or_else(|| shape("\"subsystems\" is not an array"))?)
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("JSON configuration: {0}")]
    Json(#[from] serde_json::Error),
    /// The document is JSON but not shaped like an SPDK configuration.
    #[error("JSON configuration: {0}")]
    Shape(String),
    #[error("JSON configuration: no \"bdev\" subsystem (nothing to create)")]
    NoBdevSubsystem,
    #[error("JSON configuration: method '{method}' (bdev subsystem, entry {index}) is not supported; supported: {SUPPORTED_METHODS}")]
    UnknownMethod { method: String, index: usize },
    /// A method's parameter is unknown, missing or ill-typed.
    #[error("JSON configuration: {0}")]
    Param(#[from] ParamError),
    #[error("JSON configuration: bdev name '{0}' is used twice")]
    DuplicateName(String),
    #[error("JSON configuration: {method} '{name}': {source}")]
    Create {
        method: &'static str,
        name: String,
        #[source]
        source: crate::Error,
    },
    #[error("JSON configuration: bdev_nvme_attach_controller '{name}': {source}")]
    Attach {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// One method of the `bdev` subsystem that creates bdevs.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Null(LocalParams),
    Malloc(LocalParams),
    Uring(UringParams),
    NvmeAttach(NvmeAttach),
}

impl Entry {
    pub fn method(&self) -> &'static str {
        match self {
            Entry::Null(_) => "bdev_null_create",
            Entry::Malloc(_) => "bdev_malloc_create",
            Entry::Uring(_) => "bdev_uring_create",
            Entry::NvmeAttach(_) => "bdev_nvme_attach_controller",
        }
    }

    /// Decodes one method of the `bdev` subsystem from its `params` object:
    /// what a `-c` file's entry and the JSON-RPC method of the same name
    /// both go through. `Ok(None)`: the method creates nothing
    /// (`bdev_wait_for_examine`, SPDK's tuning methods: these push a
    /// warning). An unknown method is [`ConfigError::UnknownMethod`] with
    /// index 0.
    pub fn decode(
        method: &str,
        obj: &Map<String, Value>,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Entry>> {
        Ok(Some(match method {
            "bdev_null_create" => Entry::Null(local_config::null_create(obj)?),
            "bdev_malloc_create" => {
                let (p, boundary) = local_config::malloc_create(obj)?;
                if let Some(b) = boundary {
                    warnings.push(format!(
                        "bdev_malloc_create: optimal_io_boundary {b} ignored (requests are not split on it)"
                    ));
                }
                Entry::Malloc(p)
            }
            "bdev_uring_create" => Entry::Uring(uring_config::uring_create(obj)?),
            "bdev_nvme_attach_controller" => {
                Entry::NvmeAttach(nvme_config::attach_controller(obj)?)
            }
            "bdev_wait_for_examine" => return Ok(None),
            m if is_tuning(m) => {
                warnings.push(format!(
                    "method '{m}' ignored: it tunes SPDK's bdev layer, which pollux does not have"
                ));
                return Ok(None);
            }
            m => {
                return Err(ConfigError::UnknownMethod {
                    method: m.to_string(),
                    index: 0,
                })
            }
        }))
    }

    /// Creates this entry's bdevs (several for an NVMe controller, made by
    /// `attach` and named [`NvmeAttach::bdev_name`]): what a `-c` file's
    /// entry and the JSON-RPC method of the same name both go through.
    pub fn create<E>(
        &self,
        attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, E>,
    ) -> Result<Vec<Bdev>>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let method = self.method();
        Ok(match self {
            Entry::Null(p) | Entry::Malloc(p) => {
                let b = if matches!(self, Entry::Null(_)) {
                    Bdev::null(&p.name, p.block_size, p.num_blocks)
                } else {
                    Bdev::ram(&p.name, p.block_size, p.num_blocks)
                };
                let b = match p.uuid {
                    Some(u) => b.and_then(|b| b.with_uuid(u)),
                    None => b,
                };
                vec![b.map_err(|source| ConfigError::Create {
                    method,
                    name: p.name.clone(),
                    source,
                })?]
            }
            Entry::Uring(p) => {
                let b = p.create().and_then(|b| match p.uuid {
                    Some(u) => b.with_uuid(u),
                    None => Ok(b),
                });
                vec![b.map_err(|source| ConfigError::Create {
                    method,
                    name: p.name.clone(),
                    source,
                })?]
            }
            Entry::NvmeAttach(a) => attach(a).map_err(|e| ConfigError::Attach {
                name: a.name.clone(),
                source: e.into(),
            })?,
        })
    }

    /// The `{"method", "params"}` object that makes this entry again (what
    /// `save_config` writes). `made`: the bdevs it made; a null, malloc or
    /// uring bdev's UUID is written (SPDK's `save_config` writes it too), so
    /// a restart keeps it.
    pub fn saved_config(&self, made: &[Bdev]) -> Value {
        let uuid = |u: Option<[u8; 16]>| {
            u.or_else(|| made.first().map(|b| b.info().uuid))
                .map(|u| Value::String(crate::info::uuid_string(&u)))
        };
        let mut p = Map::new();
        match self {
            Entry::Null(l) | Entry::Malloc(l) => {
                p.insert("name".into(), l.name.clone().into());
                p.insert("num_blocks".into(), l.num_blocks.into());
                p.insert("block_size".into(), l.block_size.into());
                if let Some(u) = uuid(l.uuid) {
                    p.insert("uuid".into(), u);
                }
            }
            Entry::Uring(u) => {
                p.insert("name".into(), u.name.clone().into());
                p.insert("filename".into(), u.filename.clone().into());
                p.insert("block_size".into(), u.block_size.unwrap_or(0).into());
                if let Some(id) = uuid(u.uuid) {
                    p.insert("uuid".into(), id);
                }
            }
            Entry::NvmeAttach(a) => {
                p.insert("name".into(), a.name.clone().into());
                p.insert("trtype".into(), a.trtype.clone().into());
                if let Some(t) = &a.traddr {
                    p.insert("traddr".into(), t.clone().into());
                }
                for (k, v) in &a.params {
                    p.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::json!({ "method": self.method(), "params": p })
    }

    /// Every `{"method", "params"}` object that makes this entry again:
    /// [`Entry::saved_config`], except for an NVMe controller of several
    /// paths: one `bdev_nvme_attach_controller` per path, in order, each
    /// with `"multipath": "multipath"` (SPDK's `save_config` writes it so;
    /// [`Config::parse`] folds them together again).
    pub fn saved_configs(&self, made: &[Bdev]) -> Vec<Value> {
        match self {
            Entry::NvmeAttach(a) if !a.paths.is_empty() => a
                .each_path()
                .into_iter()
                .map(|mut p| {
                    p.params.insert("multipath".into(), "multipath".into());
                    Entry::NvmeAttach(p).saved_config(made)
                })
                .collect(),
            e => vec![e.saved_config(made)],
        }
    }

    /// The bdev's name (the controller's for NVMe).
    pub fn name(&self) -> &str {
        match self {
            Entry::Null(p) | Entry::Malloc(p) => &p.name,
            Entry::Uring(p) => &p.name,
            Entry::NvmeAttach(p) => &p.name,
        }
    }
}

/// A parsed configuration: its bdev methods in order, and what was ignored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub entries: Vec<Entry>,
    /// What was ignored (each also logged as a warning).
    pub warnings: Vec<String>,
}

/// Parses `json` and creates its bdevs; NVMe controllers are opened by
/// `attach`. See [`Config::parse`] and [`Config::create`].
pub fn load<E>(
    json: &str,
    attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, E>,
) -> Result<Vec<Bdev>>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Config::parse(json)?.create(attach)
}

/// Methods SPDK writes into the bdev subsystem that only tune SPDK itself.
fn is_tuning(method: &str) -> bool {
    method.ends_with("_set_options") || method == "bdev_nvme_set_hotplug"
}

impl Config {
    /// Parses an SPDK JSON configuration (see the module docs for what is
    /// accepted). Creates nothing.
    pub fn parse(json: &str) -> Result<Config> {
        let doc: Value = serde_json::from_str(json)?;
        let subsystems = subsystems(&doc)?;
        let mut cfg = Config::default();
        let mut found = false;
        for (i, s) in subsystems.iter().enumerate() {
            let name = s.get("subsystem").and_then(Value::as_str).ok_or_else(|| {
                ConfigError::Shape(format!("subsystems[{i}] has no \"subsystem\" name string"))
            })?;
            let config = match s.get("config") {
                None | Some(Value::Null) => &[][..],
                Some(Value::Array(a)) => a.as_slice(),
                Some(_) => {
                    return Err(ConfigError::Shape(format!(
                        "subsystem '{name}': \"config\" is not an array"
                    )))
                }
            };
            if name != "bdev" {
                if !config.is_empty() {
                    cfg.warn(format!(
                        "subsystem '{name}' ignored ({} entries): only the bdev subsystem is used",
                        config.len()
                    ));
                }
                continue;
            }
            found = true;
            for (index, e) in config.iter().enumerate() {
                if let Some(entry) = cfg.entry(index, e)? {
                    cfg.entries.push(entry);
                }
            }
        }
        if !found {
            return Err(ConfigError::NoBdevSubsystem);
        }
        cfg.merge_paths()?;
        cfg.name_and_check()?;
        Ok(cfg)
    }

    fn warn(&mut self, msg: String) {
        tracing::warn!("JSON configuration: {msg}");
        self.warnings.push(msg);
    }

    /// One entry of the bdev subsystem; None if it creates nothing.
    fn entry(&mut self, index: usize, e: &Value) -> Result<Option<Entry>> {
        let method = e.get("method").and_then(Value::as_str).ok_or_else(|| {
            ConfigError::Shape(format!(
                "bdev subsystem, entry {index}: no \"method\" string"
            ))
        })?;
        let empty = Map::new();
        let obj = match e.get("params") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(ConfigError::Shape(format!(
                    "bdev subsystem, entry {index} ({method}): \"params\" is not an object"
                )))
            }
        };
        let mut warnings = Vec::new();
        let r = Entry::decode(method, obj, &mut warnings);
        for w in warnings {
            self.warn(w);
        }
        match r {
            Err(ConfigError::UnknownMethod { method, .. }) => {
                Err(ConfigError::UnknownMethod { method, index })
            }
            r => r,
        }
    }

    /// Folds each later `bdev_nvme_attach_controller` of an earlier one's
    /// name with `"multipath": "multipath"` into the earlier one's
    /// `paths` (SPDK: the second call adds a path to the controller's
    /// namespaces). Another entry of a name already used stays (and is
    /// refused as a duplicate).
    fn merge_paths(&mut self) -> Result<()> {
        let mut out: Vec<Entry> = Vec::with_capacity(self.entries.len());
        for e in std::mem::take(&mut self.entries) {
            let Entry::NvmeAttach(a) = e else {
                out.push(e);
                continue;
            };
            let mode = nvme_config::multipath_mode(&a).map_err(|why| ConfigError::Attach {
                name: a.name.clone(),
                source: why.into(),
            })?;
            let first = out.iter_mut().find_map(|o| match o {
                Entry::NvmeAttach(f) if f.name == a.name => Some(f),
                _ => None,
            });
            match first {
                Some(f) if mode == Some(true) => f.add_path(a),
                _ => out.push(Entry::NvmeAttach(a)),
            }
        }
        self.entries = out;
        Ok(())
    }

    /// Gives unnamed null/malloc bdevs SPDK-like names and refuses
    /// duplicates (NVMe bdev names are checked when they exist).
    fn name_and_check(&mut self) -> Result<()> {
        // Controller names and bdev names are apart, as in SPDK.
        let mut used: Vec<String> = Vec::new();
        let mut ctrls: Vec<&str> = Vec::new();
        for e in &self.entries {
            let list_has = |l: &[&str], n: &str| l.contains(&n);
            let dup = match e {
                Entry::NvmeAttach(a) => {
                    let d = list_has(&ctrls, &a.name);
                    ctrls.push(&a.name);
                    d
                }
                e if e.name().is_empty() => false,
                e => {
                    let d = used.iter().any(|u| u == e.name());
                    used.push(e.name().to_string());
                    d
                }
            };
            if dup {
                return Err(ConfigError::DuplicateName(e.name().to_string()));
            }
        }
        for e in &mut self.entries {
            let (p, prefix) = match e {
                Entry::Null(p) => (p, "Null"),
                Entry::Malloc(p) => (p, "Malloc"),
                _ => continue,
            };
            if p.name.is_empty() {
                let name = (0..)
                    .map(|k| format!("{prefix}{k}"))
                    .find(|n| !used.contains(n))
                    .unwrap_or_default();
                used.push(name.clone());
                p.name = name;
            }
        }
        Ok(())
    }

    /// Whether some entry attaches an NVMe controller.
    pub fn has_nvme(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e, Entry::NvmeAttach(_)))
    }

    /// Creates the bdevs, in the configuration's order; `attach` opens each
    /// NVMe controller and returns its bdevs (named
    /// [`NvmeAttach::bdev_name`]).
    pub fn create<E>(
        &self,
        attach: &mut impl FnMut(&NvmeAttach) -> Result<Vec<Bdev>, E>,
    ) -> Result<Vec<Bdev>>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut out: Vec<Bdev> = Vec::new();
        for e in &self.entries {
            let made = e.create(attach)?;
            for b in made {
                if out.iter().any(|o| o.name() == b.name()) {
                    return Err(ConfigError::DuplicateName(b.name().to_string()));
                }
                out.push(b);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UringOptions;

    fn bdev_cfg(entries: &str) -> String {
        format!(r#"{{"subsystems":[{{"subsystem":"bdev","config":[{entries}]}}]}}"#)
    }

    fn no_nvme(_: &NvmeAttach) -> Result<Vec<Bdev>, String> {
        Err("no NVMe here".into())
    }

    fn load_local(json: &str) -> Result<Vec<Bdev>> {
        load(json, &mut no_nvme)
    }

    /// The error of a load that must fail (bdevs are not `Debug`).
    fn err(r: Result<Vec<Bdev>>, what: &str) -> ConfigError {
        match r {
            Err(e) => e,
            Ok(b) => panic!("{what}: accepted, made {} bdevs", b.len()),
        }
    }

    #[test]
    fn null_and_malloc_with_spdk_parameter_names() {
        let json = r#"{
          "subsystems": [
            {"subsystem": "accel", "config": [{"method": "accel_set_options", "params": {}}]},
            {"subsystem": "bdev", "config": [
              {"method": "bdev_set_options", "params": {"bdev_io_pool_size": 65535}},
              {"method": "bdev_null_create",
               "params": {"name": "Null0", "num_blocks": 262144, "block_size": 4096,
                          "uuid": "2b6601ba-eada-44fb-9a83-a20eb9eb9e90", "md_size": 0,
                          "dif_pi_format": 0, "physical_block_size": 4096,
                          "dif_type": 0, "dif_is_head_of_md": false}},
              {"method": "bdev_malloc_create",
               "params": {"name": "Malloc0", "num_blocks": 16384, "block_size": 512,
                          "optimal_io_boundary": 16, "md_interleave": false,
                          "dif_pi_format": 0, "physical_block_size": 512}},
              {"method": "bdev_malloc_create", "params": {"num_blocks": 8, "block_size": 512}},
              {"method": "bdev_wait_for_examine"}
            ]},
            {"subsystem": "sock", "config": null}
          ]
        }"#;
        let cfg = Config::parse(json).unwrap();
        assert_eq!(cfg.entries.len(), 3);
        assert!(!cfg.has_nvme());
        // accel, bdev_set_options, optimal_io_boundary; sock had nothing.
        assert_eq!(cfg.warnings.len(), 3, "{:?}", cfg.warnings);
        assert!(cfg.warnings[0].contains("'accel'"));
        assert!(cfg.warnings[1].contains("bdev_set_options"));
        assert!(cfg.warnings[2].contains("optimal_io_boundary"));
        let bdevs = cfg.create(&mut no_nvme).unwrap();
        let names: Vec<_> = bdevs.iter().map(|b| b.name().to_string()).collect();
        assert_eq!(names, ["Null0", "Malloc0", "Malloc1"]);
        let n = bdevs[0].info();
        assert_eq!(
            (n.backend, n.block_size, n.num_blocks),
            ("null", 4096, 262144)
        );
        assert_eq!(n.uuid_string(), "2b6601ba-eada-44fb-9a83-a20eb9eb9e90");
        let m = bdevs[1].info();
        assert_eq!((m.backend, m.block_size, m.num_blocks), ("ram", 512, 16384));
        assert_eq!(bdevs[2].info().num_blocks, 8);
    }

    #[test]
    fn nvme_attach_of_one_name_with_multipath_adds_a_path() {
        let entry = |addr: &str, mp: &str| {
            format!(
                r#"{{"method": "bdev_nvme_attach_controller",
                    "params": {{"name": "Nvme0", "trtype": "tcp", "traddr": "{addr}"{mp}}}}}"#
            )
        };
        let mp = r#", "multipath": "multipath""#;
        let json = bdev_cfg(&format!(
            "{}, {}, {}",
            entry("10.0.0.1", mp),
            r#"{"method": "bdev_null_create", "params": {"name": "n", "num_blocks": 8, "block_size": 512}}"#,
            entry("10.0.0.2", mp)
        ));
        let cfg = Config::parse(&json).unwrap();
        assert_eq!(cfg.entries.len(), 2);
        let Entry::NvmeAttach(a) = &cfg.entries[0] else {
            panic!("{:?}", cfg.entries)
        };
        assert_eq!(a.traddr.as_deref(), Some("10.0.0.1"));
        assert_eq!(a.paths.len(), 1);
        assert_eq!(a.paths[0].traddr.as_deref(), Some("10.0.0.2"));
        // The mode is this layer's: not passed on as a parameter.
        assert!(!a.params.contains_key("multipath"));
        assert!(!a.paths[0].params.contains_key("multipath"));
        // save_config writes one entry per path, each with the mode, and
        // they parse back to the same entry.
        let saved = cfg.entries[0].saved_configs(&[]);
        assert_eq!(saved.len(), 2, "{saved:?}");
        assert!(saved
            .iter()
            .all(|e| e["params"]["multipath"] == "multipath"));
        assert_eq!(saved[1]["params"]["traddr"], "10.0.0.2");
        let list: Vec<String> = saved.iter().map(Value::to_string).collect();
        let again = Config::parse(&bdev_cfg(&list.join(", "))).unwrap();
        assert_eq!(again.entries, cfg.entries[..1]);

        // Without the multipath mode (or with "disable") the name is used
        // twice.
        for second in ["", r#", "multipath": "disable""#] {
            let json = bdev_cfg(&format!(
                "{}, {}",
                entry("10.0.0.1", ""),
                entry("10.0.0.2", second)
            ));
            let e = err(Config::parse(&json).map(|_| Vec::new()), "no multipath");
            assert!(
                matches!(&e, ConfigError::DuplicateName(n) if n == "Nvme0"),
                "{e}"
            );
        }
        // SPDK's failover mode is refused, named.
        let json = bdev_cfg(&format!(
            "{}, {}",
            entry("10.0.0.1", ""),
            entry("10.0.0.2", r#", "multipath": "failover""#)
        ));
        let e = err(Config::parse(&json).map(|_| Vec::new()), "failover").to_string();
        assert!(e.contains("Nvme0") && e.contains("failover"), "{e}");
    }

    #[test]
    fn nvme_attach_goes_to_the_caller_with_its_parameters() {
        let json = bdev_cfg(
            r#"{"method": "bdev_nvme_attach_controller",
                "params": {"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:0a:00.0",
                           "prchk_reftag": false}},
               {"method": "bdev_null_create", "params": {"name": "n", "num_blocks": 8, "block_size": 512}}"#,
        );
        let cfg = Config::parse(&json).unwrap();
        assert!(cfg.has_nvme());
        let mut seen = Vec::new();
        let bdevs = cfg
            .create(&mut |a: &NvmeAttach| -> Result<Vec<Bdev>, String> {
                seen.push(a.clone());
                // Stand in for the controller's two namespaces.
                Ok(vec![
                    Bdev::null(&a.bdev_name(1), 512, 8).map_err(|e| e.to_string())?,
                    Bdev::null(&a.bdev_name(2), 512, 8).map_err(|e| e.to_string())?,
                ])
            })
            .unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].name, "Nvme0");
        assert_eq!(seen[0].trtype, "PCIe");
        assert_eq!(seen[0].traddr.as_deref(), Some("0000:0a:00.0"));
        assert_eq!(seen[0].params.len(), 1);
        assert_eq!(seen[0].params["prchk_reftag"], Value::Bool(false));
        let names: Vec<_> = bdevs.iter().map(|b| b.name().to_string()).collect();
        assert_eq!(names, ["Nvme0n1", "Nvme0n2", "n"]);

        // A controller's bdev may not take a name already used.
        let e = err(
            cfg.create(&mut |_: &NvmeAttach| -> Result<Vec<Bdev>, String> {
                Ok(vec![Bdev::null("n", 512, 8).map_err(|e| e.to_string())?])
            }),
            "clash",
        );
        assert!(
            matches!(&e, ConfigError::DuplicateName(n) if n == "n"),
            "{e}"
        );

        // The caller's refusal is reported with the controller's name.
        let e = err(Config::parse(&json).unwrap().create(&mut no_nvme), "attach");
        let msg = e.to_string();
        assert!(
            matches!(e, ConfigError::Attach { .. })
                && msg.contains("Nvme0")
                && msg.contains("no NVMe here"),
            "{msg}"
        );
    }

    #[test]
    fn errors_name_the_method_and_the_parameter() {
        let cases: &[(&str, &[&str])] = &[
            (
                r#"{"method": "bdev_null_create", "params": {"name": "a", "num_blocks": 8, "block_size": 512, "colour": 1}}"#,
                &[
                    "bdev_null_create",
                    "unknown parameter 'colour'",
                    "num_blocks",
                ],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"name": "a", "block_size": 512}}"#,
                &["bdev_null_create", "missing", "'num_blocks'"],
            ),
            (
                r#"{"method": "bdev_malloc_create", "params": {"name": "a", "num_blocks": 8}}"#,
                &["bdev_malloc_create", "'block_size'"],
            ),
            (
                r#"{"method": "bdev_malloc_create", "params": {"num_blocks": "8", "block_size": 512}}"#,
                &["bdev_malloc_create", "'num_blocks'", "\"8\""],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 8589934592}}"#,
                &["'block_size'", "0..=4294967295", "8589934592"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 512, "uuid": "nope"}}"#,
                &["'uuid'", "'nope'"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 520, "md_size": 8}}"#,
                &["'md_size'", "metadata is not supported"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 512, "dif_type": 1}}"#,
                &["'dif_type'"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 512, "dif_pi_format": 1}}"#,
                &["'dif_pi_format'"],
            ),
            (
                r#"{"method": "bdev_malloc_create", "params": {"num_blocks": 8, "block_size": 512, "md_interleave": true}}"#,
                &["'md_interleave'"],
            ),
            (
                r#"{"method": "bdev_malloc_create", "params": {"num_blocks": 8, "block_size": 512, "physical_block_size": 4096}}"#,
                &["'physical_block_size'", "4096"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"name": "", "num_blocks": 8, "block_size": 512}}"#,
                &["'name'", "empty"],
            ),
            (
                r#"{"method": "bdev_aio_create", "params": {"name": "a", "filename": "/x"}}"#,
                &[
                    "'bdev_aio_create'",
                    "entry 0",
                    "not supported",
                    "bdev_malloc_create",
                ],
            ),
            (
                r#"{"method": "bdev_uring_create", "params": {"filename": "/x"}}"#,
                &["bdev_uring_create", "'name'"],
            ),
            (
                r#"{"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0"}}"#,
                &["bdev_nvme_attach_controller", "'trtype'"],
            ),
            (
                r#"{"method": "bdev_null_create", "params": {"name": "d", "num_blocks": 8, "block_size": 512}},
                   {"method": "bdev_malloc_create", "params": {"name": "d", "num_blocks": 8, "block_size": 512}}"#,
                &["'d'", "used twice"],
            ),
            (r#"{"params": {}}"#, &["entry 0", "no \"method\""]),
            (
                r#"{"method": "bdev_null_create", "params": [1]}"#,
                &["bdev_null_create", "\"params\" is not an object"],
            ),
        ];
        for (entries, want) in cases {
            let e = err(load_local(&bdev_cfg(entries)), entries);
            let msg = e.to_string();
            for w in *want {
                assert!(msg.contains(w), "{entries}: '{msg}' lacks '{w}'");
            }
        }
    }

    #[test]
    fn bad_documents_are_refused() {
        let e = err(
            load_local("{\"subsystems\": [\n  {\"subsystem\": \"bdev\",,}]}"),
            "syntax",
        );
        assert!(matches!(e, ConfigError::Json(_)));
        assert!(e.to_string().contains("line 2"), "{e}");
        for (doc, want) in [
            ("[]", "not a JSON object"),
            ("{}", "no \"subsystems\""),
            (r#"{"subsystems": {}}"#, "not an array"),
            (r#"{"subsystems": [{"config": []}]}"#, "subsystems[0]"),
            (
                r#"{"subsystems": [{"subsystem": "bdev", "config": 3}]}"#,
                "'bdev'",
            ),
            (
                r#"{"subsystems": [{"subsystem": "accel", "config": []}]}"#,
                "no \"bdev\" subsystem",
            ),
        ] {
            let msg = err(load_local(doc), doc).to_string();
            assert!(msg.contains(want), "{doc}: {msg}");
        }
        // A bdev the backend refuses names the method and the bdev.
        let e = err(
            load_local(&bdev_cfg(
                r#"{"method": "bdev_malloc_create", "params": {"name": "odd", "num_blocks": 8, "block_size": 1000}}"#,
            )),
            "odd block size",
        );
        let msg = e.to_string();
        assert!(
            matches!(e, ConfigError::Create { .. })
                && msg.contains("bdev_malloc_create 'odd'")
                && msg.contains("1000"),
            "{msg}"
        );
        // An empty bdev subsystem is valid and creates nothing.
        assert!(
            load_local(r#"{"subsystems": [{"subsystem": "bdev", "config": []}]}"#)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn names_made_up_for_unnamed_bdevs_skip_used_ones() {
        let cfg = Config::parse(&bdev_cfg(
            r#"{"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 512}},
               {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 8, "block_size": 512}},
               {"method": "bdev_null_create", "params": {"num_blocks": 8, "block_size": 512}}"#,
        ))
        .unwrap();
        let names: Vec<_> = cfg.entries.iter().map(|e| e.name().to_string()).collect();
        assert_eq!(names, ["Null1", "Null0", "Null2"]);
    }

    #[test]
    fn uring_is_parsed() {
        let cfg = Config::parse(&bdev_cfg(
            r#"{"method": "bdev_uring_create", "params": {"name": "u", "filename": "/nonexistent/f", "block_size": 0}}"#,
        ))
        .unwrap();
        assert_eq!(
            cfg.entries[0],
            Entry::Uring(UringParams {
                name: "u".into(),
                filename: "/nonexistent/f".into(),
                block_size: None,
                uuid: None
            })
        );
        // A missing file is refused naming the method, the bdev and the file.
        let msg = err(cfg.create(&mut no_nvme), "uring").to_string();
        assert!(
            msg.contains("bdev_uring_create 'u'") && msg.contains("/nonexistent/f"),
            "{msg}"
        );
    }

    #[test]
    fn uring_bdev_on_a_file() {
        let dir = std::env::temp_dir().join(format!("pollux-config-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("disk.img");
        std::fs::write(&f, vec![0u8; 1 << 20]).unwrap();
        let json = bdev_cfg(&format!(
            r#"{{"method": "bdev_uring_create", "params": {{"name": "Uring0", "filename": "{}", "block_size": 4096,
                "uuid": "2b6601ba-eada-44fb-9a83-a20eb9eb9e90"}}}}"#,
            f.display()
        ));
        let r = load_local(&json);
        std::fs::remove_dir_all(&dir).unwrap();
        let b = match r {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        };
        let i = b[0].info();
        assert_eq!(
            (i.backend, i.block_size, i.num_blocks),
            ("uring", 4096, 256)
        );
        assert_eq!(i.uuid_string(), "2b6601ba-eada-44fb-9a83-a20eb9eb9e90");
    }

    /// tmpfs refuses O_DIRECT: the bdev opens through the page cache.
    #[test]
    fn uring_falls_back_to_the_page_cache_without_o_direct() {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        let f = shm.join(format!("pollux-config-uring-{}", std::process::id()));
        std::fs::write(&f, vec![0u8; 64 << 10]).unwrap();
        let p = UringParams {
            name: "u".into(),
            filename: f.display().to_string(),
            block_size: Some(512),
            uuid: None,
        };
        let direct = Bdev::uring(&p.name, &p.filename, UringOptions::default());
        let r = p.create();
        std::fs::remove_file(&f).unwrap();
        if direct.is_ok() {
            eprintln!("skipped: this /dev/shm takes O_DIRECT");
            return;
        }
        match r {
            Ok(b) => assert_eq!(b.info().num_blocks, 128),
            Err(e) => panic!("no fallback: {e}"),
        }
    }
}
