//! Background reads on a bounded set of threads that live only while there
//! is work: a queue of jobs, drained by at most `most` threads, each of
//! which ends when it finds the queue empty. Parquet's row-group
//! read-ahead runs on one (`wick-parquet-ahead`, at most 8 a source).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    threads: usize,
}

/// A queue of background jobs and the threads draining it.
pub(crate) struct Jobs {
    name: &'static str,
    most: usize,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = crate::sync::lock(&self.state);
        f.debug_struct("Jobs")
            .field("name", &self.name)
            .field("queued", &s.queue.len())
            .field("threads", &s.threads)
            .finish()
    }
}

impl Jobs {
    /// Jobs run on threads named `name`, at most `most` (at least 1) at
    /// once.
    pub(crate) fn new(name: &'static str, most: usize) -> Self {
        Self {
            name,
            most: most.max(1),
            state: Arc::default(),
        }
    }

    /// Queues `job`, starting a thread for it while fewer than `most` run.
    /// Jobs are work ahead of need: one that cannot get a thread (the
    /// system refuses one and none runs) is dropped, and its read is done
    /// when it is needed instead.
    pub(crate) fn push(&self, job: impl FnOnce() + Send + 'static) {
        let mut s = crate::sync::lock(&self.state);
        s.queue.push_back(Box::new(job));
        if s.threads >= self.most {
            return;
        }
        let state = self.state.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || drain(&state));
        match spawned {
            Ok(_) => s.threads += 1,
            Err(_) if s.threads == 0 => s.queue.clear(),
            Err(_) => {}
        }
    }

    /// Jobs queued and not yet started.
    #[cfg(test)]
    fn queued(&self) -> usize {
        crate::sync::lock(&self.state).queue.len()
    }
}

/// A thread of [`Jobs`]: runs queued jobs until none is left. A job that
/// panics is that job's end, not the thread's count's.
fn drain(state: &Mutex<State>) {
    loop {
        let job = {
            let mut s = crate::sync::lock(state);
            match s.queue.pop_front() {
                Some(job) => job,
                None => {
                    s.threads -= 1;
                    return;
                }
            }
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every job runs, a panicking one included, never more than the
    /// allowed threads at once, and the threads end with the queue.
    #[test]
    fn jobs_run_on_at_most_their_threads() {
        let jobs = Jobs::new("wick-test-jobs", 2);
        let (running, most, done) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        for i in 0..20 {
            let (running, most, done) = (running.clone(), most.clone(), done.clone());
            jobs.push(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
                running.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                if i == 5 {
                    panic!("a job that panics");
                }
            });
        }
        let ended = || crate::sync::lock(&jobs.state).threads == 0;
        while done.load(Ordering::SeqCst) < 20 || !ended() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(most.load(Ordering::SeqCst) <= 2);
        assert_eq!(jobs.queued(), 0);
    }
}
