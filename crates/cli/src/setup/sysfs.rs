//! Small readers of sysfs and procfs files.
use std::fs;
use std::path::Path;

pub(super) fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

pub(super) fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

pub(super) fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `MAJOR:MINOR` from a sysfs `dev` file.
pub(super) fn read_devno(p: &Path) -> Option<(u32, u32)> {
    let s = read_trim(p)?;
    let (major, minor) = s.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}
