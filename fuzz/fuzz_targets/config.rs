//! The `lockstep run` configuration file (TOML), through `Config::load`:
//! decoding, path resolution and the checks.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

fn main() {
    // One file per fuzzing process, rewritten for each input.
    let path =
        std::env::temp_dir().join(format!("lockstep-fuzz-config-{}.toml", std::process::id()));
    afl::fuzz!(|data: &[u8]| {
        if std::fs::write(&path, data).is_ok() {
            if let Ok(cfg) = lockstep::config::Config::load(&path) {
                let _ = cfg.stream_limits();
            }
        }
    });
}
