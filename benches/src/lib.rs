//! The benchmarks' own helpers. The synthetic logs they measure come from
//! `lockstep_testkit::gen`, which the tests share.

/// A binary of this workspace built beside the running program (an example
/// in `target/release/examples/` finds `target/release/lockstep`).
pub fn sibling_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("target dir")
        .join(name)
}
