//! Which rank of a data-parallel job this process is, as its launcher says.
//!
//! Every rank computes its share of an epoch from the same seed and state
//! alone ([`Sampler`](super::sampler::Sampler)): no rank-0 index, no shared
//! memory, no lock file, nothing to coordinate but the launcher's variables.

use crate::error::{Error, Result};

/// The launchers whose variables [`Ranks::from_env`] reads, in the order
/// it tries them: `(launcher, rank, world size, local rank)`. torchrun
/// first: launched by `srun` once per node, it sets the per-process
/// values while SLURM's describe the node's task. SLURM last: a batch
/// script that starts `mpirun` inherits the batch step's `SLURM_PROCID`
/// (0 in every process) while the MPI variables are right.
const LAUNCHERS: &[(&str, &str, &str, &[&str])] = &[
    ("torchrun", "RANK", "WORLD_SIZE", &["LOCAL_RANK"]),
    (
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        &["OMPI_COMM_WORLD_LOCAL_RANK"],
    ),
    // MPICH and Intel MPI (Hydra) name the local rank MPI_LOCALRANKID.
    (
        "PMI",
        "PMI_RANK",
        "PMI_SIZE",
        &["MPI_LOCALRANKID", "PMI_LOCAL_RANK"],
    ),
    ("SLURM", "SLURM_PROCID", "SLURM_NTASKS", &["SLURM_LOCALID"]),
];

/// One process's place in a data-parallel job: its rank, the world size,
/// and its rank on this node (which GPU it uses).
///
/// Read from the launcher's environment by [`from_env`](Self::from_env)
/// (the loader's default), or given with [`new`](Self::new) and
/// [`LoaderBuilder::ranks`](crate::LoaderBuilder::ranks).
///
/// ```
/// use candle_wick::Ranks;
/// let ranks = Ranks::from_vars(|name| match name {
///     "RANK" => Some("3".into()),
///     "WORLD_SIZE" => Some("8".into()),
///     "LOCAL_RANK" => Some("1".into()),
///     _ => None,
/// })?;
/// assert_eq!((ranks.rank(), ranks.world_size(), ranks.local_rank()), (3, 8, Some(1)));
/// assert_eq!(ranks.launcher(), Some("torchrun"));
/// # Ok::<(), candle_wick::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    rank: usize,
    world_size: usize,
    local_rank: Option<usize>,
    launcher: Option<&'static str>,
}

impl Default for Ranks {
    /// One process: rank 0 of 1, local rank 0.
    fn default() -> Self {
        Self {
            rank: 0,
            world_size: 1,
            local_rank: Some(0),
            launcher: None,
        }
    }
}

impl Ranks {
    /// Rank `rank` of `world_size`; an error unless `rank < world_size`.
    /// The local rank is unknown until [`with_local_rank`](Self::with_local_rank).
    pub fn new(rank: usize, world_size: usize) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::InvalidConfig(format!(
                "rank {rank} is not below world_size {world_size}"
            )));
        }
        Ok(Self {
            rank,
            world_size,
            local_rank: (world_size == 1).then_some(0),
            launcher: None,
        })
    }

    /// The same ranks, with this process's rank on its node.
    pub fn with_local_rank(mut self, local_rank: usize) -> Self {
        self.local_rank = Some(local_rank);
        self
    }

    /// The ranks the launcher set in this process's environment:
    /// torchrun's `RANK`/`WORLD_SIZE`/`LOCAL_RANK`, Open MPI's
    /// `OMPI_COMM_WORLD_RANK`/`_SIZE`/`_LOCAL_RANK`, PMI's
    /// `PMI_RANK`/`PMI_SIZE` (local rank from `MPI_LOCALRANKID` or
    /// `PMI_LOCAL_RANK`), or SLURM's `SLURM_PROCID`/`SLURM_NTASKS`/
    /// `SLURM_LOCALID`, tried in that order (the first launcher with any of
    /// its variables set decides); one process (rank 0 of 1) when none is
    /// set. A contradiction is an error naming the variables: a rank
    /// without a world size or the other way round, a value that is not a
    /// number, a rank not below the world size, a local rank not below
    /// torchrun's `LOCAL_WORLD_SIZE` or above the rank.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading the variables from `var`
    /// (for tests, or a launcher that passes them another way).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        for &(launcher, rank_var, size_var, local_vars) in LAUNCHERS {
            let (rank, size) = (var(rank_var), var(size_var));
            if rank.is_none() && size.is_none() {
                continue;
            }
            let bad = |why: String| Err(Error::InvalidConfig(format!("{launcher}: {why}")));
            let (Some(rank), Some(size)) = (rank, size) else {
                let (set, unset) = match var(rank_var) {
                    Some(_) => (rank_var, size_var),
                    None => (size_var, rank_var),
                };
                return bad(format!(
                    "{set} is set but {unset} is not: set both, as the launcher does, or call \
                     LoaderBuilder::ranks; with one alone every rank would read the same batches"
                ));
            };
            let number = |name: &str, value: &str| -> Result<usize> {
                value.trim().parse().map_err(|_| {
                    Error::InvalidConfig(format!(
                        "{launcher}: {name}={value:?} is not a non-negative integer"
                    ))
                })
            };
            let (rank, world_size) = (number(rank_var, &rank)?, number(size_var, &size)?);
            if world_size == 0 || rank >= world_size {
                return bad(format!(
                    "{rank_var}={rank} is not below {size_var}={world_size}"
                ));
            }
            let mut local_rank = None;
            if let Some((name, value)) = local_vars.iter().find_map(|&n| var(n).map(|v| (n, v))) {
                let local = number(name, &value)?;
                if local > rank {
                    return bad(format!(
                        "{name}={local} is above {rank_var}={rank}: a node's local ranks \
                         are numbered from 0 among the global ones"
                    ));
                }
                local_rank = Some(local);
            }
            if let (Some(local), Some(v)) = (local_rank, var("LOCAL_WORLD_SIZE")) {
                let per_node = number("LOCAL_WORLD_SIZE", &v)?;
                if launcher == "torchrun" && local >= per_node {
                    return bad(format!(
                        "LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={per_node}"
                    ));
                }
            }
            return Ok(Self {
                rank,
                world_size,
                local_rank: local_rank.or((world_size == 1).then_some(0)),
                launcher: Some(launcher),
            });
        }
        Ok(Self::default())
    }

    /// This process's rank, from 0.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes in the job.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This process's rank on its node (the GPU it uses), when known.
    pub fn local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    /// The launcher whose variables gave these ranks (`"torchrun"`,
    /// `"Open MPI"`, `"PMI"`, `"SLURM"`), `None` for explicit or default ranks.
    pub fn launcher(&self) -> Option<&'static str> {
        self.launcher
    }

    /// The CUDA device of this rank: ordinal [`local_rank`](Self::local_rank),
    /// as one process per GPU needs. An error when the local rank is not
    /// known (set it with [`with_local_rank`](Self::with_local_rank)) or
    /// candle cannot open that device (a build without the `cuda` feature,
    /// no such GPU).
    pub fn cuda_device(&self) -> Result<candle_core::Device> {
        let Some(local) = self.local_rank else {
            return Err(Error::InvalidConfig(format!(
                "rank {} of {}: the launcher set no local rank (LOCAL_RANK, \
                 OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID), so which GPU \
                 is this rank's is not known: call Ranks::with_local_rank",
                self.rank, self.world_size
            )));
        };
        candle_core::Device::new_cuda(local).map_err(|e| Error::Device {
            what: "opening the CUDA device whose ordinal is this rank's local rank",
            source: Box::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Ranks> {
        Ranks::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn every_launcher_is_read() {
        let cases: [(&[(&str, &str)], _); 5] = [
            (
                &[("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")],
                ("torchrun", 5, 8, Some(1)),
            ),
            (
                &[
                    ("SLURM_PROCID", "2"),
                    ("SLURM_NTASKS", "4"),
                    ("SLURM_LOCALID", "0"),
                ],
                ("SLURM", 2, 4, Some(0)),
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "3"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
                ],
                ("Open MPI", 3, 4, Some(3)),
            ),
            (
                &[
                    ("PMI_RANK", "1"),
                    ("PMI_SIZE", "2"),
                    ("MPI_LOCALRANKID", "1"),
                ],
                ("PMI", 1, 2, Some(1)),
            ),
            // torchrun under srun: torchrun's per-process values win.
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("RANK", "6"),
                    ("WORLD_SIZE", "8"),
                    ("LOCAL_RANK", "2"),
                ],
                ("torchrun", 6, 8, Some(2)),
            ),
        ];
        for (vars, (launcher, rank, world, local)) in cases {
            let r = from(vars).unwrap();
            assert_eq!(
                (r.launcher(), r.rank(), r.world_size(), r.local_rank()),
                (Some(launcher), rank, world, local),
                "{vars:?}"
            );
        }
        assert_eq!(from(&[]).unwrap(), Ranks::default());
    }

    #[test]
    fn contradictions_are_errors_naming_the_variables() {
        for (vars, says) in [
            (&[("RANK", "1")][..], "RANK is set but WORLD_SIZE is not"),
            (
                &[("WORLD_SIZE", "2")][..],
                "WORLD_SIZE is set but RANK is not",
            ),
            (
                &[("RANK", "2"), ("WORLD_SIZE", "2")][..],
                "RANK=2 is not below WORLD_SIZE=2",
            ),
            (
                &[("RANK", "x"), ("WORLD_SIZE", "2")][..],
                "RANK=\"x\" is not",
            ),
            (
                &[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2")][..],
                "LOCAL_RANK=2 is above RANK=1",
            ),
            (
                &[
                    ("RANK", "3"),
                    ("WORLD_SIZE", "4"),
                    ("LOCAL_RANK", "3"),
                    ("LOCAL_WORLD_SIZE", "2"),
                ][..],
                "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2",
            ),
            (&[("SLURM_PROCID", "0")][..], "SLURM: SLURM_PROCID is set"),
            (
                &[("PMI_SIZE", "0"), ("PMI_RANK", "0")][..],
                "PMI_RANK=0 is not below PMI_SIZE=0",
            ),
        ] {
            let err = from(vars).unwrap_err().to_string();
            assert!(err.contains(says), "{vars:?}: {err}");
        }
    }

    #[test]
    fn the_cuda_device_needs_a_local_rank() {
        let err = Ranks::new(1, 4)
            .unwrap()
            .cuda_device()
            .unwrap_err()
            .to_string();
        assert!(err.contains("no local rank"), "{err}");
        assert!(Ranks::new(4, 4).is_err());
    }
}
