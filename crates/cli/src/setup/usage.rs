//! Who uses a controller: mounts, swap, holders, exclusive claims, open
//! files and ZFS/btrfs content.
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::content::Content;
use super::sysfs::{dir_names, read_devno, read_trim};
use super::Host;

/// A device node of a controller, for the /proc/PID/fd scan.
pub(super) struct Node {
    /// Kernel name: nvme0n1p1, nvme0, ng0n1.
    pub(super) name: String,
    /// Where it is expected: /dev/NAME.
    pub(super) path: PathBuf,
    /// Block (else character) device.
    pub(super) block: bool,
    /// (major, minor) from sysfs, when known.
    pub(super) devno: Option<(u32, u32)>,
}

impl Node {
    /// Whether the open file behind `fd` (a /proc/PID/fd link to `target`)
    /// is this node: the link names its path, or, opened under another
    /// path with the same file name (a container's /dev, a deleted node),
    /// the file is a device of the same type and number.
    fn is_behind(&self, fd: &Path, target: &Path) -> bool {
        if target == self.path {
            return true;
        }
        let same_name = target
            .file_name()
            .is_some_and(|n| n.to_string_lossy().trim_end_matches(" (deleted)") == self.name);
        let Some((major, minor)) = self.devno.filter(|_| same_name) else {
            return false;
        };
        // stat follows the link to the open file; only for files named like
        // the node, so no other (possibly hanging network) file is touched.
        let Ok(md) = fs::metadata(fd) else {
            return false;
        };
        let ft = md.file_type();
        let kind_ok = if self.block {
            ft.is_block_device()
        } else {
            ft.is_char_device()
        };
        kind_ok && md.rdev() == libc::makedev(major, minor)
    }
}

/// Processes other than this one that hold one of `nodes` open, from the
/// /proc/PID/fd links under `proc_`: "/dev/nvme0n1 is open in process 42
/// (fio)". Processes whose fd directory cannot be read (gone, or not ours
/// without root) are skipped.
pub(super) fn open_by_processes(proc_: &Path, nodes: &[Node]) -> Vec<String> {
    let me = std::process::id();
    let mut pids: Vec<u32> = dir_names(proc_)
        .iter()
        .filter_map(|n| n.parse().ok())
        .filter(|&p| p != me)
        .collect();
    pids.sort_unstable();
    let mut why = Vec::new();
    for pid in pids {
        let pdir = proc_.join(pid.to_string());
        let Ok(fds) = fs::read_dir(pdir.join("fd")) else {
            continue;
        };
        let mut hits: Vec<(usize, PathBuf)> = Vec::new();
        for fd in fds.filter_map(|e| e.ok()).map(|e| e.path()) {
            let Ok(target) = fs::read_link(&fd) else {
                continue;
            };
            if let Some(i) = nodes.iter().position(|n| n.is_behind(&fd, &target)) {
                hits.push((i, target));
            }
        }
        hits.sort();
        hits.dedup();
        let comm = read_trim(&pdir.join("comm")).unwrap_or_else(|| "?".into());
        for (i, target) in hits {
            let node = &nodes[i];
            let mut s = format!("{} is open in process {pid} ({comm})", node.path.display());
            if target != node.path {
                let _ = write!(s, " as {}", target.display());
            }
            why.push(s);
        }
    }
    why
}

/// True if `path` is a block device the kernel will not open with
/// O_EXCL (EBUSY): mounted in any mount namespace, a swap area, or held by
/// md, device-mapper or another exclusive opener. Anything that cannot be
/// checked (no node, not a block device, not root) is not busy.
fn exclusively_busy(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    // O_EXCL without O_CREAT means "exclusive claim" for block devices
    // only; on anything else it is undefined.
    match fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => {}
        _ => return false,
    }
    let r = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_NONBLOCK)
        .open(path);
    match r {
        Ok(_) => false,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => true,
        Err(e) => {
            use std::io::ErrorKind::{NotFound, PermissionDenied};
            if matches!(e.kind(), NotFound | PermissionDenied) {
                tracing::debug!("{}: not checked for an exclusive user: {e}", path.display());
            } else {
                tracing::warn!("{}: not checked for an exclusive user: {e}", path.display());
            }
            false
        }
    }
}

impl Host {
    /// sysfs directory of block device `dev`, one of `devs` (a disk:
    /// /sys/block/D; a partition: /sys/block/D/P).
    fn block_dir(&self, dev: &str, devs: &[String]) -> PathBuf {
        let disk = devs.iter().find(|d| {
            dev.strip_prefix(d.as_str())
                .is_some_and(|r| r.starts_with('p'))
        });
        match disk {
            Some(d) => self.sys.join("block").join(d).join(dev),
            None => self.sys.join("block").join(dev),
        }
    }

    /// Who uses a controller's devices: mounts, swap, dm/md holders of the
    /// block devices `devs`; processes holding `devs` or the character
    /// devices `chars` open; ZFS and btrfs on `devs`. `ctrl_dir`: the
    /// controller's sysfs directory (/sys/bus/pci/devices/BDF/nvme/nvme0).
    pub(super) fn usage(
        &self,
        ctrl_dir: Option<&Path>,
        devs: &[String],
        chars: &[String],
    ) -> Vec<String> {
        let mut why = Vec::new();
        if devs.is_empty() && chars.is_empty() {
            return why;
        }
        let resolve = |src: &str| -> Option<String> {
            if !src.starts_with("/dev/") {
                return None;
            }
            let p = fs::canonicalize(src).unwrap_or_else(|_| PathBuf::from(src));
            p.file_name().map(|n| n.to_string_lossy().into_owned())
        };
        let unescape = |s: &str| s.replace("\\040", " ").replace("\\011", "\t");
        if let Some(mounts) = read_trim(&self.proc_.join("mounts")) {
            for line in mounts.lines() {
                let mut f = line.split_whitespace();
                let (Some(src), Some(dst), Some(fstype)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                if let Some(name) = resolve(src) {
                    if devs.contains(&name) {
                        why.push(format!(
                            "/dev/{name} is mounted on {} ({fstype})",
                            unescape(dst)
                        ));
                    }
                }
            }
        }
        if let Some(swaps) = read_trim(&self.proc_.join("swaps")) {
            for line in swaps.lines().skip(1) {
                if let Some(name) = line.split_whitespace().next().and_then(resolve) {
                    if devs.contains(&name) {
                        why.push(format!("/dev/{name} is in use as swap"));
                    }
                }
            }
        }
        for dev in devs {
            for h in dir_names(&self.block_dir(dev, devs).join("holders")) {
                let what = read_trim(&self.sys.join("block").join(&h).join("dm/name"))
                    .map(|n| format!("device-mapper {n} ({h})"))
                    .unwrap_or(h);
                why.push(format!("/dev/{dev} is held by {what}"));
            }
        }
        // /proc/mounts shows this mount namespace only: a device mounted
        // in another one (a container's) is found by the kernel's
        // exclusive claim instead. Partitions first: a disk is busy too
        // while one of its partitions is, and then only the partition is
        // named.
        let is_part = |d: &String| {
            devs.iter().any(|disk| {
                d.strip_prefix(disk.as_str())
                    .is_some_and(|r| r.starts_with('p'))
            })
        };
        let (parts, disks): (Vec<&String>, Vec<&String>) = devs.iter().partition(|d| is_part(d));
        for dev in parts.into_iter().chain(disks) {
            let named = |d: &str| {
                let n = format!("/dev/{d} ");
                why.iter().any(|w| w.starts_with(&n))
            };
            let part_named = devs.iter().any(|p| {
                p.strip_prefix(dev.as_str())
                    .is_some_and(|r| r.starts_with('p'))
                    && named(p)
            });
            if named(dev) || part_named {
                continue;
            }
            if exclusively_busy(&self.dev.join(dev)) {
                why.push(format!(
                    "/dev/{dev} is busy: the kernel refuses to open it exclusively (EBUSY), so \
                     it is mounted (perhaps in another mount namespace, such as a container's) \
                     or claimed by md, device-mapper or another exclusive user"
                ));
            }
        }
        let mut nodes: Vec<Node> = devs
            .iter()
            .map(|d| Node {
                path: self.dev.join(d),
                name: d.clone(),
                block: true,
                devno: read_devno(&self.block_dir(d, devs).join("dev")),
            })
            .collect();
        for c in chars {
            let sysdir = match ctrl_dir {
                Some(cd) if cd.file_name().is_some_and(|n| *n == **c) => cd.to_owned(),
                _ => self.sys.join("class/nvme-generic").join(c),
            };
            nodes.push(Node {
                path: self.dev.join(c),
                name: c.clone(),
                block: false,
                devno: read_devno(&sysdir.join("dev")),
            });
        }
        why.extend(open_by_processes(&self.proc_, &nodes));
        why.extend(self.content_users(devs));
        why
    }

    /// Users the kernel does not show as mounts, holders or open files:
    /// ZFS vdevs (an imported pool opens its disks from the kernel), and
    /// btrfs members, which a multi-device btrfs uses without a mount line
    /// for each. Devices that cannot be read (no node, not root) are
    /// skipped.
    fn content_users(&self, devs: &[String]) -> Vec<String> {
        let mut why = Vec::new();
        let mut btrfs = Vec::new();
        for d in devs {
            let path = self.dev.join(d);
            // A whole disk: its partitions' signatures are theirs (a
            // partition starting at 16 KiB puts its ZFS labels on the
            // disk's grid too).
            let covered: Vec<(u64, u64)> = devs
                .iter()
                .filter(|p| {
                    p.strip_prefix(d.as_str())
                        .is_some_and(|r| r.starts_with('p'))
                })
                .filter_map(|p| {
                    let dir = self.block_dir(p, devs);
                    let sectors = |f: &str| read_trim(&dir.join(f))?.parse::<u64>().ok();
                    let (start, size) = (sectors("start")?, sectors("size")?);
                    Some((start * 512, (start + size) * 512))
                })
                .collect();
            let content = match Content::probe(&path, &covered) {
                Ok(c) => c,
                Err(e) => {
                    use std::io::ErrorKind::{NotFound, PermissionDenied};
                    if matches!(e.kind(), NotFound | PermissionDenied) {
                        tracing::debug!("{}: not probed for ZFS/btrfs: {e}", path.display());
                    } else {
                        tracing::warn!("{}: not probed for ZFS/btrfs: {e}", path.display());
                    }
                    continue;
                }
            };
            if content.zfs {
                why.push(format!(
                    "{} is a ZFS vdev (zfs_member label; `zpool labelclear` it if its pool is \
                     gone)",
                    path.display()
                ));
            }
            if let Some(b) = content.btrfs {
                btrfs.push((d, path, b));
            }
        }
        for (d, path, b) in &btrfs {
            // /sys/fs/btrfs/FSID exists while that file system is mounted;
            // devices/ names its member block devices.
            let members = dir_names(&self.sys.join("fs/btrfs").join(&b.fsid).join("devices"));
            if members.contains(d) {
                why.push(format!(
                    "{} is a member of the mounted btrfs {} (devices: {})",
                    path.display(),
                    b.fsid,
                    members.join(", ")
                ));
                continue;
            }
            // Not mounted: taking it is harmless unless the file system
            // also lives on devices outside this controller.
            let here = btrfs.iter().filter(|(_, _, o)| o.fsid == b.fsid).count() as u64;
            if b.num_devices > here {
                why.push(format!(
                    "{} is one of {} devices of btrfs {}, {} of them not on this controller",
                    path.display(),
                    b.num_devices,
                    b.fsid,
                    b.num_devices - here
                ));
            }
        }
        why
    }
}
