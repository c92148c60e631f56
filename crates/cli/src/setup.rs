//! `pollux setup`: hand NVMe controllers to user space and back.
//!
//! `list` shows every NVMe controller (PCI class 0x010802) with its driver,
//! IOMMU group and what uses its namespaces; `bind` moves controllers to
//! vfio-pci (default) or uio_pci_generic with driver_override, refusing any
//! whose namespaces are mounted, used as swap, held by device-mapper/md,
//! claimed exclusively by the kernel (O_EXCL open fails with EBUSY: a mount
//! in another mount namespace), open in a process (/proc/PID/fd, also the
//! controller's and the generic char devices), ZFS vdevs, or btrfs members
//! mounted or spanning other devices; `reset` gives them back to the kernel nvme driver; `hugepages N`
//! reserves 2 MiB hugepages (needed for uio_pci_generic, optional for
//! vfio-pci).
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pollux_pcie::platform::pci::{Sysfs, SysfsError, NVME_CLASS};

const USER_DRIVERS: [&str; 2] = ["vfio-pci", "uio_pci_generic"];

#[derive(clap::Subcommand, Debug)]
pub enum SetupCommand {
    /// List NVMe controllers: driver, IOMMU group, namespaces and their use.
    List,
    /// Detach controllers from the kernel and bind them to a user-space
    /// driver (refuses controllers in use: mounted, swap, dm/md, open in a
    /// process, ZFS, btrfs).
    Bind {
        /// PCI addresses, e.g. 0000:01:00.0 (see `pollux setup list`).
        #[arg(required = true)]
        bdf: Vec<String>,
        /// vfio-pci (needs an IOMMU; recommended) or uio_pci_generic (no
        /// IOMMU; root only; needs hugepages).
        #[arg(long, default_value = "vfio-pci", value_parser = ["vfio-pci", "uio_pci_generic"])]
        driver: String,
    },
    /// Give controllers back to the kernel nvme driver (default: every
    /// controller bound to vfio-pci or uio_pci_generic).
    Reset { bdf: Vec<String> },
    /// Reserve COUNT 2 MiB hugepages (0 releases them).
    Hugepages { count: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0}")]
    Msg(String),
    #[error(transparent)]
    Pci(#[from] SysfsError),
    #[error("{path}: {err}{hint}")]
    Io {
        path: PathBuf,
        err: std::io::Error,
        hint: &'static str,
    },
}

fn msg(s: impl Into<String>) -> SetupError {
    SetupError::Msg(s.into())
}

fn io_err(path: &Path, err: std::io::Error) -> SetupError {
    let hint = if err.kind() == std::io::ErrorKind::PermissionDenied {
        " (pollux setup needs root)"
    } else {
        ""
    };
    SetupError::Io {
        path: path.to_owned(),
        err,
        hint,
    }
}

/// Where the kernel's views live (a fake tree in tests).
pub struct Host {
    pub sys: PathBuf,
    pub proc_: PathBuf,
    /// Where the device nodes are (/dev): matched against /proc/PID/fd
    /// links and read for file-system signatures.
    pub dev: PathBuf,
    /// Runs `modprobe NAME`; Err = could not.
    pub modprobe: fn(&str) -> Result<(), String>,
    /// How long to wait for a driver to bind.
    pub bind_timeout: Duration,
}

fn real_modprobe(name: &str) -> Result<(), String> {
    match std::process::Command::new("modprobe").arg(name).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("cannot run modprobe: {e}")),
    }
}

impl Default for Host {
    fn default() -> Self {
        Host {
            sys: "/sys".into(),
            proc_: "/proc".into(),
            dev: "/dev".into(),
            modprobe: real_modprobe,
            bind_timeout: Duration::from_secs(10),
        }
    }
}

/// One NVMe controller as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    pub bdf: String,
    pub ids: String,
    pub driver: Option<String>,
    pub iommu_group: Option<u32>,
    /// Kernel name (nvme0) when bound to nvme.
    pub kname: Option<String>,
    pub model: Option<String>,
    /// Block devices of its namespaces (disks and partitions).
    pub block_devs: Vec<String>,
    /// Character devices: the controller's (nvme0) and its namespaces'
    /// generic ones (ng0n1).
    pub char_devs: Vec<String>,
    /// Why it must not be taken away from the kernel ("nvme0n1p1 is
    /// mounted on /home", ...). Empty: free.
    pub in_use: Vec<String>,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn dir_names(p: &Path) -> Vec<String> {
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
fn read_devno(p: &Path) -> Option<(u32, u32)> {
    let s = read_trim(p)?;
    let (major, minor) = s.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `(X, Y)` of a namespace disk name `nvmeXnY` (not partitions `nvmeXnYpZ`).
fn disk_numbers(name: &str) -> Option<(&str, &str)> {
    let (x, y) = name.strip_prefix("nvme")?.split_once('n')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(x) && digits(y)).then_some((x, y))
}

/// Character devices of controller `kname`: its own (/dev/nvme0) and the
/// generic namespace devices: ngXnY for each namespace disk nvmeXnY (the
/// same numbers, with native multipath too) and any ng* the controller
/// lists in sysfs.
fn char_devs(ctrl_dir: &Path, kname: &str, block_devs: &[String]) -> Vec<String> {
    let mut ng: Vec<String> = block_devs
        .iter()
        .filter_map(|d| disk_numbers(d))
        .map(|(x, y)| format!("ng{x}n{y}"))
        .chain(
            dir_names(ctrl_dir)
                .into_iter()
                .filter(|n| n.starts_with("ng")),
        )
        .collect();
    ng.sort();
    ng.dedup();
    let mut out = vec![kname.to_string()];
    out.extend(ng);
    out
}

/// A device node of a controller, for the /proc/PID/fd scan.
struct Node {
    /// Kernel name: nvme0n1p1, nvme0, ng0n1.
    name: String,
    /// Where it is expected: /dev/NAME.
    path: PathBuf,
    /// Block (else character) device.
    block: bool,
    /// (major, minor) from sysfs, when known.
    devno: Option<(u32, u32)>,
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
fn open_by_processes(proc_: &Path, nodes: &[Node]) -> Vec<String> {
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

/// What a namespace or partition holds, as far as `pollux setup` cares.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Content {
    /// A ZFS vdev label (what blkid reports as TYPE zfs_member).
    pub zfs: bool,
    /// A btrfs superblock.
    pub btrfs: Option<BtrfsMember>,
}

/// The btrfs a device belongs to (from its primary superblock).
#[derive(Debug, PartialEq, Eq)]
pub struct BtrfsMember {
    /// File system UUID as /sys/fs/btrfs names it.
    pub fsid: String,
    /// Devices the file system spans.
    pub num_devices: u64,
}

/// ZFS: four 256 KiB vdev labels, two at the start of the device, two at
/// its end (size rounded down to 256 KiB); each ends in a 128 KiB ring of
/// uberblocks, at least 1 KiB apart, whose first word is the magic in the
/// writer's byte order.
const ZFS_LABEL: u64 = 256 * 1024;
const ZFS_RING: u64 = 128 * 1024;
const ZFS_UB_STEP: usize = 1024;
const ZFS_UB_MAGIC: u64 = 0x00ba_b10c;
/// Uberblocks needed for a match, over all labels (as blkid: one stray
/// magic word is not a pool).
const ZFS_UB_WANT: usize = 4;
/// btrfs: the primary superblock at 64 KiB; fsid at 0x20, magic at 0x40,
/// num_devices at 0x88.
const BTRFS_SUPER: u64 = 64 * 1024;
const BTRFS_MAGIC: &[u8; 8] = b"_BHRfS_M";

/// Size of the btrfs superblock.
const BTRFS_SUPER_SIZE: u64 = 4096;

impl Content {
    /// Reads the ZFS labels and the btrfs superblock of `path` (a block
    /// device, or an image file in tests), ignoring those that overlap a
    /// `covered` byte range `[start, end)` (a whole disk's partitions, whose
    /// content is the partitions').
    pub fn probe(path: &Path, covered: &[(u64, u64)]) -> std::io::Result<Content> {
        use std::io::{Seek, SeekFrom};
        let mut f = fs::File::open(path)?;
        // Block devices report length 0 in their metadata; seek to the end.
        let size = f.seek(SeekFrom::End(0))?;
        let free = |off: u64, len: u64| !covered.iter().any(|&(s, e)| off < e && s < off + len);
        Ok(Content {
            zfs: zfs_uberblocks(&f, size, &free)? >= ZFS_UB_WANT,
            btrfs: if free(BTRFS_SUPER, BTRFS_SUPER_SIZE) {
                btrfs_member(&f)?
            } else {
                None
            },
        })
    }
}

/// Reads up to `buf.len()` bytes at `off`; returns how many (short at the
/// end of the device).
fn read_upto(f: &fs::File, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Uberblock magics in the ZFS label rings of a device of `size` bytes,
/// in the labels for which `free(offset, length)` holds.
fn zfs_uberblocks(
    f: &fs::File,
    size: u64,
    free: &dyn Fn(u64, u64) -> bool,
) -> std::io::Result<usize> {
    let end = size - size % ZFS_LABEL;
    let mut labels = vec![0, ZFS_LABEL];
    if end >= 2 * ZFS_LABEL {
        labels.extend([end - 2 * ZFS_LABEL, end - ZFS_LABEL]);
    }
    labels.retain(|&l| l + ZFS_LABEL <= size && free(l, ZFS_LABEL));
    labels.sort_unstable();
    labels.dedup();
    let mut ring = vec![0u8; ZFS_RING as usize];
    let mut found = 0;
    for l in labels {
        let n = read_upto(f, l + ZFS_RING, &mut ring)?;
        found += ring[..n]
            .chunks_exact(ZFS_UB_STEP)
            .filter(|ub| {
                let w = [ub[0], ub[1], ub[2], ub[3], ub[4], ub[5], ub[6], ub[7]];
                u64::from_le_bytes(w) == ZFS_UB_MAGIC || u64::from_be_bytes(w) == ZFS_UB_MAGIC
            })
            .count();
    }
    Ok(found)
}

/// The btrfs superblock's fsid and device count, if there is one.
fn btrfs_member(f: &fs::File) -> std::io::Result<Option<BtrfsMember>> {
    let mut sb = [0u8; 0x90];
    if read_upto(f, BTRFS_SUPER, &mut sb)? < sb.len() || &sb[0x40..0x48] != BTRFS_MAGIC {
        return Ok(None);
    }
    let mut fsid = String::new();
    for (i, b) in sb[0x20..0x30].iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            fsid.push('-');
        }
        let _ = write!(fsid, "{b:02x}");
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&sb[0x88..0x90]);
    Ok(Some(BtrfsMember {
        fsid,
        num_devices: u64::from_le_bytes(n),
    }))
}

/// Drops repeated entries, keeping the first of each (`bind A A` moves A once).
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

fn dedup_in_order(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(x.clone()));
}

/// `0000:01:00.0` form (adds the domain), validated.
pub fn normalize_bdf(s: &str) -> Result<String, SetupError> {
    pollux_pcie::platform::pci::normalize_bdf(s).map_err(|e| msg(e.to_string()))
}

impl Host {
    /// The PCI devices and drivers of this host's sysfs.
    fn pci(&self) -> Sysfs {
        Sysfs::at(&self.sys)
    }

    /// Every NVMe controller, sorted by address.
    pub fn controllers(&self) -> Result<Vec<Controller>, SetupError> {
        let pci = self.pci();
        let mut out = Vec::new();
        for bdf in pci.devices().unwrap_or_default() {
            if pci.class(&bdf).ok() == Some(NVME_CLASS) {
                out.push(self.controller(&bdf)?);
            }
        }
        Ok(out)
    }

    pub fn controller(&self, bdf: &str) -> Result<Controller, SetupError> {
        let pci = self.pci();
        let d = pci.nvme_controller(bdf)?;
        let ids = pci
            .ids(bdf)
            .map_or_else(|_| "-".into(), |(v, dev)| format!("{v:04x}:{dev:04x}"));
        let driver = pci.driver(bdf).ok().flatten();
        let iommu_group = pci.iommu_group(bdf).ok().flatten();
        let kname = dir_names(&d.join("nvme")).into_iter().next();
        let ctrl_dir = kname.as_ref().map(|k| d.join("nvme").join(k));
        let model = ctrl_dir.as_ref().and_then(|c| read_trim(&c.join("model")));
        let (block_devs, char_devs) = match (&ctrl_dir, &kname) {
            (Some(c), Some(k)) => {
                let b = self.block_devs(c, k);
                let ch = char_devs(c, k, &b);
                (b, ch)
            }
            _ => Default::default(),
        };
        let in_use = self.usage(ctrl_dir.as_deref(), &block_devs, &char_devs);
        Ok(Controller {
            bdf: bdf.to_string(),
            ids,
            driver,
            iommu_group,
            kname,
            model,
            block_devs,
            char_devs,
            in_use,
        })
    }

    /// Namespace block devices of controller `kname` (e.g. nvme0) and their
    /// partitions. With native multipath the controller lists hidden paths
    /// (nvme0c0n1) whose visible disk is nvme<subsystem>n<nsid>.
    fn block_devs(&self, ctrl_dir: &Path, kname: &str) -> Vec<String> {
        let mut disks = Vec::new();
        let subsys_no = link_name(&ctrl_dir.join("subsystem"))
            .and_then(|s| s.strip_prefix("nvme-subsys").map(str::to_string));
        for name in dir_names(ctrl_dir) {
            let Some(rest) = name.strip_prefix(kname) else {
                continue;
            };
            if let Some(ns) = rest.strip_prefix('n') {
                if ns.chars().all(|c| c.is_ascii_digit()) && !ns.is_empty() {
                    disks.push(name.clone());
                }
            } else if let Some(path) = rest.strip_prefix('c') {
                // c<ctrl>n<nsid>
                if let (Some((_, ns)), Some(sub)) = (path.split_once('n'), subsys_no.as_ref()) {
                    disks.push(format!("nvme{sub}n{ns}"));
                }
            }
        }
        disks.sort();
        disks.dedup();
        let mut out = Vec::new();
        for disk in disks {
            let parts: Vec<String> = dir_names(&self.sys.join("block").join(&disk))
                .into_iter()
                .filter(|p| {
                    p.strip_prefix(disk.as_str())
                        .is_some_and(|r| r.starts_with('p'))
                })
                .collect();
            out.push(disk);
            out.extend(parts);
        }
        out
    }

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
    fn usage(&self, ctrl_dir: Option<&Path>, devs: &[String], chars: &[String]) -> Vec<String> {
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

    fn write(&self, p: &Path, v: &str) -> Result<(), SetupError> {
        fs::write(p, v).map_err(|e| io_err(p, e))
    }

    fn ensure_driver(&self, driver: &str) -> Result<(), SetupError> {
        let modules: &[&str] = match driver {
            // The type1 IOMMU backend is a soft dependency that busybox
            // modprobe (and some minimal systems) do not load.
            "vfio-pci" => &["vfio-pci", "vfio_iommu_type1"],
            other => &[other],
        };
        let mut errs = Vec::new();
        for m in modules {
            if let Err(e) = (self.modprobe)(m) {
                errs.push(format!("modprobe {m}: {e}"));
            }
        }
        if !self.pci().has_driver(driver) {
            return Err(msg(format!(
                "kernel driver {driver} is not available ({})",
                errs.join("; ")
            )));
        }
        Ok(())
    }

    fn wait_driver(&self, bdf: &str, want: Option<&str>) -> Option<String> {
        let start = Instant::now();
        loop {
            let cur = self.pci().driver(bdf).ok().flatten();
            if cur.as_deref() == want || start.elapsed() >= self.bind_timeout {
                return cur;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Moves `bdf` to `driver` (None: the kernel's default, i.e. nvme).
    fn rebind(&self, bdf: &str, driver: Option<&str>) -> Result<Option<String>, SetupError> {
        let pci = self.pci();
        self.write(&pci.driver_override_path(bdf), driver.unwrap_or("\n"))?;
        if let Some(cur) = pci.driver(bdf).ok().flatten() {
            self.write(&pci.unbind_path(&cur), bdf)?;
        }
        self.write(&pci.drivers_probe_path(), bdf)?;
        Ok(self.wait_driver(bdf, Some(driver.unwrap_or("nvme"))))
    }

    pub fn bind(&self, bdfs: &[String], driver: &str, out: &mut String) -> Result<(), SetupError> {
        if !USER_DRIVERS.contains(&driver) {
            return Err(msg(format!(
                "--driver {driver}: want vfio-pci or uio_pci_generic"
            )));
        }
        // Check everything first: nothing is moved if any controller is busy.
        let mut targets = bdfs
            .iter()
            .map(|b| normalize_bdf(b))
            .collect::<Result<Vec<_>, _>>()?;
        dedup_in_order(&mut targets);
        let mut ctrls = Vec::new();
        for bdf in &targets {
            let c = self.controller(bdf)?;
            if !c.in_use.is_empty() {
                return Err(msg(format!(
                    "refusing to take {} from the kernel: {}. Unmount / release it first.",
                    c.bdf,
                    c.in_use.join("; ")
                )));
            }
            if driver == "vfio-pci" && c.iommu_group.is_none() {
                return Err(msg(format!(
                    "{} has no IOMMU group, so vfio-pci cannot use it: enable the IOMMU \
                     (intel_iommu=on or amd_iommu=on on the kernel command line) or use \
                     --driver uio_pci_generic",
                    c.bdf
                )));
            }
            ctrls.push(c);
        }
        self.ensure_driver(driver)?;
        for c in ctrls {
            if c.driver.as_deref() == Some(driver) {
                let _ = writeln!(out, "{}: already bound to {driver}", c.bdf);
                continue;
            }
            let got = self.rebind(&c.bdf, Some(driver))?;
            if got.as_deref() != Some(driver) {
                return Err(msg(format!(
                    "{}: bound to {} instead of {driver} after drivers_probe (see dmesg)",
                    c.bdf,
                    got.as_deref().unwrap_or("no driver")
                )));
            }
            let from = c.driver.as_deref().unwrap_or("no driver");
            let _ = write!(out, "{}: {from} -> {driver}", c.bdf);
            if driver == "vfio-pci" {
                if let Some(g) = c.iommu_group {
                    let _ = write!(out, " (/dev/vfio/{g})");
                    let pci = self.pci();
                    let others: Vec<String> = pci
                        .iommu_group_devices(g)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|o| *o != c.bdf)
                        .filter(|o| {
                            let dr = pci.driver(o).ok().flatten();
                            !matches!(dr.as_deref(), None | Some("vfio-pci") | Some("pcieport"))
                        })
                        .collect();
                    if !others.is_empty() {
                        let _ = write!(
                            out,
                            "\n  warning: IOMMU group {g} also holds {} bound to kernel drivers; \
                             VFIO needs the whole group (bind them too)",
                            others.join(", ")
                        );
                    }
                }
            }
            let _ = writeln!(out);
        }
        Ok(())
    }

    pub fn reset(&self, bdfs: &[String], out: &mut String) -> Result<(), SetupError> {
        let targets: Vec<String> = if bdfs.is_empty() {
            self.controllers()?
                .into_iter()
                .filter(|c| {
                    c.driver
                        .as_deref()
                        .is_some_and(|d| USER_DRIVERS.contains(&d))
                })
                .map(|c| c.bdf)
                .collect()
        } else {
            bdfs.iter()
                .map(|b| normalize_bdf(b))
                .collect::<Result<_, _>>()?
        };
        if targets.is_empty() {
            let _ = writeln!(out, "no controller is bound to vfio-pci or uio_pci_generic");
            return Ok(());
        }
        // Check every target first (exists, is NVMe): a typo must be named
        // before modprobe runs or any controller is moved.
        let mut targets = targets;
        dedup_in_order(&mut targets);
        let ctrls = targets
            .iter()
            .map(|bdf| self.controller(bdf))
            .collect::<Result<Vec<_>, _>>()?;
        if let Err(e) = (self.modprobe)("nvme") {
            if !self.pci().has_driver("nvme") {
                return Err(msg(format!("kernel nvme driver not available: {e}")));
            }
        }
        for c in ctrls {
            let bdf = c.bdf.as_str();
            if c.driver.as_deref() == Some("nvme") {
                let _ = writeln!(out, "{bdf}: already bound to nvme");
                continue;
            }
            let got = self.rebind(bdf, None)?;
            let from = c.driver.as_deref().unwrap_or("no driver");
            match got.as_deref() {
                Some("nvme") => {
                    let _ = writeln!(out, "{bdf}: {from} -> nvme");
                }
                other => {
                    return Err(msg(format!(
                        "{bdf}: not picked up by the nvme driver (now: {}); see dmesg",
                        other.unwrap_or("no driver")
                    )))
                }
            }
        }
        Ok(())
    }

    pub fn hugepages(&self, count: u32, out: &mut String) -> Result<(), SetupError> {
        let dir = self.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        if !dir.exists() {
            return Err(msg("this kernel has no 2 MiB hugepage support"));
        }
        self.write(&dir.join("nr_hugepages"), &count.to_string())?;
        let got: u64 = read_trim(&dir.join("nr_hugepages"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let free: u64 = read_trim(&dir.join("free_hugepages"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "2 MiB hugepages: {got} reserved ({} MiB), {free} free",
            got * 2
        );
        if got < count as u64 {
            let _ = writeln!(
                out,
                "warning: asked for {count}, the kernel found only {got} (memory is fragmented; \
                 reserve early after boot or with hugepages=N on the kernel command line)"
            );
        }
        Ok(())
    }

    pub fn list(&self, out: &mut String) -> Result<(), SetupError> {
        let ctrls = self.controllers()?;
        if ctrls.is_empty() {
            let _ = writeln!(
                out,
                "no NVMe controllers (PCI class {NVME_CLASS:#08x}) found"
            );
            return Ok(());
        }
        let _ = writeln!(
            out,
            "{:<13} {:<10} {:<16} {:<6} {:<24} USE",
            "BDF", "ID", "DRIVER", "IOMMU", "NAMESPACES"
        );
        for c in &ctrls {
            let ns = if c.block_devs.is_empty() {
                "-".to_string()
            } else {
                c.block_devs.join(",")
            };
            let usage = if c.in_use.is_empty() {
                match c.driver.as_deref() {
                    Some(d) if USER_DRIVERS.contains(&d) => "user space".to_string(),
                    _ => "free".to_string(),
                }
            } else {
                format!("IN USE: {}", c.in_use.join("; "))
            };
            let _ = writeln!(
                out,
                "{:<13} {:<10} {:<16} {:<6} {:<24} {usage}",
                c.bdf,
                c.ids,
                c.driver.as_deref().unwrap_or("-"),
                c.iommu_group.map_or("-".into(), |g| g.to_string()),
                ns,
            );
            if let Some(m) = &c.model {
                let _ = writeln!(out, "{:<13} model: {m}", "");
            }
        }
        let hp = self.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        if let (Some(n), Some(f)) = (
            read_trim(&hp.join("nr_hugepages")),
            read_trim(&hp.join("free_hugepages")),
        ) {
            let _ = writeln!(out, "2 MiB hugepages: {n} reserved, {f} free");
        }
        Ok(())
    }
}

pub fn run(cmd: SetupCommand) -> Result<(), SetupError> {
    let host = Host::default();
    let mut out = String::new();
    let r = match cmd {
        SetupCommand::List => host.list(&mut out),
        SetupCommand::Bind { bdf, driver } => host.bind(&bdf, &driver, &mut out),
        SetupCommand::Reset { bdf } => host.reset(&bdf, &mut out),
        SetupCommand::Hugepages { count } => host.hugepages(count, &mut out),
    };
    print!("{out}");
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake /sys + /proc with one controller bound to nvme (namespace
    /// nvme0n1 with partitions p1, p2) and one unbound.
    struct Fake {
        root: PathBuf,
    }

    impl Fake {
        fn new(tag: &str) -> Fake {
            let root =
                std::env::temp_dir().join(format!("pollux-setup-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            let sys = root.join("sys");
            let mk = |p: &Path| fs::create_dir_all(p).unwrap();
            let w = |p: PathBuf, s: &str| fs::write(p, s).unwrap();
            mk(&sys.join("bus/pci/drivers/nvme"));
            mk(&sys.join("kernel/iommu_groups/3/devices"));
            for (bdf, class) in [
                ("0000:01:00.0", "0x010802"),
                ("0000:02:00.0", "0x010802"),
                ("0000:03:00.0", "0x020000"),
            ] {
                let d = sys.join("bus/pci/devices").join(bdf);
                mk(&d);
                w(d.join("class"), &format!("{class}\n"));
                w(d.join("vendor"), "0x1b36\n");
                w(d.join("device"), "0x0010\n");
                w(d.join("driver_override"), "(null)\n");
            }
            let d1 = sys.join("bus/pci/devices/0000:01:00.0");
            symlink(sys.join("bus/pci/drivers/nvme"), d1.join("driver")).unwrap();
            symlink(sys.join("kernel/iommu_groups/3"), d1.join("iommu_group")).unwrap();
            mk(&d1.join("nvme/nvme0/nvme0n1"));
            w(d1.join("nvme/nvme0/model"), "QEMU NVMe Ctrl  \n");
            mk(&sys.join("block/nvme0n1/nvme0n1p1/holders"));
            mk(&sys.join("block/nvme0n1/nvme0n1p2/holders"));
            mk(&sys.join("block/nvme0n1/holders"));
            mk(&root.join("proc"));
            w(root.join("proc/mounts"), "proc /proc proc rw 0 0\n");
            w(
                root.join("proc/swaps"),
                "Filename Type Size Used Priority\n",
            );
            Fake { root }
        }

        fn host(&self) -> Host {
            Host {
                sys: self.root.join("sys"),
                proc_: self.root.join("proc"),
                dev: self.root.join("dev"),
                modprobe: |_| Ok(()),
                bind_timeout: Duration::from_millis(10),
            }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn lists_nvme_controllers_only() {
        let f = Fake::new("list");
        let h = f.host();
        let c = h.controllers().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].bdf, "0000:01:00.0");
        assert_eq!(c[0].driver.as_deref(), Some("nvme"));
        assert_eq!(c[0].iommu_group, Some(3));
        assert_eq!(c[0].kname.as_deref(), Some("nvme0"));
        assert_eq!(c[0].model.as_deref(), Some("QEMU NVMe Ctrl"));
        assert_eq!(c[0].block_devs, ["nvme0n1", "nvme0n1p1", "nvme0n1p2"]);
        assert_eq!(c[0].char_devs, ["nvme0", "ng0n1"]);
        assert!(c[0].in_use.is_empty());
        assert_eq!(c[1].driver, None);
        let mut out = String::new();
        h.list(&mut out).unwrap();
        assert!(out.contains("0000:01:00.0  1b36:0010  nvme"), "{out}");
        assert!(!out.contains("0000:03:00.0"));
    }

    #[test]
    fn mounted_swap_and_holders_refuse_bind() {
        let f = Fake::new("inuse");
        let h = f.host();
        fs::write(
            f.root.join("proc/mounts"),
            "/dev/nvme0n1p2 /mnt/my\\040data ext4 rw 0 0\n",
        )
        .unwrap();
        let c = h.controller("0000:01:00.0").unwrap();
        assert_eq!(
            c.in_use,
            ["/dev/nvme0n1p2 is mounted on /mnt/my data (ext4)"]
        );
        let mut out = String::new();
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err();
        assert!(
            e.to_string().contains("refusing to take 0000:01:00.0"),
            "{e}"
        );
        assert!(e.to_string().contains("mounted on /mnt/my data"), "{e}");

        fs::write(f.root.join("proc/mounts"), "").unwrap();
        fs::write(
            f.root.join("proc/swaps"),
            "Filename Type Size Used Priority\n/dev/nvme0n1p1 partition 1024 0 -2\n",
        )
        .unwrap();
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            ["/dev/nvme0n1p1 is in use as swap"]
        );

        fs::write(f.root.join("proc/swaps"), "").unwrap();
        fs::create_dir_all(f.root.join("sys/block/nvme0n1/nvme0n1p1/holders/dm-0")).unwrap();
        fs::create_dir_all(f.root.join("sys/block/dm-0/dm")).unwrap();
        fs::write(f.root.join("sys/block/dm-0/dm/name"), "vg-root\n").unwrap();
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            ["/dev/nvme0n1p1 is held by device-mapper vg-root (dm-0)"]
        );
    }

    /// A loop device with an ext4 file system mounted in a mount namespace
    /// of its own (a child `unshare -m` process): invisible in our
    /// /proc/mounts. Torn down on drop.
    struct ForeignMount {
        dir: PathBuf,
        loop_dev: String,
        child: std::process::Child,
    }

    impl ForeignMount {
        /// Err (the reason) where the host cannot do it: not root,
        /// no losetup/mkfs.ext4/unshare, no loop devices.
        fn new(tag: &str) -> Result<ForeignMount, String> {
            use std::io::BufRead;
            use std::process::{Command, Stdio};
            if fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
                return Err("needs root".into());
            }
            let dir =
                std::env::temp_dir().join(format!("pollux-setup-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("mnt")).map_err(|e| e.to_string())?;
            let img = dir.join("img");
            fs::File::create(&img)
                .and_then(|f| f.set_len(16 << 20))
                .map_err(|e| e.to_string())?;
            let run = |cmd: &mut Command| -> Result<String, String> {
                let o = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
                if !o.status.success() {
                    return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr)));
                }
                Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
            };
            run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img))?;
            let loop_dev = run(Command::new("losetup").args(["--find", "--show"]).arg(&img))?;
            let script = format!(
                "mount {loop_dev} {} && echo mounted && exec sleep 600",
                dir.join("mnt").display()
            );
            let child = Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c", &script])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) => {
                    let _ = Command::new("losetup").arg("-d").arg(&loop_dev).status();
                    return Err(format!("unshare: {e}"));
                }
            };
            let mut line = String::new();
            let out = child.stdout.take().expect("piped");
            let _ = std::io::BufReader::new(out).read_line(&mut line);
            let m = ForeignMount {
                dir,
                loop_dev,
                child,
            };
            if line.trim() != "mounted" {
                return Err(format!("mount in a new mount namespace failed ({line:?})"));
            }
            Ok(m)
        }
    }

    impl Drop for ForeignMount {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            // Busy until the namespace's mount is gone: then the kernel
            // detaches it by itself (autoclear).
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&self.loop_dev)
                .status();
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// A partition mounted in another mount namespace: /proc/mounts does
    /// not show it, the kernel's exclusive claim does. Its disk is busy too
    /// (here: the same loop device behind both names, as partitioned loop
    /// devices need a kernel with partition tables): only the partition is
    /// named. Before, `bind` took the controller (nothing in our
    /// /proc/mounts, no holder, no process of ours holding it open).
    #[test]
    fn mounted_in_another_mount_namespace_refuses_bind() {
        let m = match ForeignMount::new("mntns") {
            Ok(m) => m,
            Err(why) => {
                eprintln!("skipped: cannot mount a loop device in a new mount namespace: {why}");
                return;
            }
        };
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(!mounts.contains(&m.loop_dev), "visible here: {mounts}");
        let f = Fake::new("foreignmnt");
        fs::create_dir_all(f.root.join("dev")).unwrap();
        symlink(&m.loop_dev, f.root.join("dev/nvme0n1")).unwrap();
        symlink(&m.loop_dev, f.root.join("dev/nvme0n1p1")).unwrap();
        let h = f.host();
        let c = h.controller("0000:01:00.0").unwrap();
        assert_eq!(c.in_use.len(), 1, "{:?}", c.in_use);
        assert!(
            c.in_use[0].starts_with("/dev/nvme0n1p1 is busy: the kernel refuses to open it"),
            "{:?}",
            c.in_use
        );
        let mut out = String::new();
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to take 0000:01:00.0"), "{e}");
        assert!(e.contains("another mount namespace"), "{e}");
        // Once it is unmounted, the controller is free again.
        drop(m);
        assert!(h.controller("0000:01:00.0").unwrap().in_use.is_empty());
    }

    #[test]
    fn bind_checks_before_touching_anything() {
        let f = Fake::new("bind");
        let h = f.host();
        let mut out = String::new();
        // Not NVMe.
        let e = h
            .bind(&["0000:03:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err();
        assert!(e.to_string().contains("not an NVMe controller"), "{e}");
        // No IOMMU group: vfio-pci impossible, says what to do.
        let e = h
            .bind(&["0000:02:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err();
        assert!(e.to_string().contains("uio_pci_generic"), "{e}");
        // Bad address.
        assert!(h.bind(&["nonsense".into()], "vfio-pci", &mut out).is_err());
        // Driver missing after modprobe.
        let e = h
            .bind(&["0000:01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err();
        assert!(e.to_string().contains("vfio-pci is not available"), "{e}");
        // Nothing was written.
        let ov = fs::read_to_string(
            f.root
                .join("sys/bus/pci/devices/0000:01:00.0/driver_override"),
        )
        .unwrap();
        assert_eq!(ov, "(null)\n");
    }

    #[test]
    fn bind_writes_override_unbind_and_probe() {
        let f = Fake::new("bind2");
        let h = f.host();
        let drivers = f.root.join("sys/bus/pci/drivers");
        fs::create_dir_all(drivers.join("uio_pci_generic")).unwrap();
        let mut out = String::new();
        // The fake kernel never binds: reports what it found.
        let e = h
            .bind(&["0000:01:00.0".into()], "uio_pci_generic", &mut out)
            .unwrap_err();
        assert!(e.to_string().contains("instead of uio_pci_generic"), "{e}");
        let d = f.root.join("sys/bus/pci/devices/0000:01:00.0");
        assert_eq!(
            fs::read_to_string(d.join("driver_override")).unwrap(),
            "uio_pci_generic"
        );
        assert_eq!(
            fs::read_to_string(drivers.join("nvme/unbind")).unwrap(),
            "0000:01:00.0"
        );
        assert_eq!(
            fs::read_to_string(f.root.join("sys/bus/pci/drivers_probe")).unwrap(),
            "0000:01:00.0"
        );
    }

    /// Makes /proc/PID/fd/FD a link to `target` (and PID's comm).
    fn fake_fd(proc_: &Path, pid: u32, comm: &str, fd: u32, target: &Path) {
        let d = proc_.join(pid.to_string());
        fs::create_dir_all(d.join("fd")).unwrap();
        fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
        symlink(target, d.join("fd").join(fd.to_string())).unwrap();
    }

    #[test]
    fn processes_holding_a_device_refuse_bind() {
        let f = Fake::new("fds");
        let h = f.host();
        let (proc_, dev) = (f.root.join("proc"), f.root.join("dev"));
        let in_use = || h.controller("0000:01:00.0").unwrap().in_use;
        // Unrelated files, another controller's namespace, a non-PID entry.
        fake_fd(&proc_, 100, "bash", 0, Path::new("/dev/pts/0"));
        fake_fd(&proc_, 100, "bash", 1, Path::new("socket:[1234]"));
        fake_fd(&proc_, 100, "bash", 2, &dev.join("nvme1n1"));
        fake_fd(&proc_, 100, "bash", 3, &dev.join("nvme0n10"));
        symlink(proc_.join("100"), proc_.join("self")).unwrap();
        assert_eq!(in_use(), Vec::<String>::new());
        // This process (pollux itself) is not a culprit.
        fake_fd(
            &proc_,
            std::process::id(),
            "pollux",
            7,
            &dev.join("nvme0n1"),
        );
        assert_eq!(in_use(), Vec::<String>::new());

        // A partition (twice: one line), the controller's char device and
        // the namespace's generic char device.
        fake_fd(&proc_, 200, "fio", 5, &dev.join("nvme0n1p1"));
        fake_fd(&proc_, 200, "fio", 6, &dev.join("nvme0n1p1"));
        fake_fd(&proc_, 300, "nvme", 3, &dev.join("nvme0"));
        fake_fd(&proc_, 4000, "t/io_uring", 9, &dev.join("ng0n1"));
        let d = dev.display();
        assert_eq!(
            in_use(),
            [
                format!("{d}/nvme0n1p1 is open in process 200 (fio)"),
                format!("{d}/nvme0 is open in process 300 (nvme)"),
                format!("{d}/ng0n1 is open in process 4000 (t/io_uring)"),
            ]
        );
        let mut out = String::new();
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to take 0000:01:00.0"), "{e}");
        assert!(e.contains("nvme0n1p1 is open in process 200 (fio)"), "{e}");
    }

    /// The real /proc: a child holding a file open is found by its path
    /// (the file stands in for a device node).
    #[test]
    fn real_proc_scan_finds_a_child_holding_a_node() {
        let f = Fake::new("realproc");
        let node_path = f.root.join("dev/nvme9n1");
        fs::create_dir_all(f.root.join("dev")).unwrap();
        fs::write(&node_path, "").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(fs::File::open(&node_path).unwrap())
            .spawn()
            .unwrap();
        let node = Node {
            name: "nvme9n1".into(),
            path: node_path.clone(),
            block: true,
            devno: None,
        };
        // The child may still be between fork and exec (comm = ours).
        let mut why = Vec::new();
        for _ in 0..200 {
            why = open_by_processes(Path::new("/proc"), std::slice::from_ref(&node));
            if why.iter().any(|w| w.ends_with("(sleep)")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            why,
            [format!(
                "{} is open in process {} (sleep)",
                node_path.display(),
                child.id()
            )]
        );
    }

    /// A node opened under another path (a container's /dev) counts when
    /// its file name and device number match; a node of the wrong type or
    /// number does not.
    #[test]
    fn processes_holding_a_device_elsewhere_matched_by_number() {
        let f = Fake::new("fds-devno");
        let h = f.host();
        let proc_ = f.root.join("proc");
        let null = fs::metadata("/dev/null").unwrap().rdev();
        let null_no = format!("{}:{}\n", libc::major(null), libc::minor(null));
        let ctr = f.root.join("container/dev");
        fs::create_dir_all(&ctr).unwrap();
        // nvme0n1 is a block device: a char device with its number is not it.
        fs::write(f.root.join("sys/block/nvme0n1/dev"), &null_no).unwrap();
        symlink("/dev/null", ctr.join("nvme0n1")).unwrap();
        fake_fd(&proc_, 500, "dd", 4, &ctr.join("nvme0n1"));
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            Vec::<String>::new()
        );
        // The controller's char device: /dev/null stands in for it.
        let ctrl = f.root.join("sys/bus/pci/devices/0000:01:00.0/nvme/nvme0");
        fs::write(ctrl.join("dev"), &null_no).unwrap();
        symlink("/dev/null", ctr.join("nvme0")).unwrap();
        fake_fd(&proc_, 600, "nvme", 3, &ctr.join("nvme0"));
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            [format!(
                "{}/nvme0 is open in process 600 (nvme) as {}",
                f.root.join("dev").display(),
                ctr.join("nvme0").display()
            )]
        );
        // Same name, other number: not it.
        fs::write(ctrl.join("dev"), "242:0\n").unwrap();
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            Vec::<String>::new()
        );
    }

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    /// Makes `path` a sparse file of `size` bytes with `bytes` at `off`.
    fn put(path: &Path, size: u64, off: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        if f.metadata().unwrap().len() < size {
            f.set_len(size).unwrap();
        }
        f.write_all_at(bytes, off).unwrap();
    }

    /// Writes ZFS uberblock magics (little endian) into `path` at label
    /// `label_off` + 128 KiB + slot KiB, for each slot.
    fn put_uberblocks(path: &Path, size: u64, label_off: u64, slots: &[u64], big_endian: bool) {
        let magic: u64 = 0x00ba_b10c;
        let b = if big_endian {
            magic.to_be_bytes()
        } else {
            magic.to_le_bytes()
        };
        for s in slots {
            put(path, size, label_off + 128 * KIB + s * KIB, &b);
        }
    }

    /// Writes a btrfs superblock header (fsid, magic, num_devices).
    fn put_btrfs(path: &Path, size: u64, fsid: [u8; 16], num_devices: u64) {
        let mut sb = vec![0u8; 0x100];
        sb[0x20..0x30].copy_from_slice(&fsid);
        sb[0x30..0x38].copy_from_slice(&(64 * KIB).to_le_bytes());
        sb[0x40..0x48].copy_from_slice(b"_BHRfS_M");
        sb[0x88..0x90].copy_from_slice(&num_devices.to_le_bytes());
        put(path, size, 64 * KIB, &sb);
    }

    const FSID_A: [u8; 16] = [
        0x4f, 0x6b, 0x1c, 0x2d, 0x3e, 0x4f, 0x40, 0x51, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7, 0xe8,
        0xf9,
    ];
    const FSID_A_STR: &str = "4f6b1c2d-3e4f-4051-8293-a4b5c6d7e8f9";

    #[test]
    fn zfs_labels_found_by_uberblock_magic() {
        let f = Fake::new("zfs-probe");
        let dir = f.root.join("img");
        fs::create_dir_all(&dir).unwrap();
        let probe = |name: &str| Content::probe(&dir.join(name), &[]).unwrap().zfs;
        // Nothing.
        put(&dir.join("empty"), 64 * MIB, 0, &[0]);
        assert!(!probe("empty"));
        // Four uberblocks in L0 (little endian); three are not enough.
        put_uberblocks(&dir.join("l0"), 64 * MIB, 0, &[0, 4, 9, 127], false);
        assert!(probe("l0"));
        put_uberblocks(&dir.join("three"), 64 * MIB, 0, &[0, 4, 9], false);
        assert!(!probe("three"));
        // Big endian, spread over L1 and the end labels of a device whose
        // size is not a multiple of 256 KiB (L2, L3 sit below the rounded
        // end).
        let size = 64 * MIB + 100 * KIB;
        let end = 64 * MIB;
        let be = dir.join("be");
        put_uberblocks(&be, size, 256 * KIB, &[3], true);
        put_uberblocks(&be, size, end - 512 * KIB, &[3], true);
        put_uberblocks(&be, size, end - 256 * KIB, &[3, 100], true);
        assert!(probe("be"));
        // Eight at the unrounded end: not where ZFS puts them (these slots
        // fall outside the rounded labels' rings).
        let off = dir.join("unrounded");
        put_uberblocks(&off, size, size - 512 * KIB, &[30, 40, 50, 60], true);
        put_uberblocks(&off, size, size - 256 * KIB, &[30, 40, 50, 60], true);
        assert!(!probe("unrounded"));
        // The magic off the 1 KiB grid, or outside the ring: not labels.
        let skew = dir.join("skew");
        for slot in [0, 4, 9, 127] {
            put(
                &skew,
                64 * MIB,
                128 * KIB + slot * KIB + 8,
                &0x00ba_b10cu64.to_le_bytes(),
            );
        }
        for k in [16, 17, 64, 127] {
            put(&skew, 64 * MIB, k * KIB, &0x00ba_b10cu64.to_le_bytes());
        }
        assert!(!probe("skew"));
        // A 512 KiB device: L2/L3 coincide with L0/L1, counted once.
        put_uberblocks(&dir.join("small"), 512 * KIB, 0, &[1, 2], false);
        assert!(!probe("small"));
        put_uberblocks(&dir.join("small"), 512 * KIB, 256 * KIB, &[1, 2], false);
        assert!(probe("small"));
        // Shorter than one label: no ZFS, no error.
        put(&dir.join("tiny"), 4 * KIB, 0, &[1]);
        assert_eq!(
            Content::probe(&dir.join("tiny"), &[]).unwrap(),
            Content::default()
        );
    }

    #[test]
    fn btrfs_superblock_read() {
        let f = Fake::new("btrfs-probe");
        let dir = f.root.join("img");
        fs::create_dir_all(&dir).unwrap();
        let probe = |name: &str| Content::probe(&dir.join(name), &[]).unwrap();
        put_btrfs(&dir.join("a"), 64 * MIB, FSID_A, 3);
        assert_eq!(
            probe("a"),
            Content {
                zfs: false,
                btrfs: Some(BtrfsMember {
                    fsid: FSID_A_STR.into(),
                    num_devices: 3
                })
            }
        );
        // The magic at the superblock's start (not at 0x40): not btrfs.
        put(&dir.join("b"), 64 * MIB, 64 * KIB, b"_BHRfS_M");
        assert_eq!(probe("b").btrfs, None);
        // A file ending inside the superblock.
        put(
            &dir.join("c"),
            64 * KIB + 0x48,
            64 * KIB + 0x40,
            b"_BHRfS_M",
        );
        assert_eq!(probe("c").btrfs, None);
        // Inside a partition (of a whole disk): the partition's.
        assert_eq!(
            Content::probe(&dir.join("a"), &[(32 * KIB, 65 * KIB)]).unwrap(),
            Content::default()
        );
        assert!(Content::probe(&dir.join("missing"), &[]).is_err());
    }

    #[test]
    fn zfs_vdevs_refuse_bind() {
        let f = Fake::new("zfs");
        let h = f.host();
        let dev = f.root.join("dev");
        fs::create_dir_all(&dev).unwrap();
        for d in ["nvme0n1", "nvme0n1p1", "nvme0n1p2"] {
            put(&dev.join(d), 64 * MIB, 0, &[0]);
        }
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            Vec::<String>::new()
        );
        put_uberblocks(&dev.join("nvme0n1p2"), 64 * MIB, 0, &[0, 1, 5, 127], false);
        let d = dev.display();
        let want = format!(
            "{d}/nvme0n1p2 is a ZFS vdev (zfs_member label; `zpool labelclear` it if its pool \
             is gone)"
        );
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            std::slice::from_ref(&want)
        );
        let mut out = String::new();
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to take 0000:01:00.0"), "{e}");
        assert!(e.contains(&want), "{e}");
    }

    /// A partition's labels seen through the whole disk (a partition
    /// starting at 16 KiB puts them on the disk's label grid) name the
    /// partition only; a label outside every partition names the disk.
    #[test]
    fn zfs_labels_inside_partitions_are_not_the_disks() {
        let f = Fake::new("zfs-disk");
        let h = f.host();
        let dev = f.root.join("dev");
        fs::create_dir_all(&dev).unwrap();
        let blk = f.root.join("sys/block/nvme0n1");
        // p1: sectors 32.. (16 KiB), 32 MiB; p2: 40 MiB.., 8 MiB.
        for (p, start, size) in [("nvme0n1p1", 32, 65536), ("nvme0n1p2", 81920, 16384)] {
            fs::write(blk.join(p).join("start"), format!("{start}\n")).unwrap();
            fs::write(blk.join(p).join("size"), format!("{size}\n")).unwrap();
        }
        put(&dev.join("nvme0n1p2"), 8 * MIB, 0, &[0]);
        put_uberblocks(&dev.join("nvme0n1p1"), 32 * MIB, 0, &[4, 5, 6, 7], false);
        put_uberblocks(
            &dev.join("nvme0n1"),
            64 * MIB,
            16 * KIB,
            &[4, 5, 6, 7],
            false,
        );
        let d = dev.display();
        let p1 = format!(
            "{d}/nvme0n1p1 is a ZFS vdev (zfs_member label; `zpool labelclear` it if its pool \
             is gone)"
        );
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            std::slice::from_ref(&p1)
        );
        // The disk's own end labels (past p2, which ends at 48 MiB).
        put_uberblocks(
            &dev.join("nvme0n1"),
            64 * MIB,
            64 * MIB - 256 * KIB,
            &[9, 10],
            false,
        );
        put_uberblocks(
            &dev.join("nvme0n1"),
            64 * MIB,
            64 * MIB - 512 * KIB,
            &[9, 10],
            false,
        );
        assert_eq!(
            h.controller("0000:01:00.0").unwrap().in_use,
            [p1.replace("nvme0n1p1", "nvme0n1"), p1]
        );
    }

    #[test]
    fn btrfs_members_refuse_bind() {
        let f = Fake::new("btrfs");
        let h = f.host();
        let dev = f.root.join("dev");
        fs::create_dir_all(&dev).unwrap();
        let in_use = || h.controller("0000:01:00.0").unwrap().in_use;
        let d = dev.display();
        // A one-device btrfs that is not mounted: free.
        put(&dev.join("nvme0n1"), 64 * MIB, 0, &[0]);
        put_btrfs(&dev.join("nvme0n1p2"), 64 * MIB, FSID_A, 1);
        assert_eq!(in_use(), Vec::<String>::new());
        // Mounted through another device (its sysfs lists this one too).
        let fsdir = f.root.join("sys/fs/btrfs").join(FSID_A_STR);
        fs::create_dir_all(fsdir.join("devices")).unwrap();
        symlink(
            "../../../../devices/x/block/sda/sda3",
            fsdir.join("devices/sda3"),
        )
        .unwrap();
        symlink(
            "../../../../devices/y/block/nvme0n1/nvme0n1p2",
            fsdir.join("devices/nvme0n1p2"),
        )
        .unwrap();
        let mounted = format!(
            "{d}/nvme0n1p2 is a member of the mounted btrfs {FSID_A_STR} (devices: nvme0n1p2, sda3)"
        );
        assert_eq!(in_use(), std::slice::from_ref(&mounted));
        let mut out = String::new();
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&mounted), "{e}");
        fs::remove_dir_all(&fsdir).unwrap();

        // Not mounted, two devices, one of them elsewhere.
        put_btrfs(&dev.join("nvme0n1p2"), 64 * MIB, FSID_A, 2);
        let split = format!(
            "{d}/nvme0n1p2 is one of 2 devices of btrfs {FSID_A_STR}, 1 of them not on this \
             controller"
        );
        assert_eq!(in_use(), std::slice::from_ref(&split));
        let e = h
            .bind(&["01:00.0".into()], "vfio-pci", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&split), "{e}");
        // Both devices on this controller (and not mounted): free.
        put_btrfs(&dev.join("nvme0n1p1"), 64 * MIB, FSID_A, 2);
        assert_eq!(in_use(), Vec::<String>::new());
    }

    thread_local! {
        /// `modprobe` calls made by the current test's thread.
        static MODPROBES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    fn counting_modprobe(name: &str) -> Result<(), String> {
        MODPROBES.with(|m| m.borrow_mut().push(name.to_string()));
        Ok(())
    }

    #[test]
    fn reset_names_a_missing_device_before_touching_anything() {
        let f = Fake::new("reset-missing");
        let h = Host {
            modprobe: counting_modprobe,
            ..f.host()
        };
        let mut out = String::new();
        // 0000:02:00.0 exists (no driver), 0000:00:99.0 does not: nothing
        // may be written for either, and modprobe must not run.
        let e = h
            .reset(&["0000:02:00.0".into(), "00:99.0".into()], &mut out)
            .unwrap_err()
            .to_string();
        let path = f.root.join("sys/bus/pci/devices/0000:00:99.0");
        assert!(
            e.contains(&format!(
                "no PCI device 0000:00:99.0 ({} does not exist)",
                path.display()
            )),
            "{e}"
        );
        assert_eq!(MODPROBES.with(|m| m.borrow().clone()), Vec::<String>::new());
        let d2 = f.root.join("sys/bus/pci/devices/0000:02:00.0");
        assert_eq!(
            fs::read_to_string(d2.join("driver_override")).unwrap(),
            "(null)\n"
        );
        assert!(!f.root.join("sys/bus/pci/drivers_probe").exists());
        // Not an NVMe controller: also refused before modprobe.
        let e = h
            .reset(&["0000:03:00.0".into()], &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0000:03:00.0 is not an NVMe controller"), "{e}");
        assert_eq!(MODPROBES.with(|m| m.borrow().len()), 0);
        assert!(out.is_empty(), "{out}");
        // A controller named twice is handled once.
        h.reset(&["0000:01:00.0".into(), "01:00.0".into()], &mut out)
            .unwrap();
        assert_eq!(out, "0000:01:00.0: already bound to nvme\n");
        assert_eq!(MODPROBES.with(|m| m.borrow().clone()), ["nvme"]);
    }

    #[test]
    fn hugepages_reports_shortfall() {
        let f = Fake::new("huge");
        let h = f.host();
        let hp = f.root.join("sys/kernel/mm/hugepages/hugepages-2048kB");
        fs::create_dir_all(&hp).unwrap();
        fs::write(hp.join("free_hugepages"), "0\n").unwrap();
        let mut out = String::new();
        h.hugepages(8, &mut out).unwrap();
        assert!(out.contains("8 reserved (16 MiB)"), "{out}");
    }
}
