//! Pure parsers of user-written text: label selectors, time ranges, durations. They import no
//! store or CLI type, so every layer above can use them.

pub mod duration;
pub mod selector;
pub mod timespec;
