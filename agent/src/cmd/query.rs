//! `scorch query`: read the local store, merge the windows of a time range and the series a
//! selector picks into one profile, and write it in any of the encoder's formats.
//!
//! store -> (merge) Profile -> encode -> file or stdout

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::Duration,
};

use crate::{
    parse::selector::{Selector, SelectorError},
    parse::timespec::TimeError,
    profile::encode::{self, svg::Orientation, EncodeOptions, Format},
    profile::{diff, SampleKind},
    store::{QueryLimits, Store, StoreError, TimeRange},
    sys::fs::{hostname, write_atomically},
};

/// What a query covers when no range is given.
pub const DEFAULT_SPAN: Duration = Duration::from_secs(3600);

/// A query, resolved from the command line.
#[derive(Debug, Clone)]
pub struct QueryConfig {
    /// Directory of the profile store.
    pub store: PathBuf,
    /// The windows to merge.
    pub range: TimeRange,
    /// The baseline to compare with, if any: then the output is what changed from it.
    pub base: Option<TimeRange>,
    /// The series to merge.
    pub selector: Selector,
    /// The selector as written, for the flame graph's title.
    pub selector_text: String,
    /// Where to write the result; `None` for standard output.
    pub output: Option<PathBuf>,
    /// In which format.
    pub format: Format,
    /// Which way a flame graph grows ([`Format::Svg`]).
    pub orientation: Orientation,
    /// CPU samples or off-CPU time.
    pub kind: SampleKind,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error("--match: {0}")]
    Selector(#[from] SelectorError),
    #[error("cannot write the output {path}: {reason}")]
    Output { path: PathBuf, reason: String },
    #[error(transparent)]
    Svg(#[from] encode::svg::SvgError),
    #[error("refusing to write a binary pprof to a terminal; use --output FILE or --format top")]
    BinaryToTerminal,
    #[error("writing to standard output: {0}")]
    Stdout(std::io::Error),
}

/// Runs the query; returns a one-line summary for standard error.
pub fn query(args: &QueryConfig) -> Result<String, QueryError> {
    let format = args.format;
    if format == Format::Pprof && args.output.is_none() && std::io::stdout().is_terminal() {
        return Err(QueryError::BinaryToTerminal);
    }
    let store = Store::open_read_only(&args.store)?;
    let merge = |range| {
        store.query_within(
            range,
            args.kind,
            &|labels| args.selector.matches(labels),
            QueryLimits::NONE,
        )
    };
    let profile = merge(args.range)?;
    let title = match args.kind {
        SampleKind::Cpu => format!(
            "scorch on {}: {} samples, {}",
            hostname(),
            profile.total_samples(),
            args.selector_text
        ),
        SampleKind::OffCpu => format!(
            "scorch off-CPU on {}: {:.3}s blocked (estimated), {}",
            hostname(),
            profile.total_samples() as f64 / 1e9,
            args.selector_text
        ),
    };
    let options = EncodeOptions {
        title: &title,
        top_limit: None,
        max_stacks: None,
        orientation: args.orientation,
    };
    let bytes = match args.base {
        None => encode::encode(format, &profile, options)?,
        Some(range) => {
            let base = merge(range)?;
            match format {
                Format::Pprof => diff::pprof(&base, &profile),
                Format::Svg => diff::svg(&base, &profile, &title, None, args.orientation)?,
                Format::Top => diff::render_top(&diff::top(&base, &profile), None).into_bytes(),
                Format::Folded => diff::pairs(&base, &profile)
                    .iter()
                    .flat_map(|line| [line.as_str(), "\n"])
                    .collect::<String>()
                    .into_bytes(),
            }
        }
    };
    let destination = match &args.output {
        Some(path) => {
            write_atomically(path, &bytes).map_err(|e| QueryError::Output {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            path.display().to_string()
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(&bytes)
                .and_then(|()| stdout.flush())
                .map_err(QueryError::Stdout)?;
            "standard output".to_owned()
        }
    };
    let counted = match args.kind {
        SampleKind::Cpu => format!("{} samples", profile.total_samples()),
        SampleKind::OffCpu => format!(
            "{:.3}s off-CPU (estimated)",
            profile.total_samples() as f64 / 1e9
        ),
    };
    Ok(format!(
        "scorch: {counted} from {} series-stacks; wrote {destination}",
        profile.samples.len()
    ))
}
