//! The host's NQN and Host ID, as nvme-cli finds them: `/etc/nvme/hostnqn`
//! and `/etc/nvme/hostid` when they exist; otherwise a UUID-form NQN
//! (`nqn.2014-08.org.nvmexpress:uuid:<uuid>`) from the machine's DMI
//! product UUID or, failing that, its systemd machine ID — stable per
//! machine either way.
use pollux_spec::fabrics::NQN_UUID_PREFIX;

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// Parses a textual UUID (with or without dashes) into its 16 bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Formats 16 bytes as a textual UUID.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// This machine's UUID: DMI product UUID, else the machine ID as a
/// version-4-shaped UUID.
fn machine_uuid() -> [u8; 16] {
    if let Some(u) = read_trimmed("/sys/class/dmi/id/product_uuid").and_then(|s| parse_uuid(&s)) {
        if u != [0; 16] {
            return u;
        }
    }
    if let Some(mut u) = read_trimmed("/etc/machine-id").and_then(|s| parse_uuid(&s)) {
        u[6] = (u[6] & 0x0F) | 0x40;
        u[8] = (u[8] & 0x3F) | 0x80;
        return u;
    }
    // No machine identity at all: a fixed, documented fallback.
    [0; 16]
}

/// The default host NQN and Host ID.
pub fn default_host() -> (String, [u8; 16]) {
    let nqn = read_trimmed("/etc/nvme/hostnqn");
    let id = read_trimmed("/etc/nvme/hostid").and_then(|s| parse_uuid(&s));
    match (nqn, id) {
        (Some(n), Some(i)) => (n, i),
        (Some(n), None) => {
            let id = n
                .strip_prefix(NQN_UUID_PREFIX)
                .and_then(parse_uuid)
                .unwrap_or_else(machine_uuid);
            (n, id)
        }
        (None, id) => {
            let u = machine_uuid();
            (
                format!("{NQN_UUID_PREFIX}{}", format_uuid(&u)),
                id.unwrap_or(u),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let s = "6f3a1c2e-8b4d-4e5f-9a0b-1c2d3e4f5a6b";
        let u = parse_uuid(s).unwrap();
        assert_eq!(format_uuid(&u), s);
        assert!(parse_uuid("xyz").is_none());
        assert!(parse_uuid("6f3a1c2e8b4d4e5f9a0b1c2d3e4f5a6").is_none());
    }

    #[test]
    fn default_is_a_valid_uuid_nqn_and_stable() {
        let (a, ida) = default_host();
        let (b, idb) = default_host();
        assert_eq!((a.clone(), ida), (b, idb));
        pollux_spec::fabrics::validate_nqn(&a).unwrap();
        if std::fs::metadata("/etc/nvme/hostnqn").is_err() {
            assert!(a.starts_with(NQN_UUID_PREFIX), "{a}");
        }
    }
}
