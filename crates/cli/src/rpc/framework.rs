//! The framework methods that need the app: `framework_get_reactors`,
//! `thread_get_stats` (from the runtime's statistics, with SPDK's field
//! names; times in ticks of 1 ns: `tick_rate` 1e9), and `save_config`.
use std::sync::OnceLock;
use std::time::Instant;

use pollux_rpc::{no_params, Methods, RpcError};
use pollux_runtime::ThreadStats;
use serde_json::{json, Value};

use super::{lock, App};

/// Ticks per second of every `ticks`, `busy`, `idle` here: nanoseconds.
pub const TICK_RATE: u64 = 1_000_000_000;

/// Nanoseconds since the first call (SPDK's `ticks`: a monotonic count).
pub fn ticks() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(t).unwrap_or(u64::MAX)
}

fn cpumask(core: usize) -> String {
    match 1u128.checked_shl(core as u32) {
        Some(m) => format!("0x{m:x}"),
        None => format!("core {core}"),
    }
}

fn stats(app: &App) -> Result<Vec<ThreadStats>, RpcError> {
    let rt = app
        .runtime
        .get()
        .ok_or_else(|| RpcError::errno(libc::EAGAIN, "the app's threads are not running yet"))?;
    rt.runtime()
        .stats()
        .map_err(|e| RpcError::internal(format!("thread statistics: {e}")))
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The thread's name in results: SPDK's reactor threads are `reactor_<core>`.
fn thread_name(t: &ThreadStats) -> String {
    format!("reactor_{}", t.core)
}

/// `thread_get_stats`: `{tick_rate, threads: [{name, id, cpumask, busy,
/// idle, active_pollers_count, timed_pollers_count,
/// paused_pollers_count}]}`; `idle` includes the time asleep in epoll.
pub fn thread_get_stats(app: &App) -> Result<Value, RpcError> {
    let threads: Vec<Value> = stats(app)?
        .iter()
        .map(|t| {
            json!({
                "name": thread_name(t),
                "id": t.index + 1,
                "cpumask": cpumask(t.core),
                "busy": nanos(t.busy),
                "idle": nanos(t.idle + t.asleep),
                "active_pollers_count": t.pollers.len(),
                "timed_pollers_count": 0,
                "paused_pollers_count": 0,
            })
        })
        .collect();
    Ok(json!({ "tick_rate": TICK_RATE, "threads": threads }))
}

/// `framework_get_reactors`: `{tick_rate, pid, reactors: [{lcore, busy,
/// idle, in_interrupt, lw_threads: [{name, id, cpumask, elapsed}]}]}`.
pub fn framework_get_reactors(app: &App) -> Result<Value, RpcError> {
    let rt = app.runtime.get().map(|r| r.runtime());
    let reactors: Vec<Value> = stats(app)?
        .iter()
        .map(|t| {
            let asleep = rt.is_some_and(|r| r.is_asleep(t.index));
            json!({
                "lcore": t.core,
                "busy": nanos(t.busy),
                "idle": nanos(t.idle + t.asleep),
                "in_interrupt": asleep,
                "lw_threads": [{
                    "name": thread_name(t),
                    "id": t.index + 1,
                    "cpumask": cpumask(t.core),
                    "elapsed": nanos(t.busy + t.idle + t.asleep),
                }],
            })
        })
        .collect();
    Ok(json!({ "tick_rate": TICK_RATE, "pid": std::process::id(), "reactors": reactors }))
}

/// `save_config`: `{"subsystems": [{"subsystem": "bdev", "config": [...]},
/// ...the others added with `App::add_save_config`]}`, what `-c FILE`
/// reads back.
pub fn save_config(app: &App) -> Value {
    let mut subs = vec![json!({"subsystem": "bdev", "config": app.registry.save_config()})];
    for (name, f) in lock(&app.save).iter() {
        subs.push(json!({"subsystem": name, "config": f()}));
    }
    json!({ "subsystems": subs })
}

/// `framework_get_subsystems`: `[{subsystem, depends_on}]` (`bdev`, then
/// the others, which depend on it). SPDK's client's `save_config` asks
/// this, then `framework_get_config` per subsystem.
pub fn framework_get_subsystems(app: &App) -> Value {
    let mut v = vec![json!({"subsystem": "bdev", "depends_on": []})];
    for (name, _) in lock(&app.save).iter() {
        v.push(json!({"subsystem": name, "depends_on": ["bdev"]}));
    }
    Value::Array(v)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GetConfigParams {
    name: String,
    /// SPDK's (newer clients send it): there are no batches here.
    #[serde(default)]
    #[allow(dead_code)]
    with_batches: bool,
}

/// `framework_get_config {name}`: subsystem `name`'s `config` array.
fn framework_get_config(app: &App, p: Option<&Value>) -> Result<Value, RpcError> {
    let g: GetConfigParams = pollux_rpc::params(p)?;
    if g.name == "bdev" {
        return Ok(Value::Array(app.registry.save_config()));
    }
    match lock(&app.save).iter().find(|(n, _)| *n == g.name) {
        Some((_, f)) => Ok(Value::Array(f())),
        None => Err(RpcError::errno(
            libc::ENOENT,
            format!("Subsystem '{}' not found", g.name),
        )),
    }
}

pub fn add(m: &mut Methods, app: &App) {
    let a = app.clone();
    m.add("framework_get_subsystems", move |p| {
        no_params("framework_get_subsystems", p)?;
        Ok(framework_get_subsystems(&a))
    });
    let a = app.clone();
    m.add("framework_get_config", move |p| framework_get_config(&a, p));
    let a = app.clone();
    m.add("thread_get_stats", move |p| {
        no_params("thread_get_stats", p)?;
        thread_get_stats(&a)
    });
    let a = app.clone();
    m.add("framework_get_reactors", move |p| {
        no_params("framework_get_reactors", p)?;
        framework_get_reactors(&a)
    });
    let a = app.clone();
    m.add("save_config", move |p| {
        no_params("save_config", p)?;
        Ok(save_config(&a))
    });
}
