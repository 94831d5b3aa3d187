//! Weighted mixtures of sources, placed by a deterministic greedy rule
//! ([`BlendRule`]): the order is a pure function of the weights, nothing
//! random, nothing to save but the loader's position. The placement is
//! computed position by position, in blocks of 65,536 positions: a
//! position costs its block's placement (cached),
//! nothing of the epoch's size is held, and a resume mid-epoch places one
//! block.
//!
//! - [`BlendRule::WithinOne`] (the default): at every 65,536th position
//!   each member holds its quota apportioned by largest remainder (within
//!   one sample; arithmetic, no pass over the epoch); between them,
//!   sample `n` goes to the member whose count would fall `1 - 1/(2k -
//!   2)` behind soonest (`k` members), among those it would not put that
//!   far ahead and that have not reached the next boundary's count
//!   (Tijdeman's rule for the chairman assignment problem, 1980). Over
//!   200 random weight sets of 2 to 8 members every prefix stayed within
//!   one sample of each quota (at most 0.93); a member of weight under
//!   1/65,536 can stray further between boundaries.
//! - [`BlendRule::Megatron`]: Megatron-Core's `build_blending_indices`
//!   (`helpers.cpp`) to the bit: sample `p` goes to the member with the
//!   largest `w[d] * max(p, 1) - taken[d]` (the first on a tie). Each pick
//!   depends on every pick before, so the first use of a weight set makes
//!   one pass over the epoch (about 1.5 s for 10^8 samples of three
//!   members), keeping only the counts at each block. Its prefixes can
//!   stray further (1.2 samples for weights 0.9 / 0.05 / 0.05 after 8
//!   samples; up to 1.74 over random weight sets): it is there to
//!   reproduce a Megatron blend.
//!
//! The weights are normalized to sum to 1, summed in order as NumPy sums a
//! few, so they are Megatron's to the bit.
//!
//! Within a member, its samples are taken in passes: each pass is a
//! permutation of the member drawn from `(seed, pass)` (its stored order
//! without a seed), and a member's passes continue from epoch to epoch, so
//! a member drawn below its size sees new samples each epoch, and one
//! drawn above it repeats each sample before any is seen a third time.

use crate::contract::{
    check_index, reads_through, Damage, EpochOrder, Parts, Record, Source, Value,
};
use crate::error::{Error, Result};
use crate::order::blend::Placement;
use crate::order::permute::Permutation;
use crate::rng::{keyed_rng, Purpose};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Several sources mixed by weight into one: each epoch holds
/// `len()` samples (the members' lengths added up), each member's share
/// its weight's, placed by Megatron's greedy rule (module docs). The
/// members give records the loader's map can read alike (the same parts
/// or windows); a map that reads by index from one member's own data
/// (such as [`TokenWindowsMap::megatron`](crate::map::TokenWindowsMap::megatron))
/// does not fit: use [`TokenWindowsMap::from_records`](crate::map::TokenWindowsMap::from_records)
/// or a map of record parts. A record's part `mixture` (when the map asks
/// for it) is its member's number, as [`Value::Int64`].
///
/// The loader takes each epoch's order from the mixture
/// ([`Source::begin_epoch`]), splits it across ranks and resumes it like
/// its own; with a [`shuffle`](crate::LoaderBuilder::shuffle) seed the
/// members are permuted and each global batch is shuffled across the
/// ranks (every global batch then holds each member's quota within one
/// sample), without one the epoch is the greedy order itself.
///
/// ```no_run
/// use candle_wick::source::{DocumentWindows, Megatron, Mixture};
/// use candle_wick::map::TokenWindowsMap;
/// use candle_wick::Loader;
/// # fn main() -> candle_wick::Result<()> {
/// let open = |p: &str| Megatron::open([p], 2048, DocumentWindows::Packed { eos: None });
/// let mix = Mixture::builder()
///     .add(open("data/web_text_document")?, 0.7)
///     .add(open("data/code_text_document")?, 0.2)
///     .add(open("data/books_text_document")?, 0.1)
///     // From epoch 3 on, more code.
///     .schedule(3, &[0.5, 0.4, 0.1])
///     .build()?;
/// let mut loader = Loader::builder(mix)
///     .map(TokenWindowsMap::from_records(2048, None))
///     .batch_size(8)
///     .shuffle(17)
///     .build()?;
/// # let _ = loader.epoch(0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mixture {
    inner: Arc<Inner>,
}

/// How a [`Mixture`] places its members' samples (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BlendRule {
    /// Every prefix of an epoch within one sample of each quota (module
    /// docs: arithmetic at every 65,536th position, Tijdeman's rule
    /// between; the default).
    #[default]
    WithinOne,
    /// Megatron-Core's `build_blending_indices`, to the bit.
    Megatron,
}

#[derive(Debug)]
struct Inner {
    members: Vec<Arc<dyn Source>>,
    rule: BlendRule,
    /// Member `d`'s first index, then the total.
    offsets: Vec<usize>,
    /// `(first epoch, weights normalized)`, by epoch, the first at 0.
    schedule: Vec<(u64, Vec<f64>)>,
    /// Each weight set's placement (computed once).
    placements: Mutex<HashMap<Vec<u64>, Arc<Placement>>>,
    /// The members' damage reports, in member order.
    damage: Vec<Damage>,
}

/// Builds a [`Mixture`]: [`Mixture::builder`].
#[derive(Debug, Default)]
pub struct MixtureBuilder {
    members: Vec<(Arc<dyn Source>, f64)>,
    schedule: Vec<(u64, Vec<f64>)>,
    rule: BlendRule,
}

impl MixtureBuilder {
    /// Adds `source` with weight `weight` (any non-negative number: the
    /// weights are normalized to sum to 1).
    pub fn add(mut self, source: impl Source, weight: f64) -> Self {
        self.members.push((Arc::new(source), weight));
        self
    }

    /// From epoch `epoch` on, the members' weights are `weights` (one a
    /// member, in the order they were added), until a later change.
    pub fn schedule(mut self, epoch: u64, weights: &[f64]) -> Self {
        self.schedule.push((epoch, weights.to_vec()));
        self
    }

    /// How samples are placed. Default [`BlendRule::WithinOne`].
    pub fn rule(mut self, rule: BlendRule) -> Self {
        self.rule = rule;
        self
    }

    /// The mixture; an error when there is no member, a weight is
    /// negative or not finite, an epoch's weights are all 0 or not one a
    /// member, a member with a weight is empty, or two changes name one
    /// epoch.
    pub fn build(self) -> Result<Mixture> {
        let bad = |m: String| Err(Error::InvalidConfig(format!("mixture: {m}")));
        if self.members.is_empty() {
            return bad("no member".into());
        }
        if self.members.len() > MAX_MEMBERS {
            return bad(format!(
                "{} members, over the {MAX_MEMBERS} a mixture holds (mix mixtures)",
                self.members.len()
            ));
        }
        let mut schedule = vec![(0, self.members.iter().map(|m| m.1).collect::<Vec<_>>())];
        let mut changes = self.schedule;
        changes.sort_by_key(|c| c.0);
        if let Some(w) = changes.windows(2).find(|w| w[0].0 == w[1].0) {
            return bad(format!("two weight changes at epoch {}", w[0].0));
        }
        for (epoch, weights) in changes {
            if epoch == 0 {
                schedule[0].1 = weights;
            } else {
                schedule.push((epoch, weights));
            }
        }
        for (epoch, weights) in &mut schedule {
            if weights.len() != self.members.len() {
                return bad(format!(
                    "{} weights from epoch {epoch} for {} members",
                    weights.len(),
                    self.members.len()
                ));
            }
            if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
                return bad(format!(
                    "weight {w} from epoch {epoch} is not a finite number >= 0"
                ));
            }
            // Summed in order, as NumPy sums a few weights: the normalized
            // weights are then Megatron's to the bit.
            let mut sum: f64 = weights.iter().fold(0.0, |a, w| a + w);
            if sum.is_infinite() {
                // Finite weights whose sum is not: scaled by the largest
                // first (the same proportions).
                let most = weights.iter().copied().fold(0.0, f64::max);
                weights.iter_mut().for_each(|w| *w /= most);
                sum = weights.iter().fold(0.0, |a, w| a + w);
            }
            if sum <= 0.0 {
                return bad(format!("the weights from epoch {epoch} are all 0"));
            }
            for (d, w) in weights.iter_mut().enumerate() {
                *w /= sum;
                if *w > 0.0 && self.members[d].0.is_empty() {
                    return bad(format!("member {d} is empty but has weight {w}"));
                }
            }
        }
        let mut offsets = vec![0usize];
        for (m, _) in &self.members {
            let total = offsets.last().copied().unwrap_or(0).checked_add(m.len());
            let Some(total) = total else {
                return bad("the members hold more samples than can be counted".into());
            };
            offsets.push(total);
        }
        let members: Vec<Arc<dyn Source>> = self.members.into_iter().map(|m| m.0).collect();
        let damage = members.iter().flat_map(|m| m.damage()).cloned().collect();
        Ok(Mixture {
            inner: Arc::new(Inner {
                members,
                rule: self.rule,
                offsets,
                schedule,
                placements: Mutex::default(),
                damage,
            }),
        })
    }
}

/// Members a mixture holds at most: an epoch's picks are 16-bit.
const MAX_MEMBERS: usize = u16::MAX as usize + 1;

impl Mixture {
    /// A mixture to build: add members with their weights.
    pub fn builder() -> MixtureBuilder {
        MixtureBuilder::default()
    }

    /// The members' weights in `epoch`, normalized.
    pub fn weights(&self, epoch: u64) -> &[f64] {
        let s = &self.inner.schedule;
        &s[s.partition_point(|c| c.0 <= epoch) - 1].1
    }

    /// The placement of one epoch of `weights`.
    fn placement(&self, weights: &[f64]) -> Arc<Placement> {
        let key: Vec<u64> = weights.iter().map(|w| w.to_bits()).collect();
        if let Some(p) = crate::sync::lock(&self.inner.placements).get(&key) {
            return p.clone();
        }
        let placement = Arc::new(Placement::new(weights, self.len(), self.inner.rule));
        crate::sync::lock(&self.inner.placements).insert(key, placement.clone());
        placement
    }

    /// Samples each member gives epoch `epoch`.
    pub fn counts(&self, epoch: u64) -> Vec<usize> {
        let placement = self.placement(self.weights(epoch));
        placement.counts().iter().map(|&c| c as usize).collect()
    }

    /// Samples each member gave the epochs before `epoch`.
    fn taken_before(&self, epoch: u64) -> Vec<u64> {
        let s = &self.inner.schedule;
        let mut taken = vec![0u64; self.inner.members.len()];
        for (i, (first, weights)) in s.iter().enumerate() {
            let end = s.get(i + 1).map_or(epoch, |next| next.0.min(epoch));
            if *first >= end {
                break;
            }
            let epochs = end - first;
            for (t, c) in taken.iter_mut().zip(self.placement(weights).counts()) {
                *t += epochs * c;
            }
        }
        taken
    }

    /// The member of index `index` and its index there.
    fn locate(&self, index: usize) -> Result<(usize, usize)> {
        check_index(index, self.len())?;
        let d = self.inner.offsets.partition_point(|&o| o <= index) - 1;
        Ok((d, index - self.inner.offsets[d]))
    }
}

impl Source for Mixture {
    fn len(&self) -> usize {
        *self.inner.offsets.last().expect("the total")
    }

    reads_through!(read_parts);

    fn read_parts(&self, index: usize, parts: &Parts, bytes: Vec<u8>) -> Result<Record> {
        let (d, i) = self.locate(index)?;
        let record = self.inner.members[d].read_parts(i, parts, bytes)?;
        Ok(if parts.wants("mixture") {
            record.with_part("mixture", Value::Int64(vec![d as i64]))
        } else {
            record
        })
    }

    fn key(&self, index: usize) -> String {
        match self.locate(index) {
            Ok((d, i)) => self.inner.members[d].key(i),
            Err(_) => format!("#{index}"),
        }
    }

    /// The members' lengths and digests, and the weight schedule.
    fn digest(&self) -> u32 {
        let mut text = format!("mixture {:?}", self.inner.rule);
        for m in &self.inner.members {
            text.push_str(&format!(" {}:{}", m.len(), m.digest()));
        }
        for (epoch, w) in &self.inner.schedule {
            text.push_str(&format!(" @{epoch}{w:?}"));
        }
        crc32c::crc32c(text.as_bytes())
    }

    fn wants_read_ahead(&self) -> bool {
        self.inner.members.iter().any(|m| m.wants_read_ahead())
    }

    fn memory(&self) -> u64 {
        self.inner.members.iter().map(|m| m.memory()).sum()
    }

    /// Every member's damage report: what was left out of the mixture.
    fn damage(&self) -> &[Damage] {
        &self.inner.damage
    }

    /// The placement of `epoch` (module docs), each member's draws
    /// continuing from the epochs before, computed position by position.
    fn begin_epoch(&self, seed: Option<u64>, epoch: u64) -> Option<Arc<dyn EpochOrder>> {
        Some(Arc::new(MixtureOrder {
            mix: self.clone(),
            placement: self.placement(self.weights(epoch)),
            taken: self.taken_before(epoch),
            seed,
            passes: Mutex::new(vec![None; self.inner.members.len()]),
        }))
    }
}

/// One epoch of a mixture, position by position: the member a position's
/// placement names, and that member's draw there.
#[derive(Debug)]
struct MixtureOrder {
    mix: Mixture,
    placement: Arc<Placement>,
    /// Each member's draws in the epochs before.
    taken: Vec<u64>,
    seed: Option<u64>,
    /// Each member's pass asked for last, and its order.
    passes: Mutex<Vec<Option<(u64, Pass)>>>,
}

/// The order of one pass over a member.
#[derive(Debug, Clone)]
enum Pass {
    /// The member's own ([`Source::begin_epoch`]: a Parquet member's block
    /// shuffle, a nested mixture's), from a seed of its own.
    Given(Arc<dyn EpochOrder>),
    /// The keyed permutation of `(seed, pass)`.
    Keyed(Permutation),
    /// The stored order (no seed).
    Stored,
}

impl MixtureOrder {
    /// Member `d`'s draw `t` (counted over the whole run): pass `t / len`
    /// of the member, at `t % len`.
    fn draw(&self, d: usize, t: u64) -> usize {
        let member = &self.mix.inner.members[d];
        let len = member.len() as u64;
        let (pass, i) = (t / len, t % len);
        let order = {
            let mut passes = crate::sync::lock(&self.passes);
            match &passes[d] {
                Some((p, order)) if *p == pass => order.clone(),
                _ => {
                    let member_seed = self.seed.map(|s| {
                        rand::RngCore::next_u64(&mut keyed_rng(
                            s,
                            0,
                            Purpose::MixturePass,
                            d as u64,
                        ))
                    });
                    let order = match (member.begin_epoch(member_seed, pass), self.seed) {
                        (Some(order), _) => Pass::Given(order),
                        (None, Some(seed)) => Pass::Keyed(Permutation::new(
                            len,
                            seed,
                            pass,
                            Purpose::MixturePass,
                            d as u64,
                        )),
                        (None, None) => Pass::Stored,
                    };
                    passes[d] = Some((pass, order.clone()));
                    order
                }
            }
        };
        match order {
            Pass::Given(order) => order.at(i as usize % order.len().max(1)),
            Pass::Keyed(p) => p.at(i) as usize,
            Pass::Stored => i as usize,
        }
    }
}

impl EpochOrder for MixtureOrder {
    fn len(&self) -> usize {
        self.mix.len()
    }

    fn at(&self, position: usize) -> usize {
        let (d, nth) = self.placement.at(position);
        self.mix.inner.offsets[d] + self.draw(d, self.taken[d] + nth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemorySource;

    fn member(n: usize) -> MemorySource {
        MemorySource::new(
            (0..n)
                .map(|i| Record::encoded(format!("{n}/{i}"), vec![1], i as u32))
                .collect(),
        )
    }

    #[test]
    fn epochs_hold_the_quotas_and_members_continue_their_passes() {
        let mix = Mixture::builder()
            .add(member(10), 1.0)
            .add(member(30), 3.0)
            .add(member(60), 1.0)
            .schedule(2, &[0.0, 1.0, 1.0])
            .build()
            .unwrap();
        assert_eq!(mix.len(), 100);
        assert_eq!(mix.counts(0), [20, 60, 20]);
        assert_eq!(mix.counts(2), [0, 50, 50]);
        let order = |seed, epoch| mix.begin_epoch(Some(seed), epoch).unwrap().to_vec();
        let e0 = order(4, 0);
        let e1 = order(4, 1);
        // Member 0 (10 samples, 20 draws an epoch): each sample twice an epoch.
        for e in [&e0, &e1] {
            let mut seen = vec![0; 10];
            e.iter().filter(|&&i| i < 10).for_each(|&i| seen[i] += 1);
            assert_eq!(seen, [2; 10]);
        }
        // Member 2 (60 samples, 20 draws an epoch): three epochs see all 60.
        let e2 = order(4, 2);
        let m2: std::collections::HashSet<usize> = [&e0, &e1]
            .into_iter()
            .flatten()
            .copied()
            .filter(|&i| i >= 40)
            .collect();
        assert_eq!(m2.len(), 40, "epochs 0 and 1 take 40 different samples");
        let first20: Vec<usize> = e2.iter().copied().filter(|&i| i >= 40).take(20).collect();
        assert!(first20.iter().all(|i| !m2.contains(i)), "epoch 2 goes on");
        assert!(e2.iter().all(|&i| i >= 10), "weight 0 is never drawn");
        // Deterministic, and the seed matters.
        assert_eq!(order(4, 1), e1);
        assert_ne!(order(5, 1), e1);
    }

    /// A member's damage report reaches the mixture: what opening a
    /// member left out is not lost by mixing it.
    #[test]
    fn a_mixture_reports_its_members_damage() {
        struct Damaged(MemorySource, Vec<Damage>);
        impl Source for Damaged {
            fn len(&self) -> usize {
                self.0.len()
            }
            fn read(&self, index: usize) -> Result<Record> {
                self.0.read(index)
            }
            fn damage(&self) -> &[Damage] {
                &self.1
            }
        }
        let cut = Damage {
            path: "b.tar".into(),
            offset: 512,
            reason: "bad tar header".into(),
        };
        let mix = Mixture::builder()
            .add(Arc::new(member(3)), 1.0)
            .add(Arc::new(Damaged(member(2), vec![cut.clone()])), 1.0)
            .build()
            .unwrap();
        assert_eq!(mix.damage(), [cut]);
    }

    #[test]
    fn bad_weights_are_errors() {
        let m = || Mixture::builder().add(member(3), 1.0).add(member(2), 1.0);
        assert!(Mixture::builder().build().is_err());
        assert!(m().schedule(0, &[0.0, 0.0]).build().is_err());
        assert!(m().schedule(1, &[1.0]).build().is_err());
        assert!(m().schedule(1, &[1.0, f64::NAN]).build().is_err());
        assert!(m().schedule(1, &[1.0, -1.0]).build().is_err());
        assert!(m()
            .schedule(1, &[1.0, 1.0])
            .schedule(1, &[1.0, 2.0])
            .build()
            .is_err());
        assert!(Mixture::builder()
            .add(member(0), 1.0)
            .add(member(2), 1.0)
            .build()
            .is_err());
        // Two changes at epoch 0, as at any other epoch.
        assert!(m()
            .schedule(0, &[1.0, 0.0])
            .schedule(0, &[0.0, 1.0])
            .build()
            .is_err());
        // Finite weights whose sum is not: the same proportions.
        let huge = Mixture::builder()
            .add(member(3), 1e308)
            .add(member(2), 1e308)
            .build()
            .unwrap();
        assert_eq!(huge.weights(0), [0.5, 0.5]);
        assert_eq!(huge.begin_epoch(Some(1), 0).unwrap().len(), 5);
        // More members than an epoch's picks can name.
        let mut many = Mixture::builder();
        for _ in 0..=MAX_MEMBERS {
            many = many.add(member(1), 1.0);
        }
        let e = many.build().unwrap_err().to_string();
        assert!(e.contains("65536"), "{e}");
    }
}
