//! `NoNvme`: the transport of a build without an NVMe backend. It has no
//! values, so a `Bdev<NoNvme>` can only be null, RAM or io_uring, and the
//! NVMe arms of every `match` compile away.
use pollux_nvme::transport::{
    AdminExec, CompletionQueue, CqeSink, QueueSpec, Registers, SubmissionQueue, Transport,
    WireCounters,
};
use pollux_nvme::DmaBuffer;
use pollux_nvme::{Error, SubmitError};
use pollux_spec::identify::IdentifyController;
use pollux_spec::Sqe;

/// A transport that cannot exist.
#[derive(Debug)]
pub enum NoNvme {}

impl Registers for NoNvme {
    fn read32(&self, _: usize) -> Result<u32, Error> {
        match *self {}
    }
    unsafe fn write32(&self, _: usize, _: u32) -> Result<(), Error> {
        match *self {}
    }
    fn read64(&self, _: usize) -> Result<u64, Error> {
        match *self {}
    }
    unsafe fn write64(&self, _: usize, _: u64) -> Result<(), Error> {
        match *self {}
    }
}

impl SubmissionQueue for NoNvme {
    unsafe fn push(
        &mut self,
        _: u16,
        _: Sqe,
        _: usize,
        _: u64,
        _: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError> {
        match *self {}
    }
    unsafe fn push_dealloc(&mut self, _: u16, _: u32, _: u64, _: u32) {
        match *self {}
    }
    fn publish(&mut self, _: u32) {
        match *self {}
    }
    fn flush(&mut self) {
        match *self {}
    }
    unsafe fn restart(&mut self) {
        match *self {}
    }
    fn max_data(&self) -> usize {
        match *self {}
    }
    fn counters(&self) -> WireCounters {
        match *self {}
    }
    fn reset_counters(&mut self) {
        match *self {}
    }
}

impl CompletionQueue for NoNvme {
    fn reap<S: CqeSink>(&mut self, _: u32, _: &mut S) -> u32 {
        match *self {}
    }
    fn release(&mut self, _: u32) {
        match *self {}
    }
    unsafe fn restart(&mut self) {
        match *self {}
    }
    fn entries(&self) -> u16 {
        match *self {}
    }
    fn counters(&self) -> WireCounters {
        match *self {}
    }
    fn reset_counters(&mut self) {
        match *self {}
    }
    fn ready(&self) -> bool {
        match *self {}
    }
}

impl Transport for NoNvme {
    type Sq = NoNvme;
    type Cq = NoNvme;
    type Regs = NoNvme;

    fn describe(&self) -> String {
        match *self {}
    }
    fn regs(&self) -> &NoNvme {
        self
    }
    fn alloc_dma(&self, _: usize) -> Result<DmaBuffer, Error> {
        match *self {}
    }
    fn max_queue_entries(&self) -> u32 {
        match *self {}
    }
    unsafe fn admin_queues(&self, _: u16) -> Result<(NoNvme, NoNvme), Error> {
        match *self {}
    }
    unsafe fn attach_admin(&self, _: &NoNvme, _: &NoNvme) -> Result<(), Error> {
        match *self {}
    }
    unsafe fn configure(&self, _: &mut AdminExec<'_>, _: &IdentifyController) -> Result<(), Error> {
        match *self {}
    }
    unsafe fn create_io_queues(
        &self,
        _: &mut AdminExec<'_>,
        _: &QueueSpec,
    ) -> Result<(NoNvme, NoNvme), Error> {
        match *self {}
    }
    unsafe fn recreate_io_queues(
        &self,
        _: &mut AdminExec<'_>,
        _: u16,
        _: &mut NoNvme,
        _: &mut NoNvme,
    ) -> Result<(), Error> {
        match *self {}
    }
    unsafe fn delete_io_queues(&self, _: &mut AdminExec<'_>, _: u16) -> Result<(), Error> {
        match *self {}
    }
}
