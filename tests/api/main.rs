//! Admin API tests: every endpoint against a real server on a real database.

use testkit as support;
use testkit::on_backends;

mod alerts;
mod audit;
mod browser;
mod deployments;
mod endpoints;
mod harness;
mod local;
mod openapi;
mod pages;
mod prometheus;
mod prometheus_server;
mod reasons;
mod replica;
mod schemathesis;
