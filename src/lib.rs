#![doc = include_str!("../README.md")]

pub use lease_core::*;
