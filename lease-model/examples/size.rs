//! Checks the model with larger bounds than the test: `cargo run -p lease-model --release
//! --example size -- MAX_TIME IN_FLIGHT CLAIMS WRITES` (the test uses 4 2 1 1). Prints the
//! number of states explored, and fails on any counterexample.
use lease_model::LeaseModel;
use stateright::{Checker, Model};

fn main() {
    let bounds: Vec<u8> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("bounds are small whole numbers"))
        .collect();
    let [max_time, in_flight, claims, writes] = bounds[..] else {
        panic!("usage: size MAX_TIME IN_FLIGHT CLAIMS WRITES");
    };
    let mut model = LeaseModel::small();
    model.max_time = max_time;
    model.max_in_flight = in_flight.into();
    model.claims_per_worker = claims;
    model.writes_per_worker = writes;
    let started = std::time::Instant::now();
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "{bounds:?}: {} states ({} unique), max depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}
