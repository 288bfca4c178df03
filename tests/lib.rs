//! Cross-crate tests of the workspace and the fixtures they share.
//!
//! The README's Rust examples are compiled and run here as doctests, so the quick start cannot
//! drift from the code.

pub mod any_broker;
pub mod db;
pub mod fixtures;
pub mod proxy;
pub mod tansu;
pub mod wait;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
