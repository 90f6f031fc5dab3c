//! Log files (`lockstep replay FILE`, `lockstep import`): JSON Lines and
//! MessagePack, through `schemas::log`'s public reader (format detection,
//! then each record, ids verified), the MessagePack reader over a whole
//! buffer, and one record as NATS delivers it (a MessagePack envelope).

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

use lockstep_schemas::log::LogReader;

/// More records than any input of the campaign can hold: a reader that
/// yields records without consuming input is a hang, caught by the bound.
const RECORDS_MAX: usize = 1 << 20;

fn drain<R: std::io::BufRead>(reader: LogReader<R>) {
    for (n, item) in reader.enumerate() {
        assert!(n < RECORDS_MAX, "the reader does not end");
        if item.is_err() {
            break;
        }
    }
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        if let Ok(reader) = LogReader::detect(data) {
            drain(reader);
        }
        drain(LogReader::json_lines(data));
        drain(LogReader::msgpack(data.to_vec()));
        let _ = rmp_serde::from_slice::<lockstep_schemas::Envelope>(data);
    });
}
