//! `scontrol show node|job|partition -o` output, one object a line.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

use lockstep_connectors::slurm::scontrol;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        // scontrol's output reaches lockstep as text (lossy UTF-8).
        let text = String::from_utf8_lossy(data);
        let _ = scontrol::parse_nodes(&text);
        let _ = scontrol::parse_jobs(&text);
        let _ = scontrol::parse_partitions(&text);
    });
}
