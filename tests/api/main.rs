//! Admin API tests: every endpoint against a real server on a real database.

#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod browser;
mod endpoints;
mod harness;
mod local;
mod openapi;
mod pages;
mod reasons;
mod replica;
mod schemathesis;
