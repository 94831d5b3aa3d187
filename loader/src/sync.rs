//! The crate's two lock helpers: a lock that shrugs off poisoning and a
//! counted condition-variable wait.

/// Locks `m`, going on when another holder panicked: the data behind every
/// lock in this crate is kept consistent by plain stores, so poisoning
/// carries nothing to act on.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` once, counted in the waiter count that `waiting` picks out
/// of the guarded state, so a notifier can skip the wake-up (a system call
/// every time, waiters or not) when the count is 0. Poisoning is handled as
/// in [`lock`].
pub(crate) fn wait_counted<'a, T>(
    cv: &std::sync::Condvar,
    mut guard: std::sync::MutexGuard<'a, T>,
    waiting: fn(&mut T) -> &mut usize,
) -> std::sync::MutexGuard<'a, T> {
    *waiting(&mut guard) += 1;
    let mut guard = cv.wait(guard).unwrap_or_else(|p| p.into_inner());
    *waiting(&mut guard) -= 1;
    guard
}
