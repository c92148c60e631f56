//! The emulated controller (`trtype:soft`) behind the host library: what
//! the CLI builds from a [`SoftTrid`] with `pollux-softnvme`. The one
//! place that knows the emulator.
use pollux_host::trid::SoftLimits;
use pollux_softnvme::SoftConfig;

/// Writes the limits of a `trtype:soft` transport ID that were given into
/// `cfg` (the others keep the emulator's defaults).
pub fn apply_limits(l: &SoftLimits, cfg: &mut SoftConfig) {
    if let Some(m) = l.mdts {
        cfg.mdts = m;
    }
    if let Some(q) = l.mqes {
        cfg.mqes = q;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_host::trid::{parse, SoftTrid, Trid, MAX_MDTS};

    fn soft(s: &str) -> SoftTrid {
        match parse(s) {
            Ok(Trid::Soft(t)) => t,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn soft_limits_map_to_the_controller() {
        let l = soft("trtype:soft backend:ram size:1MiB mdts:1 mqes:3").limits;
        let mut cfg = SoftConfig::default();
        apply_limits(&l, &mut cfg);
        assert_eq!(cfg.mdts, 1);
        assert_eq!(4096usize << cfg.mdts, 8 << 10, "mdts:1 is 8 KiB");
        assert_eq!(cfg.mqes, 3);
        let dev = pollux_softnvme::SoftDevice::new(cfg).expect("valid config");
        let (bar, _) = dev.bar0();
        // SAFETY: BAR0 is page aligned and valid while `dev` lives; CAP is
        // at offset 0, accessed as an aligned atomic.
        let cap = unsafe { &*bar.as_ptr().cast::<std::sync::atomic::AtomicU32>() }
            .load(std::sync::atomic::Ordering::Acquire);
        let cap = pollux_spec::regs::Cap(cap as u64);
        assert_eq!(cap.mqes(), 3, "mqes:3 gives 4-entry queues");

        // Unset limits keep the defaults.
        let l = soft("trtype:soft").limits;
        let mut cfg = SoftConfig::default();
        apply_limits(&l, &mut cfg);
        assert_eq!(cfg.mdts, SoftConfig::default().mdts);
        assert_eq!(cfg.mqes, SoftConfig::default().mqes);

        // The extremes the parser accepts are valid controller configs, and
        // the parser's bound is the emulator's.
        assert_eq!(MAX_MDTS, pollux_softnvme::MAX_MDTS);
        for s in [
            "trtype:soft mdts:0 mqes:1",
            "trtype:soft MDTS:16 MQES:65535",
        ] {
            let mut cfg = SoftConfig::default();
            apply_limits(&soft(s).limits, &mut cfg);
            pollux_softnvme::SoftDevice::new(cfg).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }
}
