//! Postgres backend (in progress).
