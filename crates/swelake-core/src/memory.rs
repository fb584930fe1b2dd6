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
