//! The input checks every backend runs before any I/O: batch sizes, payloads, lists.

use super::*;

/// Validates a [`create_many`](crate::LeaseStore::create_many) batch (0 to [`MAX_BATCH`](crate::MAX_BATCH) ids).
/// Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`].
pub fn check_create_batch(runs: &[RunId]) -> Result<(), InvalidInput> {
    check_batch(runs.len())
}

pub(crate) fn check_batch(len: usize) -> Result<(), InvalidInput> {
    if len > MAX_BATCH {
        return Err(InvalidInput::BatchTooLarge {
            len,
            max: MAX_BATCH,
        });
    }
    Ok(())
}

/// Validates `claim_next`'s `max` (1 to [`MAX_BATCH`](crate::MAX_BATCH)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`] or [`InvalidInput::BatchEmpty`].
pub fn check_claim_max(max: usize) -> Result<(), InvalidInput> {
    if max == 0 {
        return Err(InvalidInput::BatchEmpty);
    }
    check_batch(max)
}

/// Validates a `renew_many` batch size (0 to [`MAX_BATCH`](crate::MAX_BATCH)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::BatchTooLarge`].
pub fn check_renew_batch(len: usize) -> Result<(), InvalidInput> {
    check_batch(len)
}

/// Validates a journal payload (at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::PayloadTooLarge`].
pub fn check_payload(payload: &[u8]) -> Result<(), InvalidInput> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(InvalidInput::PayloadTooLarge {
            len: payload.len(),
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// Validates a list filter's limit (1 to [`MAX_LIST`](crate::MAX_LIST)). Backends call it before any I/O.
///
/// # Errors
/// [`InvalidInput::ListLimit`].
pub fn check_list(filter: &ListFilter) -> Result<(), InvalidInput> {
    if filter.limit == 0 || filter.limit > MAX_LIST {
        return Err(InvalidInput::ListLimit {
            limit: filter.limit,
            max: MAX_LIST,
        });
    }
    Ok(())
}
