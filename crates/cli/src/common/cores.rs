//! Core lists: `-c` of perf and pingpong, `-m` of bdevperf and target,
//! all read by [`parse_cores`] in the same forms.

/// Parses a core list in SPDK's forms into sorted core numbers: a hex
/// mask (`0x3`), a list of cores and ranges (`0,2`, `0-1`, `0,2-3`), the
/// list also in brackets (`[0,1]`, `[0-2,5]`).
pub fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    let t = s.trim();
    let s = match (t.strip_prefix('['), t.ends_with(']')) {
        (Some(rest), true) => &rest[..rest.len() - 1],
        (None, false) => t,
        _ => return Err(format!("unbalanced brackets in '{s}'")),
    };
    let mut cores = Vec::new();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let m = u64::from_str_radix(hex, 16).map_err(|_| format!("bad core mask '{s}'"))?;
        cores.extend((0..64).filter(|b| m & (1 << b) != 0));
    } else {
        for part in s.split(',') {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let a: usize = a.trim().parse().map_err(|_| format!("bad core '{part}'"))?;
            let b: usize = b.trim().parse().map_err(|_| format!("bad core '{part}'"))?;
            if a > b || b >= 1024 {
                return Err(format!("bad core range '{part}'"));
            }
            cores.extend(a..=b);
        }
    }
    cores.sort_unstable();
    cores.dedup();
    if cores.is_empty() {
        return Err(format!("no cores in '{s}'"));
    }
    Ok(cores)
}

/// `[0, 1, 2, 5]` -> `0-2,5`.
pub(crate) fn fmt_cores(cores: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// A core list as a hex mask (`0x3`), for the report (cores below 128).
pub(crate) fn mask_of(cores: &[usize]) -> String {
    let m = cores
        .iter()
        .filter(|&&c| c < 128)
        .fold(0u128, |m, &c| m | 1 << c);
    format!("{m:#x}")
}

/// Checks that every core in `cores` is one of `online` (the CPUs this
/// process may run on); the error names the first one that is not.
pub(crate) fn check_cores(cores: &[usize], online: &[usize]) -> Result<(), String> {
    match cores.iter().find(|c| !online.contains(c)) {
        Some(c) => Err(format!(
            "core {c} is not available to this process (available: {})",
            fmt_cores(online)
        )),
        None => Ok(()),
    }
}

/// The CPUs this process may run on.
pub(crate) fn online_cpus() -> Vec<usize> {
    // SAFETY: zeroed cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_parse() {
        assert_eq!(parse_cores("0").unwrap(), vec![0]);
        assert_eq!(parse_cores("0,2-3").unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cores("0x5").unwrap(), vec![0, 2]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("x").is_err());
        assert!(parse_cores("0x0").is_err());
    }

    #[test]
    fn masks_in_spdk_forms() {
        assert_eq!(parse_cores("0x3").unwrap(), vec![0, 1]);
        assert_eq!(parse_cores("[0,1]").unwrap(), vec![0, 1]);
        assert_eq!(parse_cores("[0-2,5]").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(parse_cores(" [2, 0] ").unwrap(), vec![0, 2]);
        assert_eq!(parse_cores("0-1").unwrap(), vec![0, 1]);
        assert!(parse_cores("[0,1").is_err());
        assert!(parse_cores("0,1]").is_err());
        assert!(parse_cores("[]").is_err());
        assert!(parse_cores("0x0").is_err());
        assert_eq!(mask_of(&[0, 1]), "0x3");
        assert_eq!(mask_of(&[4]), "0x10");
    }
}
