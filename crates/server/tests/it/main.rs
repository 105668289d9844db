//! The server's API behaviour tests, against a real listener on 127.0.0.1 (one test binary).

#![allow(clippy::unwrap_used)] // tests unwrap by design

mod api;
mod bad_input;
mod client_effects;
mod common;
mod console;
mod crash;
mod dispatch;
mod durable_state;
mod failover;
mod fencing;
mod history;
mod isolation;
mod openapi;
mod plans_story;
mod restart;
mod review;
mod review_removal;
mod review_security;
