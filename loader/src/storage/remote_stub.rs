//! Object storage in a build without the `remote` feature: the same names,
//! each an error that says how to get it.

use crate::error::{Error, Result};

fn missing(url: &str) -> Error {
    Error::InvalidConfig(format!(
        "{url:?} is a URL, and this build of wick reads local files only: enable the `remote` \
         feature (or `full`) to read object storage"
    ))
}

pub(crate) fn configure(_prefix: &str, _opts: Vec<(String, String)>) {}

/// A read under way (never made in this build).
#[derive(Debug)]
pub(crate) struct Pending {
    never: std::convert::Infallible,
}

impl Pending {
    pub(crate) fn wait(self) -> Result<Vec<u8>> {
        match self.never {}
    }
}

/// An object (never made in this build).
#[derive(Debug, Clone)]
pub(crate) struct Object {
    never: std::convert::Infallible,
}

impl Object {
    pub(crate) fn open(url: &str) -> Result<Self> {
        Err(missing(url))
    }

    pub(crate) fn open_listed(url: &str, _size: u64, _e_tag: &str) -> Result<Self> {
        Err(missing(url))
    }

    pub(crate) fn len(&self) -> u64 {
        match self.never {}
    }

    pub(crate) fn get_range(&self, _range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        match self.never {}
    }

    pub(crate) fn read_range(&self, _range: std::ops::Range<u64>, _fill: bool) -> Result<Vec<u8>> {
        match self.never {}
    }

    pub(crate) fn start_range(&self, _range: std::ops::Range<u64>, _fill: bool) -> Pending {
        match self.never {}
    }

    pub(crate) fn version(&self) -> Option<String> {
        match self.never {}
    }

    pub(crate) fn key(&self) -> &str {
        match self.never {}
    }
}

pub(crate) fn check(url: &str) -> Result<()> {
    Err(missing(url))
}

pub(crate) fn get_if_exists(
    url: &str,
    _max: u64,
) -> Result<Option<std::result::Result<Vec<u8>, u64>>> {
    Err(missing(url))
}

pub(crate) fn get_whole(url: &str, _max: u64) -> Result<std::result::Result<Vec<u8>, u64>> {
    Err(missing(url))
}

pub(crate) fn list(url: &str, _deep: bool, _keep: &dyn Fn(&str) -> bool) -> Result<Vec<String>> {
    Err(missing(url))
}

pub(crate) fn one_listing<T>(f: impl FnOnce() -> T) -> T {
    f()
}

pub(crate) fn delete(url: &str) -> Result<()> {
    Err(missing(url))
}

pub(crate) fn upload(_local: &std::path::Path, url: &str) -> Result<()> {
    Err(missing(url))
}

pub(crate) fn local_copy(url: &str) -> Result<std::fs::File> {
    Err(missing(url))
}

pub(crate) fn local_copy_known(url: &str, _size: u64, _tag: &str) -> Result<std::fs::File> {
    Err(missing(url))
}

/// Large objects read by range (never opened in this build).
pub(crate) mod chunks {
    /// A large object's local copy (never made in this build).
    #[derive(Debug)]
    pub(crate) struct Chunks {
        never: std::convert::Infallible,
    }

    impl Chunks {
        pub(crate) fn has(&self, _range: std::ops::Range<u64>) -> bool {
            match self.never {}
        }

        pub(crate) fn ensure(&self, _range: std::ops::Range<u64>) -> crate::error::Result<()> {
            match self.never {}
        }

        pub(crate) fn read(&self, _offset: u64, _buf: &mut [u8]) -> crate::error::Result<()> {
            match self.never {}
        }

        pub(crate) fn of(
            object: super::Object,
        ) -> crate::error::Result<(std::fs::File, std::sync::Arc<Chunks>)> {
            match object.never {}
        }
    }

    pub(crate) fn set_chunk_bytes(_bytes: u64) {}

    pub(crate) fn chunk_bytes() -> u64 {
        32 << 20
    }
}
