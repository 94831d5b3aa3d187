//! How records reach the workers, between a source's reads and the
//! pipeline: retries of transient failures, and reading ahead of the
//! workers where a read waits on the network. `order/` decides which
//! records come when; this module gets them.
//!
//! One policy for threads and depth, mechanism by mechanism (each bounded,
//! each inside the loader's RAM budget, where the budget's sum counts it):
//!
//! | what | where | depth | threads | memory |
//! |---|---|---|---|---|
//! | retries | [`retry`] | `retry(n)` tries, waits 10 ms doubling to 200 ms, cut short by a dropped epoch | the caller's | — |
//! | records of the plan, random access on remote data | [`ahead`] | Little's law from the measured latency and take interval, within `[batch, 256]` | one a record in flight, at most 256 (`wick-read-*`) | records read and not yet taken, counted |
//! | shards of the streaming mode, remote | [`stream`] | the shards in the cycle and 2 more, 64 records each | one a shard stream (`wick-stream`), ending with it | at most 64 records a stream |
//! | Parquet row groups | [`jobs`], driven by the source | the rest of the reader's window and the next, as the row-group cache has room | at most 8 a source (`wick-parquet-ahead`), only while there is work | the row-group cache, bounded in bytes, counted |
//!
//! The object cache below ([`crate::storage`]) keeps whole objects and
//! the windowed reader its 1-8 MiB window; neither starts a thread of its
//! own (requests run on the two `wick-io` threads).

pub(crate) mod ahead;
#[cfg(feature = "parquet")]
pub(crate) mod jobs;
pub(crate) mod retry;
pub(crate) mod stream;
