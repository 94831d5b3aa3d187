//! The windows of `seq_len + 1` tokens an epoch reads from token files,
//! planned for one rank: non-overlapping or at random offsets, a pure
//! function of `(seed, epoch)`.

use crate::error::{Error, Result};
use crate::rng::{keyed_rng, Purpose};
use rand::seq::SliceRandom;
use rand::Rng;

/// Where an epoch's windows start: which file, which token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowStart {
    /// The file, as an index into the files given to [`TokenWindows::new`].
    pub file: usize,
    /// The first token of the window (`seq_len + 1` tokens from here).
    pub token: usize,
}

/// How an epoch's windows are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowOrder {
    /// Windows `seq_len` apart from each file's start, every token an input
    /// once per epoch; their order shuffled from `(seed, epoch)`.
    NonOverlapping,
    /// As many windows as `NonOverlapping` gives, each at a random offset
    /// of a random file (files weighted by their windows), from
    /// `(seed, epoch, index)`.
    Random,
}

/// The windows of `seq_len + 1` tokens over a set of token files, dealt to
/// data-parallel ranks.
#[derive(Debug, Clone)]
pub struct TokenWindows {
    /// Per file: how many tokens it holds.
    lens: Vec<usize>,
    pub(super) seq_len: usize,
    order: WindowOrder,
    seed: u64,
    rank: usize,
    world_size: usize,
}

impl TokenWindows {
    /// Windows of `seq_len + 1` tokens over files of `lens` tokens, for
    /// rank `rank` of `world_size`. An error when `seq_len` is 0, the rank
    /// is out of range, or the files hold fewer windows than ranks.
    pub fn new(
        lens: Vec<usize>,
        seq_len: usize,
        order: WindowOrder,
        seed: u64,
        (rank, world_size): (usize, usize),
    ) -> Result<Self> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if seq_len == 0 {
            return bad("seq_len must be at least 1".into());
        }
        if world_size == 0 || rank >= world_size {
            return bad(format!("rank {rank} of world size {world_size}"));
        }
        let w = Self {
            lens,
            seq_len,
            order,
            seed,
            rank,
            world_size,
        };
        let total = w.total();
        if total < world_size {
            return bad(format!(
                "the files hold {total} windows of {} tokens: fewer than the {world_size} ranks",
                seq_len + 1
            ));
        }
        Ok(w)
    }

    /// Non-overlapping windows of file `f`: starts `0, seq_len, ...` while
    /// `seq_len + 1` tokens remain.
    fn windows_in(&self, f: usize) -> usize {
        self.lens[f].saturating_sub(1) / self.seq_len
    }

    pub(super) fn total(&self) -> usize {
        (0..self.lens.len()).map(|f| self.windows_in(f)).sum()
    }

    /// Window `i` of `epoch` in the random order: a file by its share of
    /// the windows, then any start in it, from `(seed, epoch, i)` (the
    /// stream [`Sample::rng`](crate::map::Sample::rng) gives sample `i`).
    pub fn random_window(&self, epoch: u64, i: usize) -> WindowStart {
        self.random_window_seeded(self.seed, epoch, i)
    }

    pub(super) fn random_window_seeded(&self, seed: u64, epoch: u64, i: usize) -> WindowStart {
        let mut rng = keyed_rng(seed, epoch, Purpose::Sample, i as u64);
        let mut pick = rng.random_range(0..self.total());
        let mut file = 0;
        while pick >= self.windows_in(file) {
            pick -= self.windows_in(file);
            file += 1;
        }
        let last = self.lens[file] - self.seq_len - 1;
        WindowStart {
            file,
            token: rng.random_range(0..=last),
        }
    }

    /// The `k`-th non-overlapping window, counting through the files in
    /// order; `None` past the last.
    pub fn fixed_window(&self, mut k: usize) -> Option<WindowStart> {
        for file in 0..self.lens.len() {
            let n = self.windows_in(file);
            if k < n {
                return Some(WindowStart {
                    file,
                    token: k * self.seq_len,
                });
            }
            k -= n;
        }
        None
    }

    /// Windows per epoch for each rank (equal on every rank: the tail that
    /// cannot go to all of them is left out that epoch).
    pub fn per_rank(&self) -> usize {
        self.total() / self.world_size
    }

    /// This rank's window starts for `epoch`, in order.
    pub fn plan(&self, epoch: u64) -> Vec<WindowStart> {
        let total = self.total();
        let all: Vec<WindowStart> = match self.order {
            WindowOrder::NonOverlapping => {
                let mut all: Vec<WindowStart> = (0..self.lens.len())
                    .flat_map(|file| (0..self.windows_in(file)).map(move |k| (file, k)))
                    .map(|(file, k)| WindowStart {
                        file,
                        token: k * self.seq_len,
                    })
                    .collect();
                // The sampler's shuffle, from the same `(seed, epoch)` stream.
                all.shuffle(&mut keyed_rng(self.seed, epoch, Purpose::Shuffle, 0));
                all
            }
            WindowOrder::Random => (0..total).map(|i| self.random_window(epoch, i)).collect(),
        };
        let n = self.per_rank();
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .take(n)
            .collect()
    }
}
