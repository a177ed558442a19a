//! `scorch query`: read the local store, merge the windows of a time range and the series a
//! selector picks into one profile, and write it in any of the encoder's formats.
//!
//! store -> (merge) Profile -> encode -> file or stdout

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::{Duration, SystemTime},
};

use clap::Args;

use crate::{
    encode::{self, Format},
    record::{hostname, write_atomically, RecordError},
    selector::{Selector, SelectorError},
    store::{Store, StoreError, TimeRange},
    timespec::{parse_range, TimeError},
};

/// What a query covers when no range is given.
pub const DEFAULT_SPAN: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Args)]
pub struct QueryArgs {
    /// Directory of the profile store.
    #[arg(long, default_value = "/var/lib/scorch")]
    pub store: PathBuf,
    /// The last span of time, e.g. `15m`, `1h`, `2d` [default: 1h].
    #[arg(long, conflicts_with = "from")]
    pub since: Option<String>,
    /// Start: RFC 3339, Unix seconds, or `now-2h`.
    #[arg(long)]
    pub from: Option<String>,
    /// End: RFC 3339, Unix seconds, or `now-1h` [default: now].
    #[arg(long)]
    pub to: Option<String>,
    /// Series selector in Prometheus syntax, e.g. `{comm="nginx", pid!="1"}`.
    #[arg(long = "match", default_value = "{}")]
    pub selector: String,
    /// Where to write the result; without it, standard output.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Output format; by default from the output's extension, or `top` on standard output.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error("--match: {0}")]
    Selector(#[from] SelectorError),
    #[error(transparent)]
    Output(#[from] RecordError),
    #[error(transparent)]
    Svg(#[from] encode::svg::SvgError),
    #[error("refusing to write a binary pprof to a terminal; use --output FILE or --format top")]
    BinaryToTerminal,
    #[error("writing to standard output: {0}")]
    Stdout(std::io::Error),
}

/// Runs the query; returns a one-line summary for standard error.
pub fn query(args: &QueryArgs) -> Result<String, QueryError> {
    let selector = Selector::parse(&args.selector)?;
    let range: TimeRange = parse_range(
        args.from.as_deref(),
        args.to.as_deref(),
        args.since.as_deref(),
        SystemTime::now(),
        DEFAULT_SPAN,
    )?;
    let format = match (&args.format, &args.output) {
        (Some(format), _) => *format,
        (None, Some(path)) => Format::from_path(path),
        (None, None) => Format::Top,
    };
    if format == Format::Pprof && args.output.is_none() && std::io::stdout().is_terminal() {
        return Err(QueryError::BinaryToTerminal);
    }
    let store = Store::open_read_only(&args.store)?;
    let profile = store.query(range, &|labels| selector.matches(labels))?;
    let bytes = match format {
        Format::Pprof => encode::pprof::encode(&profile),
        Format::Folded => encode::folded::encode(&profile).into_bytes(),
        Format::Top => encode::top::encode(&profile).into_bytes(),
        Format::Svg => {
            let title = format!(
                "scorch on {}: {} samples, {}",
                hostname(),
                profile.total_samples(),
                args.selector
            );
            encode::svg::encode(&profile, &title)?
        }
    };
    let destination = match &args.output {
        Some(path) => {
            write_atomically(path, &bytes)?;
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
    Ok(format!(
        "scorch: {} samples from {} series-stacks; wrote {destination}",
        profile.total_samples(),
        profile.samples.len()
    ))
}
