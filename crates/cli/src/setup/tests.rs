use super::content::{BtrfsMember, Content};
use super::usage::{open_by_processes, Node};
use super::*;
use std::os::unix::fs::{symlink, MetadataExt};

/// A fake /sys + /proc with one controller bound to nvme (namespace
/// nvme0n1 with partitions p1, p2) and one unbound.
struct Fake {
    root: PathBuf,
}

impl Fake {
    fn new(tag: &str) -> Fake {
        let root = std::env::temp_dir().join(format!("pollux-setup-{tag}-{}", std::process::id()));
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
        let dir = std::env::temp_dir().join(format!("pollux-setup-{tag}-{}", std::process::id()));
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
    0x4f, 0x6b, 0x1c, 0x2d, 0x3e, 0x4f, 0x40, 0x51, 0x82, 0x93, 0xa4, 0xb5, 0xc6, 0xd7, 0xe8, 0xf9,
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
