//! Redis backend (in progress).
