//! What the fuzz targets share: an allocator that turns any allocation
//! past the budget into a crash, so that AFL++ reports it like a panic.
//!
//! The acceptance bar of the campaigns is: no panic, no hang over 1 s (AFL's
//! `-t 1000`), no allocation beyond 1 GiB (this allocator: a single request
//! or the total live at once).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most a decoder may hold at once on any input, in bytes.
pub const ALLOCATED_BYTES_MAX: usize = 1 << 30;

/// The system allocator, aborting past [`ALLOCATED_BYTES_MAX`].
pub struct Bounded {
    live: AtomicUsize,
}

impl Bounded {
    /// A fresh counter.
    pub const fn new() -> Self {
        Self {
            live: AtomicUsize::new(0),
        }
    }

    fn charge(&self, bytes: usize) {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if bytes > ALLOCATED_BYTES_MAX || live > ALLOCATED_BYTES_MAX {
            // No allocation may happen here: write with the raw fd.
            let msg = b"fuzz: allocation beyond 1 GiB\n";
            let _ = std::io::Write::write_all(&mut std::io::stderr(), msg);
            std::process::abort();
        }
    }
}

impl Default for Bounded {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call forwards to `System` with the same arguments; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.charge(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.charge(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.live.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            self.charge(new_size - layout.size());
        } else {
            self.live
                .fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
