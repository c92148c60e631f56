//! pollux-host — the host library every caller uses: transport IDs
//! (`trid`).
pub mod trid;
