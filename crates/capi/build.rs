//! Writes include/pollux.h with cbindgen (a build dependency, so the
//! header can never lag the sources it is made from), and only when its
//! text changes (an unchanged header is left alone: its timestamp does not
//! rebuild C programs).
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let cfg = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen: header")
        .write(&mut out);
    let path = dir.join("include/pollux.h");
    if std::fs::read(&path).ok().as_deref() != Some(&out[..]) {
        std::fs::create_dir_all(dir.join("include")).expect("include/");
        std::fs::write(&path, &out).expect("include/pollux.h");
    }
}
