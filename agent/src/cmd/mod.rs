//! The commands, each taking a resolved configuration (never a clap type): [`record`],
//! [`run`], [`query`], [`check`].

pub mod check;
pub mod query;
pub mod record;
pub mod run;
pub mod sampling;
pub mod session;
