//! What a decoder accepts from a file before it allocates: the limits
//! against hostile headers, shared by every decoder (a leaf: decoders
//! depend on it, never on their dispatcher).

/// Largest width or height a sample may declare.
pub(crate) const MAX_SIDE: u32 = 32_768;
/// Largest decoded image, in bytes (1 GiB).
pub(crate) const MAX_ALLOC: u64 = 1 << 30;
