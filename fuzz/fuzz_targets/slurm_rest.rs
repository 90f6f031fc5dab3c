//! slurmrestd answers (every openapi version: the parser reads them by
//! shape), through the parser's public functions: node, job and partition
//! lists and the error list of a failed answer.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

use lockstep_connectors::slurm::parse;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = parse::nodes(data);
        let _ = parse::jobs(data);
        let _ = parse::partitions(data);
        let _ = parse::errors(data);
    });
}
