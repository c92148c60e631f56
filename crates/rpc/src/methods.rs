//! The method table ([`Methods`]) and parameter decoding ([`params`]).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::error::RpcError;

/// A method handler: takes the request's `params` (`None` when absent or
/// `null`) and returns the `result` or an error.
type Handler = Box<dyn Fn(Option<&Value>) -> Result<Value, RpcError> + Send + Sync + 'static>;

enum Entry {
    /// `rpc_get_methods`, answered from the table itself.
    GetMethods,
    Handler(Handler),
}

/// The methods a [`crate::Server`] answers, by name.
pub struct Methods {
    table: BTreeMap<&'static str, Entry>,
}

impl Default for Methods {
    fn default() -> Self {
        Methods::new()
    }
}

impl std::fmt::Debug for Methods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Methods")
            .field("names", &self.names())
            .finish()
    }
}

/// `rpc_get_methods`'s parameters, as SPDK's. There are no aliases and no
/// start-up state in pollux, so both only have to be well typed.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GetMethodsParams {
    #[serde(default)]
    #[allow(dead_code)]
    current: bool,
    #[serde(default)]
    #[allow(dead_code)]
    include_aliases: bool,
}

impl Methods {
    /// A table with SPDK's framework methods built in: `spdk_get_version`,
    /// `rpc_get_methods` and `framework_wait_init`.
    pub fn new() -> Methods {
        let mut m = Methods {
            table: BTreeMap::new(),
        };
        m.table.insert("rpc_get_methods", Entry::GetMethods);
        m.add("spdk_get_version", |p| {
            no_params("spdk_get_version", p)?;
            Ok(version())
        });
        m.add("framework_wait_init", |p| {
            no_params("framework_wait_init", p)?;
            // The server starts after the app is initialised.
            Ok(Value::Bool(true))
        });
        m
    }

    /// Adds (or replaces) the method `name`.
    pub fn add(
        &mut self,
        name: &'static str,
        f: impl Fn(Option<&Value>) -> Result<Value, RpcError> + Send + Sync + 'static,
    ) {
        self.table.insert(name, Entry::Handler(Box::new(f)));
    }

    /// The names of the methods, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.table.keys().copied().collect()
    }

    /// Whether `name` is a method of the table.
    pub fn contains(&self, name: &str) -> bool {
        self.table.contains_key(name)
    }

    /// Runs the method `name` with `params` (`None` when absent or null).
    pub fn call(&self, name: &str, params: Option<&Value>) -> Result<Value, RpcError> {
        match self.table.get(name) {
            None => Err(RpcError::method_not_found(name)),
            Some(Entry::GetMethods) => {
                let _: GetMethodsParams = crate::methods::params(params)?;
                Ok(Value::Array(
                    self.names().into_iter().map(Value::from).collect(),
                ))
            }
            Some(Entry::Handler(f)) => f(params),
        }
    }
}

/// `spdk_get_version`'s result, in SPDK's shape, with pollux's version.
fn version() -> Value {
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0);
    let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0);
    let patch: u32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap_or(0);
    json!({
        "version": concat!("pollux v", env!("CARGO_PKG_VERSION")),
        "fields": {
            "major": major,
            "minor": minor,
            "patch": patch,
            "suffix": env!("CARGO_PKG_VERSION_PRE"),
        }
    })
}

/// Refuses parameters on a method that takes none, with SPDK's message.
pub fn no_params(method: &str, p: Option<&Value>) -> Result<(), RpcError> {
    match p {
        None => Ok(()),
        Some(Value::Object(o)) if o.is_empty() => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(RpcError::invalid_params(format!(
            "{method} method requires no parameters"
        ))),
    }
}

/// Decodes `params` into `T` with serde; absent params decode as `{}`.
/// Give `T` `#[serde(deny_unknown_fields)]` so that a misspelt parameter is
/// refused. Errors are -32602 and name the parameter: "Invalid parameters:
/// missing field `num_blocks`", "Invalid parameters: block_size: invalid
/// type: string \"x\", expected u32".
pub fn params<T: DeserializeOwned>(p: Option<&Value>) -> Result<T, RpcError> {
    let empty = Value::Object(Map::new());
    let v = p.unwrap_or(&empty);
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            RpcError::invalid_params(format!("Invalid parameters: {inner}"))
        } else {
            RpcError::invalid_params(format!("Invalid parameters: {path}: {inner}"))
        }
    })
}
