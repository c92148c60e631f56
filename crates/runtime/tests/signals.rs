//! SIGTERM triggers a graceful shutdown (own test binary: the handler is
//! process-wide).

use std::sync::mpsc;
use std::time::Duration;

use pollux_runtime::{Runtime, RuntimeOptions};

#[test]
fn sigterm_shuts_the_runtime_down() {
    let rt = Runtime::start(&[0, 1], RuntimeOptions::default()).unwrap();
    let drained = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = drained.clone();
    rt.call(0, move |ctx| {
        ctx.register_drain("flag", move |_| {
            d.store(true, std::sync::atomic::Ordering::SeqCst);
            true
        })
    })
    .unwrap();
    let watcher = rt.stop_on_signals().unwrap();
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(rt.wait()).unwrap());
    rx.recv_timeout(Duration::from_secs(30))
        .expect("runtime stopped on SIGTERM")
        .unwrap();
    assert!(drained.load(std::sync::atomic::Ordering::SeqCst));
    drop(watcher);
}
