//! Process-wide allocator settings for the long, allocation-heavy commands.

/// Makes glibc keep freed memory for reuse instead of returning every large block to the kernel.
///
/// A training step allocates and frees the same few hundred activation and gradient buffers of
/// 1–100 MB each; an ingest builds and frees one batch of column buffers (tens of MB) after
/// another. With glibc's defaults every such block is a fresh mmap whose pages the kernel
/// zero-fills again: ~27% of a SmolLM2-shaped step (perf, `swelake bench train`), ~7% of an
/// ingest (`swelake bench ingest`). The cost is that resident memory stays at the peak, which
/// these processes reach anyway. Returns whether the setting took.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; it is called before the
        // allocations it affects and does not invalidate existing blocks.
        unsafe {
            let big = libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30) == 1
                || libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1;
            big && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Caps how many malloc arenas glibc keeps (unless `MALLOC_ARENA_MAX` is set, which glibc
/// reads itself). Returns the cap set, if any.
///
/// glibc gives threads their own arenas, up to eight per core, and an arena keeps the memory
/// freed into it. A lakehouse command runs a tokio runtime, a blocking pool and DataFusion's
/// partitions on many threads, each of which builds and frees Arrow batches in turn: with the
/// default, a 24-hour ingest held 1.9 GB resident for 0.5 GB in use, and `run --all` over a
/// generated day 2.5 GB; with one arena per core (at most 8), 0.6 GB and 1.2 GB, at the same
/// speed (`swelake bench jobs`). Call it before the threads start.
pub fn cap_arenas() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let max = cores.clamp(2, 8);
        // SAFETY: mallopt only changes allocator parameters; arenas already made stay valid.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, max as i32) == 1 };
        ok.then_some(max)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}
