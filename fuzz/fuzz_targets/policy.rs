//! Policy files (JSON), as `lockstep run` and `lockstep replay --policy`
//! read them: decoded and validated.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

fn main() {
    afl::fuzz!(|data: &[u8]| {
        if let Ok(text) = std::str::from_utf8(data) {
            if let Ok(policy) = lockstep_schemas::Policy::from_json(text) {
                // What was accepted must write out and read back the same.
                let again = serde_json::to_string(&policy).expect("a policy encodes");
                let back = lockstep_schemas::Policy::from_json(&again)
                    .expect("an accepted policy reads back");
                assert_eq!(back, policy, "policy round trip");
            }
        }
    });
}
