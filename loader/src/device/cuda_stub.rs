//! Stand-ins for `cuda.rs` when the `cuda` feature is off: the same names,
//! with no values, so a buffer can never be one of them.

use crate::error::Result;
use std::convert::Infallible;

/// A page-locked buffer; none exists without the `cuda` feature.
#[derive(Debug)]
pub(crate) struct Pinned {
    never: Infallible,
}

impl Pinned {
    /// Unreachable: no `Pinned` can be made.
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        match self.never {}
    }
}
