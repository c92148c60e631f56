//! The parameters of one method of an SPDK-style JSON configuration
//! (`{"method": ..., "params": {...}}`), read by typed getters whose
//! errors all name the method and the parameter the same way: what the
//! bdev configuration ([`crate::config`]) and the NVMe-oF target's read
//! their entries with.
//!
//! A parameter that is absent or `null` is absent. Every getter refuses a
//! value of the wrong type or range with [`ParamError::Bad`], whose text
//! says what was expected and what was found. A parameter that is itself
//! an object (`namespace`, `listen_address`) is read by the [`Params`] of
//! [`Params::object`], whose errors name its keys `object.key`.
use serde_json::{Map, Value};

use crate::info::parse_uuid;

/// Why a method's parameters were refused. The texts start with the
/// method; callers add their own prefix (the document, the subsystem).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("{method}: unknown parameter '{param}' (known: {known})")]
    Unknown {
        method: String,
        param: String,
        known: String,
    },
    #[error("{method}: missing required parameter '{param}'")]
    Missing { method: String, param: String },
    #[error("{method}: parameter '{param}': {why}")]
    Bad {
        method: String,
        param: String,
        why: String,
    },
}

/// The parameters of one method.
#[derive(Clone, Copy, Debug)]
pub struct Params<'a> {
    method: &'a str,
    /// The parameter this object is the value of ("" for the method's
    /// own parameters): errors name keys `within.key`.
    within: &'a str,
    obj: &'a Map<String, Value>,
}

impl<'a> Params<'a> {
    /// The `params` object of `method`, unchecked (see [`Params::known`]).
    pub fn new(method: &'a str, obj: &'a Map<String, Value>) -> Params<'a> {
        Params {
            method,
            within: "",
            obj,
        }
    }

    /// The object `param` (required), whose errors name its keys
    /// `param.key` (one level: `param` must be the method's own).
    pub fn object(&self, param: &'a str) -> Result<Params<'a>, ParamError> {
        debug_assert!(self.within.is_empty(), "one level of objects");
        Ok(Params {
            method: self.method,
            within: param,
            obj: self.obj_req(param)?,
        })
    }

    /// How errors name `param`.
    fn key(&self, param: &str) -> String {
        if self.within.is_empty() {
            param.to_string()
        } else {
            format!("{}.{param}", self.within)
        }
    }

    /// `new`, refusing any parameter not in `known`.
    pub fn with_known(
        method: &'a str,
        obj: &'a Map<String, Value>,
        known: &[&str],
    ) -> Result<Params<'a>, ParamError> {
        let p = Params::new(method, obj);
        p.known(known)?;
        Ok(p)
    }

    /// Refuses the first parameter not in `known`, naming those known.
    pub fn known(&self, known: &[&str]) -> Result<(), ParamError> {
        match self.obj.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(ParamError::Unknown {
                method: self.method.to_string(),
                param: self.key(k),
                known: known.join(", "),
            }),
            None => Ok(()),
        }
    }

    pub fn method(&self) -> &'a str {
        self.method
    }

    /// A refusal of `param`'s value.
    pub fn bad(&self, param: &str, why: impl Into<String>) -> ParamError {
        ParamError::Bad {
            method: self.method.to_string(),
            param: self.key(param),
            why: why.into(),
        }
    }

    /// `param` is required and absent.
    pub fn missing(&self, param: &str) -> ParamError {
        ParamError::Missing {
            method: self.method.to_string(),
            param: self.key(param),
        }
    }

    /// The value of `param` (None: absent or null).
    pub fn get(&self, param: &str) -> Option<&'a Value> {
        self.obj.get(param).filter(|v| !v.is_null())
    }

    /// `v`, which an optional getter read, or [`ParamError::Missing`].
    pub fn required<V>(&self, param: &str, v: Option<V>) -> Result<V, ParamError> {
        v.ok_or_else(|| self.missing(param))
    }

    pub fn str_opt(&self, param: &str) -> Result<Option<&'a str>, ParamError> {
        match self.get(param) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(param, format!("expected a string, got {v}"))),
        }
    }

    pub fn str_req(&self, param: &str) -> Result<&'a str, ParamError> {
        let s = self.str_opt(param)?;
        self.required(param, s)
    }

    /// An integer in `min..=max`.
    pub fn uint(&self, param: &str, min: u64, max: u64) -> Result<Option<u64>, ParamError> {
        let Some(v) = self.get(param) else {
            return Ok(None);
        };
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ if min == 0 && max == u64::MAX => {
                Err(self.bad(param, format!("expected a non-negative integer, got {v}")))
            }
            _ => Err(self.bad(
                param,
                format!("expected an integer in {min}..={max}, got {v}"),
            )),
        }
    }

    pub fn u64_opt(&self, param: &str) -> Result<Option<u64>, ParamError> {
        self.uint(param, 0, u64::MAX)
    }

    pub fn u32_opt(&self, param: &str) -> Result<Option<u32>, ParamError> {
        let n = self.uint(param, 0, u32::MAX as u64)?;
        Ok(n.map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    pub fn bool_opt(&self, param: &str) -> Result<Option<bool>, ParamError> {
        match self.get(param) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(param, format!("expected true or false, got {v}"))),
        }
    }

    pub fn obj_req(&self, param: &str) -> Result<&'a Map<String, Value>, ParamError> {
        match self.get(param) {
            None => Err(self.missing(param)),
            Some(Value::Object(o)) => Ok(o),
            Some(v) => Err(self.bad(param, format!("expected an object, got {v}"))),
        }
    }

    /// A UUID in its text form.
    pub fn uuid_opt(&self, param: &str) -> Result<Option<[u8; 16]>, ParamError> {
        match self.str_opt(param)? {
            None => Ok(None),
            Some(s) => parse_uuid(s).map(Some).ok_or_else(|| {
                self.bad(
                    param,
                    format!("'{s}' is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"),
                )
            }),
        }
    }

    /// The `name` parameter, not empty.
    pub fn name(&self, required: bool) -> Result<Option<&'a str>, ParamError> {
        let n = self.str_opt("name")?;
        if required {
            self.required("name", n)?;
        }
        match n {
            Some("") => Err(self.bad("name", "the name is empty")),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Map<String, Value> {
        match serde_json::from_str(json).unwrap() {
            Value::Object(o) => o,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn getters_read_their_type_and_name_method_and_parameter() {
        let o = obj(
            r#"{"s": "x", "n": 7, "b": true, "o": {}, "z": null, "u": "00112233-4455-6677-8899-aabbccddeeff"}"#,
        );
        let p = Params::new("m", &o);
        assert_eq!(p.str_req("s"), Ok("x"));
        assert_eq!(p.uint("n", 1, 7), Ok(Some(7)));
        assert_eq!(p.u32_opt("n"), Ok(Some(7)));
        assert_eq!(p.bool_opt("b"), Ok(Some(true)));
        assert!(p.obj_req("o").unwrap().is_empty());
        assert_eq!(p.str_opt("z"), Ok(None), "null is absent");
        assert_eq!(p.uuid_opt("u").unwrap().unwrap()[15], 0xff);
        let msg = |e: ParamError| e.to_string();
        assert_eq!(
            msg(p.uint("n", 8, 9).unwrap_err()),
            "m: parameter 'n': expected an integer in 8..=9, got 7"
        );
        assert_eq!(
            msg(p.u64_opt("s").unwrap_err()),
            "m: parameter 's': expected a non-negative integer, got \"x\""
        );
        assert_eq!(
            msg(p.str_opt("n").unwrap_err()),
            "m: parameter 'n': expected a string, got 7"
        );
        assert_eq!(
            msg(p.bool_opt("s").unwrap_err()),
            "m: parameter 's': expected true or false, got \"x\""
        );
        assert_eq!(
            msg(p.obj_req("s").unwrap_err()),
            "m: parameter 's': expected an object, got \"x\""
        );
        assert_eq!(
            msg(p.str_req("z").unwrap_err()),
            "m: missing required parameter 'z'"
        );
        assert_eq!(
            msg(p.known(&["s", "n"]).unwrap_err()),
            "m: unknown parameter 'b' (known: s, n)"
        );
        assert!(msg(p.uuid_opt("s").unwrap_err()).contains("'x' is not a UUID"));
    }

    #[test]
    fn an_objects_errors_name_its_keys_within_it() {
        let o = obj(r#"{"ns": {"id": 0, "x": 1}, "s": "x"}"#);
        let p = Params::new("m", &o);
        let q = p.object("ns").unwrap();
        assert_eq!(q.method(), "m");
        let msg = |e: ParamError| e.to_string();
        assert_eq!(
            msg(q.uint("id", 1, 9).unwrap_err()),
            "m: parameter 'ns.id': expected an integer in 1..=9, got 0"
        );
        assert_eq!(
            msg(q.str_req("name").unwrap_err()),
            "m: missing required parameter 'ns.name'"
        );
        assert_eq!(
            msg(q.known(&["id"]).unwrap_err()),
            "m: unknown parameter 'ns.x' (known: id)"
        );
        assert_eq!(
            msg(p.object("s").unwrap_err()),
            "m: parameter 's': expected an object, got \"x\""
        );
        assert_eq!(
            msg(p.object("none").unwrap_err()),
            "m: missing required parameter 'none'"
        );
    }
}
