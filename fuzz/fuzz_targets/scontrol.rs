//! `scontrol show node|job|partition|reservation -o` output, one object a
//! line.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

use lockstep_connectors::slurm::scontrol;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        // scontrol's output reaches lockstep as text (lossy UTF-8), and each
        // answer goes to the parser of the command that printed it: told
        // here by its first key, as each command's first field is.
        let text = String::from_utf8_lossy(data);
        let first = text.trim_start();
        if first.starts_with("JobId=") {
            let _ = scontrol::parse_jobs(&text);
        } else if first.starts_with("PartitionName=") {
            let _ = scontrol::parse_partitions(&text);
        } else if first.starts_with("ReservationName=") {
            for line in text.lines() {
                let _ = scontrol::parse_reservation(line);
            }
        } else {
            let _ = scontrol::parse_nodes(&text);
        }
    });
}
