use super::dma::IovaAlloc;
use super::*;

#[test]
fn ioctl_numbers_match_linux() {
    // linux/vfio.h: VFIO_GET_API_VERSION = _IO(';', 100) = 0x3b64 ...
    assert_eq!(sys::GET_API_VERSION, 0x3b64);
    assert_eq!(sys::GROUP_GET_DEVICE_FD, 0x3b6a);
    assert_eq!(sys::IOMMU_MAP_DMA, 0x3b71);
    assert_eq!(sys::IOMMU_UNMAP_DMA, 0x3b72);
    assert_eq!(std::mem::size_of::<sys::RegionInfo>(), 32);
    assert_eq!(std::mem::size_of::<sys::DmaMap>(), 32);
    assert_eq!(std::mem::size_of::<sys::DmaUnmap>(), 24);
    assert_eq!(std::mem::size_of::<sys::IommuInfo>(), 24);
    // VFIO_DEVICE_GET_IRQ_INFO = _IO(';', 100 + 9), SET_IRQS = + 10.
    assert_eq!(sys::DEVICE_GET_IRQ_INFO, 0x3b6d);
    assert_eq!(sys::DEVICE_SET_IRQS, 0x3b6e);
    assert_eq!(std::mem::size_of::<sys::IrqInfo>(), 16);
    assert_eq!(std::mem::size_of::<sys::IrqSet>(), 20);
    assert_eq!(std::mem::offset_of!(sys::IrqSet, data), 20);
    assert_eq!(std::mem::align_of::<sys::IrqSet>(), 4);
}

#[test]
fn irq_set_layout() {
    // Enable vectors 0..3 with fds 7, 8, 9: header then the fds.
    let w = sys::irq_set(
        sys::IRQ_SET_DATA_EVENTFD | sys::IRQ_SET_ACTION_TRIGGER,
        sys::PCI_MSIX_IRQ_INDEX,
        0,
        3,
        &[7, 8, 9],
    );
    assert_eq!(w, [32, 0x24, 2, 0, 3, 7, 8, 9]);
    // Disable: DATA_NONE, count 0, no data.
    let w = sys::irq_set(
        sys::IRQ_SET_DATA_NONE | sys::IRQ_SET_ACTION_TRIGGER,
        sys::PCI_MSIX_IRQ_INDEX,
        0,
        0,
        &[],
    );
    assert_eq!(w, [20, 0x21, 2, 0, 0]);
}

#[test]
fn iova_alloc_respects_ranges_and_alignment() {
    let mut a = IovaAlloc {
        ranges: vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 39) - 1)],
        next: 0xfed0_0000,
    };
    // Does not fit below the hole: goes above it, 2 MiB aligned.
    let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
    assert_eq!(x, 0xff00_0000);
    let y = a.alloc(0x1000, 0x1000).unwrap();
    assert_eq!(y, x + 0x20_0000 + 0x1000);
    assert!(a.alloc(1 << 40, 0x1000).is_none());
}
