//! What every backend does after a restore: one number, so that their rebinds agree.

/// How far a rebind after a restore (`lease pg-rebind`, `lease redis-rebind`) raises every
/// run's fence and the fence floor: more claims than the history after a backup could have
/// made, so no fence that history issued is issued again, and its holders' writes are refused
/// as stale. Applied at each rebind, never undone.
pub const REBIND_FENCE_STEP: u64 = 1 << 32;
