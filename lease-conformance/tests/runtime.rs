//! The runtime scenarios (`RunScope`, the heartbeat hub, the Worker's slots, deadlines, budgets
//! and shutdown) once, over the memory store on Tokio's paused clock: the runtime is the same
//! code over every backend, whose own suites keep the store scenarios and one real-time smoke.
lease_conformance::runtime_tests!(lease_conformance::fixtures::memory());
