//! The windows of `seq_len + 1` tokens an epoch reads from token files,
//! planned for one rank: non-overlapping or at random offsets, a pure
//! function of `(seed, epoch)`.

use crate::error::{Error, Result};
use crate::order::permute::Permutation;
use crate::rng::{keyed_rng, Purpose};
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
    /// Windows before each file, and in all (last): `lens.len() + 1`.
    before: Vec<usize>,
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
        let mut before = Vec::with_capacity(lens.len() + 1);
        let mut sum = 0usize;
        before.push(0);
        for &len in &lens {
            sum = sum.saturating_add(len.saturating_sub(1) / seq_len);
            before.push(sum);
        }
        let w = Self {
            lens,
            before,
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

    pub(super) fn total(&self) -> usize {
        *self.before.last().expect("the total")
    }

    /// The file that holds window `k` of the files' windows counted in
    /// order (`k` below the total), and `k`'s place in it.
    fn file_of(&self, k: usize) -> (usize, usize) {
        // The last file whose windows start at or before `k` and has some.
        let file = self.before.partition_point(|&b| b <= k) - 1;
        (file, k - self.before[file])
    }

    /// Window `i` of `epoch` in the random order: a file by its share of
    /// the windows, then any start in it, from `(seed, epoch, i)` (the
    /// stream [`Sample::rng`](crate::map::Sample::rng) gives sample `i`).
    pub fn random_window(&self, epoch: u64, i: usize) -> WindowStart {
        self.random_window_seeded(self.seed, epoch, i)
    }

    pub(super) fn random_window_seeded(&self, seed: u64, epoch: u64, i: usize) -> WindowStart {
        let mut rng = keyed_rng(seed, epoch, Purpose::Sample, i as u64);
        let (file, _) = self.file_of(rng.random_range(0..self.total()));
        let last = self.lens[file] - self.seq_len - 1;
        WindowStart {
            file,
            token: rng.random_range(0..=last),
        }
    }

    /// The `k`-th non-overlapping window, counting through the files in
    /// order; `None` past the last.
    pub fn fixed_window(&self, k: usize) -> Option<WindowStart> {
        if k >= self.total() {
            return None;
        }
        let (file, k) = self.file_of(k);
        Some(WindowStart {
            file,
            token: k * self.seq_len,
        })
    }

    /// Windows per epoch for each rank (equal on every rank: the tail that
    /// cannot go to all of them is left out that epoch).
    pub fn per_rank(&self) -> usize {
        self.total() / self.world_size
    }

    /// This rank's window starts for `epoch`, in order: the epoch's
    /// positions `rank, rank + world_size, ...`, each computed on its own
    /// (no table of every rank's windows).
    pub fn plan(&self, epoch: u64) -> Vec<WindowStart> {
        let positions = (0..self.per_rank()).map(|j| self.rank + j * self.world_size);
        match self.order {
            WindowOrder::NonOverlapping => {
                // The sampler's permutation, from the same `(seed, epoch)` key.
                let p =
                    Permutation::new(self.total() as u64, self.seed, epoch, Purpose::Shuffle, 0);
                positions
                    .map(|i| {
                        self.fixed_window(p.at(i as u64) as usize)
                            .expect("a position below the total")
                    })
                    .collect()
            }
            WindowOrder::Random => positions.map(|i| self.random_window(epoch, i)).collect(),
        }
    }
}
