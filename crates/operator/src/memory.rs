//! Giving freed heap memory back to the system.

/// Returns the heap's free memory to the system. glibc keeps what was freed in its per-thread
/// arenas, so a burst of short-lived allocations (the pages of a list of every pod in the
/// cluster) would stay in the process's resident memory for good; musl's allocator (the static
/// build the image runs) returns it by itself, and this does nothing there.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
