//! placeholder — filled in by the spec-structures work
