//! `scorch run`'s configuration: built-in defaults, overridden by a TOML file (`--config`),
//! overridden by flags. Every key of the file is also a flag of the same name; the reference
//! file `packaging/scorch.toml` documents each one with its default, and a test keeps the two
//! in step. The exceptions are tables: `[[relabel]]` rules live in the file only, and
//! `[external-labels]` has `--external-label NAME=VALUE` beside it.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;
use serde::Deserialize;

use crate::{
    cli::{parse_block_time, parse_duration, parse_frequency},
    cmd::run::RunConfig,
    export::{RemoteCompression, RemoteProtocol},
    labels::relabel::{self, RuleConfig},
    pipeline::sampler::UnwindMode,
    runtimes::{hotspot::JvmMode, python::PythonMode, v8::NodeMode},
    symbolize::user::SymbolizeMode,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Relabel {
        path: PathBuf,
        source: relabel::RelabelError,
    },
    #[error("reading the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: key `{key}`: {message}")]
    Value {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
}

/// Flags of `scorch run`. Each is optional so that a flag left out falls back to the file, and
/// the file to the default.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// TOML file with any of the keys below (see packaging/scorch.toml); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of the profile store [default: /var/lib/scorch].
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Address of the HTTP server (UI, API, /metrics, /healthz) [default: 127.0.0.1:7071].
    /// Only what is named here is listened on: `0.0.0.0:7071` exposes it to every interface.
    #[arg(long)]
    pub http_address: Option<SocketAddr>,
    /// Host names (besides localhost, IP addresses and the bound address) requests may name
    /// in their Host header, comma-separated; others get 403 [default: none].
    #[arg(long, value_delimiter = ',')]
    pub http_allowed_hosts: Option<Vec<String>>,
    /// How often the maps are drained and a profile per series is stored [default: 10s].
    #[arg(long, value_parser = parse_duration)]
    pub window: Option<Duration>,
    /// Samples per second on each CPU [default: 19].
    #[arg(long, short = 'F', value_parser = parse_frequency)]
    pub frequency: Option<u64>,
    /// Keep windows this long [default: 7d].
    #[arg(long, value_parser = parse_retention_age)]
    pub retention_age: Option<Duration>,
    /// Keep the store under this size, e.g. `512MiB`, `1GiB` [default: 1GiB].
    #[arg(long, value_parser = parse_bytes)]
    pub retention_size: Option<u64>,
    /// `local` or `none` [default: local].
    #[arg(long, value_enum)]
    pub symbolize: Option<SymbolizeMode>,
    /// Memory budget, in MiB, for parsed binaries and debug info [default: 256].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub symbol_cache_mb: Option<u64>,
    /// Keep samples of idle CPUs [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub include_idle: Option<bool>,
    /// `auto` (unwind tables where loaded, frame pointers elsewhere) or `fp` (frame pointers
    /// only) [default: auto].
    #[arg(long, value_enum)]
    pub unwind: Option<UnwindMode>,
    /// Processes the unwinder describes to the BPF program at once, 2.5 KiB of kernel memory
    /// each; the others walk by frame pointers [default: 8192].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub unwind_processes: Option<u32>,
    /// Ceiling on the unwind tables' BPF row pools, in MiB: pools are added as tables need
    /// them, and past the ceiling the least recently used tables are evicted [default: 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub unwind_pool_mib: Option<u32>,
    /// Ceiling on each of the two stack-trace maps, in entries (about 1 KiB each): they grow
    /// as the distinct stacks stored need, to this at most [default: 65536].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub stack_map_entries: Option<u32>,
    /// `auto` (name the Python functions of CPython 3.11 to 3.15 processes) or `off`
    /// [default: auto].
    #[arg(long, value_enum)]
    pub python: Option<PythonMode>,
    /// `auto` (name the Java frames of HotSpot JVMs, JDK 8 to 26) or `off` [default: auto].
    #[arg(long, value_enum)]
    pub jvm: Option<JvmMode>,
    /// `auto` (name the JavaScript frames of Node.js 18 to 24) or `off` [default: auto].
    #[arg(long, value_enum)]
    pub node: Option<NodeMode>,
    /// Also record off-CPU time: where threads wait (sleep, I/O, locks, preemption) and for
    /// how long, stored beside the CPU samples as its own profile type (`off-cpu`)
    /// [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub off_cpu: Option<bool>,
    /// Off-CPU sampling: a block of d is recorded with probability 1 - exp(-d / this), and
    /// counts d divided by it: about one event per this much blocked time [default: 10ms].
    #[arg(long, value_parser = parse_duration)]
    pub off_cpu_mean: Option<Duration>,
    /// Off-CPU: blocks shorter than this are left out entirely [default: 0s].
    #[arg(long, value_parser = parse_block_time)]
    pub off_cpu_min: Option<Duration>,
    /// Off-CPU: most blocks the kernel side sends per second; the rest are counted
    /// (`scorch_off_cpu_blocks_total`) [default: 10000].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub off_cpu_max_events: Option<u32>,
    /// Label each sample with its thread's id (`thread_id`, and `__meta_thread_id` for
    /// relabelling) besides its name (`thread`), keeping threads of one name apart: a series
    /// per thread [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub thread_ids: Option<bool>,
    /// A label added to every series, `NAME=VALUE` (repeatable; adds to `[external-labels]`).
    #[arg(long = "external-label", value_parser = parse_external_label)]
    pub external_label: Vec<(String, String)>,
    /// Also send every window to this Pyroscope, Parca or OTLP server; the local store is the
    /// spool meanwhile. `https://host`, `http://host:4040`, or `host:7070` (TLS)
    /// [default: none].
    #[arg(long)]
    pub remote_url: Option<String>,
    /// The remote's API: `pyroscope`, `parca`, `otlp` (OTLP profiles over gRPC) or `otlp-http`
    /// (OTLP over HTTP/protobuf) [default: pyroscope].
    #[arg(long, value_enum)]
    pub remote_protocol: Option<RemoteProtocol>,
    /// Plaintext to the remote instead of TLS [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub remote_insecure: Option<bool>,
    /// File holding the remote's bearer token (a file, so it never shows in the process list).
    #[arg(long)]
    pub remote_bearer_token_file: Option<PathBuf>,
    /// User for basic authentication to the remote (with --remote-basic-auth-password-file).
    #[arg(long)]
    pub remote_basic_auth_user: Option<String>,
    /// File holding the basic authentication password.
    #[arg(long)]
    pub remote_basic_auth_password_file: Option<PathBuf>,
    /// Tenant (`X-Scope-OrgID`) on a multi-tenant remote.
    #[arg(long)]
    pub remote_tenant: Option<String>,
    /// PEM file of the CAs to trust for the remote, instead of the system's.
    #[arg(long)]
    pub remote_ca_file: Option<PathBuf>,
    /// How long one request to the remote may take [default: 10s].
    #[arg(long, value_parser = parse_duration)]
    pub remote_timeout: Option<Duration>,
    /// With `--remote-protocol parca` and `--symbolize none`, upload the debug info (symbols
    /// and DWARF only) of each binary profiled, once, for the server to name frames
    /// [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub remote_upload_debuginfo: Option<bool>,
    /// With `otlp` and `otlp-http`: a header (gRPC metadata) sent with every request,
    /// `NAME=VALUE` (repeatable; adds to `remote-headers`).
    #[arg(long = "remote-header", value_parser = parse_header)]
    pub remote_header: Vec<(String, String)>,
    /// With `otlp` and `otlp-http`: a header whose value is a secret, read from a file,
    /// `NAME=PATH` (repeatable; adds to `remote-header-files`).
    #[arg(long = "remote-header-file", value_parser = parse_header_file)]
    pub remote_header_file: Vec<(String, PathBuf)>,
    /// With `otlp` and `otlp-http`: `gzip` or `none` [default: gzip].
    #[arg(long, value_enum)]
    pub remote_compression: Option<RemoteCompression>,
}

/// The config file: the same keys as the flags, kebab-case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    store: Option<PathBuf>,
    http_address: Option<String>,
    http_allowed_hosts: Option<Vec<String>>,
    window: Option<String>,
    frequency: Option<u64>,
    retention_age: Option<String>,
    retention_size: Option<String>,
    symbolize: Option<String>,
    symbol_cache_mb: Option<u64>,
    include_idle: Option<bool>,
    unwind: Option<String>,
    unwind_processes: Option<u32>,
    unwind_pool_mib: Option<u32>,
    stack_map_entries: Option<u32>,
    python: Option<String>,
    jvm: Option<String>,
    node: Option<String>,
    off_cpu: Option<bool>,
    off_cpu_mean: Option<String>,
    off_cpu_min: Option<String>,
    off_cpu_max_events: Option<u32>,
    thread_ids: Option<bool>,
    /// `[[relabel]]` tables: Prometheus relabel_config rules, in order.
    relabel: Option<Vec<RuleConfig>>,
    /// `[external-labels]`: added to every series.
    external_labels: Option<BTreeMap<String, String>>,
    remote_url: Option<String>,
    remote_protocol: Option<String>,
    remote_insecure: Option<bool>,
    remote_bearer_token_file: Option<PathBuf>,
    remote_basic_auth_user: Option<String>,
    remote_basic_auth_password_file: Option<PathBuf>,
    remote_tenant: Option<String>,
    remote_ca_file: Option<PathBuf>,
    remote_timeout: Option<String>,
    remote_upload_debuginfo: Option<bool>,
    remote_headers: Option<BTreeMap<String, String>>,
    remote_header_files: Option<BTreeMap<String, PathBuf>>,
    remote_compression: Option<String>,
}

/// Defaults, then the file `args.config` names, then the flags.
pub fn resolve(args: &RunArgs) -> Result<RunConfig, ConfigError> {
    let mut config = RunConfig::default();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        apply_file(&mut config, &text, path)?;
    }
    apply_flags(&mut config, args);
    Ok(config)
}

fn apply_file(config: &mut RunConfig, text: &str, path: &Path) -> Result<(), ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let value = |key: &'static str, message: String| ConfigError::Value {
        path: path.to_owned(),
        key,
        message,
    };
    if let Some(store) = file.store {
        config.store = store;
    }
    if let Some(hosts) = file.http_allowed_hosts {
        config.http_allowed_hosts = hosts;
    }
    if let Some(address) = file.http_address {
        config.http_address = address
            .parse()
            .map_err(|e| value("http-address", format!("{address:?}: {e}")))?;
    }
    if let Some(window) = file.window {
        config.window = parse_duration(&window).map_err(|e| value("window", e))?;
    }
    if let Some(frequency) = file.frequency {
        config.frequency =
            parse_frequency(&frequency.to_string()).map_err(|e| value("frequency", e))?;
    }
    if let Some(age) = file.retention_age {
        config.retention.max_age =
            parse_retention_age(&age).map_err(|e| value("retention-age", e))?;
    }
    if let Some(size) = file.retention_size {
        config.retention.max_bytes = parse_bytes(&size).map_err(|e| value("retention-size", e))?;
    }
    if let Some(mode) = file.symbolize {
        config.symbolize = <SymbolizeMode as clap::ValueEnum>::from_str(&mode, false)
            .map_err(|_| value("symbolize", format!("{mode:?}: expected local or none")))?;
    }
    if let Some(mb) = file.symbol_cache_mb {
        if !(1..=65536).contains(&mb) {
            return Err(value(
                "symbol-cache-mb",
                format!("{mb}: expected 1 to 65536"),
            ));
        }
        config.symbol_cache_mb = mb;
    }
    if let Some(idle) = file.include_idle {
        config.include_idle = idle;
    }
    if let Some(mode) = file.unwind {
        config.unwind = <UnwindMode as clap::ValueEnum>::from_str(&mode, false)
            .map_err(|_| value("unwind", format!("{mode:?}: expected auto or fp")))?;
    }
    if let Some(processes) = file.unwind_processes {
        if !(1..=65536).contains(&processes) {
            return Err(value(
                "unwind-processes",
                format!("{processes}: expected 1 to 65536"),
            ));
        }
        config.unwind_processes = processes;
    }
    if let Some(mib) = file.unwind_pool_mib {
        if !(1..=4096).contains(&mib) {
            return Err(value(
                "unwind-pool-mib",
                format!("{mib}: expected 1 to 4096"),
            ));
        }
        config.unwind_pool_mib = mib;
    }
    if let Some(entries) = file.stack_map_entries {
        if !(1..=1_048_576).contains(&entries) {
            return Err(value(
                "stack-map-entries",
                format!("{entries}: expected 1 to 1048576"),
            ));
        }
        config.stack_map_entries = entries;
    }
    if let Some(mode) = file.python {
        config.python = <PythonMode as clap::ValueEnum>::from_str(&mode, false)
            .map_err(|_| value("python", format!("{mode:?}: expected auto or off")))?;
    }
    if let Some(mode) = file.jvm {
        config.jvm = <JvmMode as clap::ValueEnum>::from_str(&mode, false)
            .map_err(|_| value("jvm", format!("{mode:?}: expected auto or off")))?;
    }
    if let Some(mode) = file.node {
        config.node = <NodeMode as clap::ValueEnum>::from_str(&mode, false)
            .map_err(|_| value("node", format!("{mode:?}: expected auto or off")))?;
    }
    if let Some(on) = file.off_cpu {
        config.off_cpu = on;
    }
    if let Some(mean) = file.off_cpu_mean {
        config.off_cpu_sampling.mean =
            parse_duration(&mean).map_err(|e| value("off-cpu-mean", e))?;
    }
    if let Some(min) = file.off_cpu_min {
        config.off_cpu_sampling.min =
            parse_block_time(&min).map_err(|e| value("off-cpu-min", e))?;
    }
    if let Some(events) = file.off_cpu_max_events {
        if !(1..=1_000_000).contains(&events) {
            return Err(value(
                "off-cpu-max-events",
                format!("{events}: expected 1 to 1000000"),
            ));
        }
        config.off_cpu_sampling.max_events_per_second = events;
    }
    if let Some(on) = file.thread_ids {
        config.thread_ids = on;
    }
    if let Some(rules) = file.relabel {
        // Checked now, so a bad rule stops startup with its number and field.
        relabel::compile(&rules).map_err(|e| ConfigError::Relabel {
            path: path.to_owned(),
            source: e,
        })?;
        config.relabel = rules;
    }
    if let Some(external) = file.external_labels {
        for name in external.keys() {
            if !relabel::valid_label_name(name) || name.starts_with("__") {
                return Err(value(
                    "external-labels",
                    format!("{name:?} is not a valid label name"),
                ));
            }
        }
        config.external_labels.extend(external);
    }
    if let Some(url) = file.remote_url {
        config.remote.url = Some(url).filter(|u| !u.is_empty());
    }
    if let Some(protocol) = file.remote_protocol {
        config.remote.protocol = <RemoteProtocol as clap::ValueEnum>::from_str(&protocol, false)
            .map_err(|_| {
                value(
                    "remote-protocol",
                    format!("{protocol:?}: expected pyroscope, parca, otlp or otlp-http"),
                )
            })?;
    }
    if let Some(insecure) = file.remote_insecure {
        config.remote.insecure = insecure;
    }
    if let Some(path) = file.remote_bearer_token_file {
        config.remote.bearer_token_file = Some(path);
    }
    if let Some(user) = file.remote_basic_auth_user {
        config.remote.basic_auth_user = Some(user);
    }
    if let Some(path) = file.remote_basic_auth_password_file {
        config.remote.basic_auth_password_file = Some(path);
    }
    if let Some(tenant) = file.remote_tenant {
        config.remote.tenant = Some(tenant);
    }
    if let Some(path) = file.remote_ca_file {
        config.remote.ca_file = Some(path);
    }
    if let Some(timeout) = file.remote_timeout {
        config.remote.timeout = parse_duration(&timeout).map_err(|e| value("remote-timeout", e))?;
    }
    if let Some(upload) = file.remote_upload_debuginfo {
        config.remote.upload_debuginfo = upload;
    }
    for (name, header) in file.remote_headers.unwrap_or_default() {
        check_header_name(&name).map_err(|e| value("remote-headers", e))?;
        config.remote.headers.push((name, header));
    }
    for (name, path) in file.remote_header_files.unwrap_or_default() {
        check_header_name(&name).map_err(|e| value("remote-header-files", e))?;
        config.remote.header_files.push((name, path));
    }
    if let Some(compression) = file.remote_compression {
        config.remote.compression =
            <RemoteCompression as clap::ValueEnum>::from_str(&compression, false).map_err(
                |_| {
                    value(
                        "remote-compression",
                        format!("{compression:?}: expected gzip or none"),
                    )
                },
            )?;
    }
    Ok(())
}

fn apply_flags(config: &mut RunConfig, args: &RunArgs) {
    if let Some(store) = &args.store {
        config.store = store.clone();
    }
    if let Some(hosts) = &args.http_allowed_hosts {
        config.http_allowed_hosts = hosts.clone();
    }
    if let Some(address) = args.http_address {
        config.http_address = address;
    }
    if let Some(window) = args.window {
        config.window = window;
    }
    if let Some(frequency) = args.frequency {
        config.frequency = frequency;
    }
    if let Some(age) = args.retention_age {
        config.retention.max_age = age;
    }
    if let Some(size) = args.retention_size {
        config.retention.max_bytes = size;
    }
    if let Some(mode) = args.symbolize {
        config.symbolize = mode;
    }
    if let Some(mb) = args.symbol_cache_mb {
        config.symbol_cache_mb = mb;
    }
    if let Some(idle) = args.include_idle {
        config.include_idle = idle;
    }
    if let Some(mode) = args.unwind {
        config.unwind = mode;
    }
    if let Some(processes) = args.unwind_processes {
        config.unwind_processes = processes;
    }
    if let Some(mib) = args.unwind_pool_mib {
        config.unwind_pool_mib = mib;
    }
    if let Some(entries) = args.stack_map_entries {
        config.stack_map_entries = entries;
    }
    if let Some(mode) = args.python {
        config.python = mode;
    }
    if let Some(mode) = args.jvm {
        config.jvm = mode;
    }
    if let Some(mode) = args.node {
        config.node = mode;
    }
    if let Some(on) = args.off_cpu {
        config.off_cpu = on;
    }
    if let Some(mean) = args.off_cpu_mean {
        config.off_cpu_sampling.mean = mean;
    }
    if let Some(min) = args.off_cpu_min {
        config.off_cpu_sampling.min = min;
    }
    if let Some(events) = args.off_cpu_max_events {
        config.off_cpu_sampling.max_events_per_second = events;
    }
    if let Some(on) = args.thread_ids {
        config.thread_ids = on;
    }
    config
        .external_labels
        .extend(args.external_label.iter().cloned());
    if let Some(url) = &args.remote_url {
        config.remote.url = Some(url.clone()).filter(|u| !u.is_empty());
    }
    if let Some(protocol) = args.remote_protocol {
        config.remote.protocol = protocol;
    }
    if let Some(insecure) = args.remote_insecure {
        config.remote.insecure = insecure;
    }
    if let Some(path) = &args.remote_bearer_token_file {
        config.remote.bearer_token_file = Some(path.clone());
    }
    if let Some(user) = &args.remote_basic_auth_user {
        config.remote.basic_auth_user = Some(user.clone());
    }
    if let Some(path) = &args.remote_basic_auth_password_file {
        config.remote.basic_auth_password_file = Some(path.clone());
    }
    if let Some(tenant) = &args.remote_tenant {
        config.remote.tenant = Some(tenant.clone());
    }
    if let Some(path) = &args.remote_ca_file {
        config.remote.ca_file = Some(path.clone());
    }
    if let Some(timeout) = args.remote_timeout {
        config.remote.timeout = timeout;
    }
    if let Some(upload) = args.remote_upload_debuginfo {
        config.remote.upload_debuginfo = upload;
    }
    config
        .remote
        .headers
        .extend(args.remote_header.iter().cloned());
    config
        .remote
        .header_files
        .extend(args.remote_header_file.iter().cloned());
    if let Some(compression) = args.remote_compression {
        config.remote.compression = compression;
    }
}

/// A request header's name as HTTP/2 (and so gRPC) carries it: lowercase token characters.
/// Upper case is refused rather than folded, so the name sent is the name written.
fn check_header_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if !valid {
        return Err(format!(
            "{name:?} is not a header name (lowercase letters, digits, '-', '_', '.')"
        ));
    }
    Ok(())
}

/// `NAME=VALUE`, a request header.
pub fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=VALUE"))?;
    check_header_name(name)?;
    Ok((name.to_owned(), value.to_owned()))
}

/// `NAME=PATH`, a request header whose value is read from a file.
pub fn parse_header_file(text: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=PATH"))?;
    check_header_name(name)?;
    Ok((name.to_owned(), PathBuf::from(path)))
}

/// `NAME=VALUE`, with a valid Prometheus label name.
pub fn parse_external_label(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=VALUE"))?;
    if !relabel::valid_label_name(name) || name.starts_with("__") {
        return Err(format!("{name:?} is not a valid label name"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// A retention age: `7d`, `12h`, `90m`, in the one duration grammar, longer than zero.
pub fn parse_retention_age(text: &str) -> Result<Duration, String> {
    let age = crate::parse::duration::parse_duration(text)?;
    if age.is_zero() {
        return Err(format!(
            "{text:?}: a retention age must be longer than zero, like 7d"
        ));
    }
    Ok(age)
}

/// A size: `1GiB`, `512MiB`, `100MB`, `4096` (bytes). Binary and decimal units both accepted.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number with a unit, like 1GiB or 512MiB"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            ))
        }
    };
    let bytes = number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?}: too large"))?;
    // Below this a single window may not fit, and retention would delete every window.
    if bytes < 1 << 20 {
        return Err(format!("{text:?}: the store needs at least 1MiB"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::RemoteConfig;

    #[test]
    fn otlp_keys_come_from_the_file_and_the_flags() {
        let mut config = RunConfig::default();
        apply_file(
            &mut config,
            "remote-protocol = \"otlp-http\"\nremote-compression = \"none\"\n\
             remote-headers = { \"x-team\" = \"a\" }\n\
             remote-header-files = { \"api-key\" = \"/etc/k\" }\n",
            Path::new("x.toml"),
        )
        .unwrap();
        apply_flags(
            &mut config,
            &RunArgs {
                remote_header: vec![parse_header("x-env=prod").unwrap()],
                ..RunArgs::default()
            },
        );
        let remote = &config.remote;
        assert_eq!(remote.protocol, RemoteProtocol::OtlpHttp);
        assert_eq!(remote.compression, RemoteCompression::None);
        assert_eq!(
            remote.headers,
            [
                ("x-team".into(), "a".into()),
                ("x-env".into(), "prod".into())
            ]
        );
        assert_eq!(
            remote.header_files,
            [("api-key".into(), PathBuf::from("/etc/k"))]
        );
        // Header names as HTTP/2 carries them: refused, not folded.
        assert!(parse_header("X-Team=a").is_err());
        assert!(parse_header_file("api key=/k").is_err());
        assert!(parse_header("novalue").is_err());
        let mut config = RunConfig::default();
        let error = apply_file(
            &mut config,
            "remote-headers = { \"Bad Name\" = \"a\" }\n",
            Path::new("x.toml"),
        )
        .unwrap_err();
        assert!(error.to_string().contains("remote-headers"), "{error}");
    }

    #[test]
    fn reference_file_documents_the_defaults() {
        // packaging/scorch.toml lists every key with its default value, commented out; with
        // the comment markers removed it must parse to exactly the defaults.
        let reference = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/scorch.toml"),
        )
        .unwrap();
        let uncommented: String = reference
            .lines()
            .filter_map(|l| l.strip_prefix("# ").filter(|l| l.contains(" = ")))
            .map(|l| format!("{l}\n"))
            .collect();
        let file: FileConfig = toml::from_str(&uncommented).unwrap();
        // Every key is there.
        let keys = [
            file.store.is_some(),
            file.http_address.is_some(),
            file.http_allowed_hosts.is_some(),
            file.window.is_some(),
            file.frequency.is_some(),
            file.retention_age.is_some(),
            file.retention_size.is_some(),
            file.symbolize.is_some(),
            file.symbol_cache_mb.is_some(),
            file.include_idle.is_some(),
            file.unwind.is_some(),
            file.unwind_processes.is_some(),
            file.unwind_pool_mib.is_some(),
            file.stack_map_entries.is_some(),
            file.python.is_some(),
            file.jvm.is_some(),
            file.node.is_some(),
            file.off_cpu.is_some(),
            file.off_cpu_mean.is_some(),
            file.off_cpu_min.is_some(),
            file.off_cpu_max_events.is_some(),
            file.thread_ids.is_some(),
            file.remote_url.is_some(),
            file.remote_protocol.is_some(),
            file.remote_insecure.is_some(),
            file.remote_bearer_token_file.is_some(),
            file.remote_basic_auth_user.is_some(),
            file.remote_basic_auth_password_file.is_some(),
            file.remote_tenant.is_some(),
            file.remote_ca_file.is_some(),
            file.remote_timeout.is_some(),
            file.remote_upload_debuginfo.is_some(),
            file.remote_headers.is_some(),
            file.remote_header_files.is_some(),
            file.remote_compression.is_some(),
        ];
        assert!(keys.iter().all(|&k| k), "{file:?}");
        let mut config = RunConfig::default();
        apply_file(&mut config, &uncommented, Path::new("scorch.toml")).unwrap();
        // Keys without a default are shown with an example value: set, and nothing else moved.
        let remote = &config.remote;
        assert!(remote.url.is_some() && remote.tenant.is_some() && remote.ca_file.is_some());
        assert!(remote.bearer_token_file.is_some() && remote.basic_auth_user.is_some());
        assert!(remote.basic_auth_password_file.is_some());
        config.remote = RemoteConfig {
            url: None,
            bearer_token_file: None,
            basic_auth_user: None,
            basic_auth_password_file: None,
            tenant: None,
            ca_file: None,
            headers: Vec::new(),
            header_files: Vec::new(),
            ..config.remote
        };
        assert_eq!(config, RunConfig::default());
    }

    #[test]
    fn off_cpu_keys_come_from_the_file_and_the_flags() {
        let mut config = RunConfig::default();
        assert!(!config.off_cpu);
        apply_file(
            &mut config,
            "off-cpu = true\noff-cpu-mean = \"5ms\"\noff-cpu-min = \"50us\"\n\
             off-cpu-max-events = 2000\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert!(config.off_cpu);
        assert_eq!(config.off_cpu_sampling.mean, Duration::from_millis(5));
        assert_eq!(config.off_cpu_sampling.min, Duration::from_micros(50));
        assert_eq!(config.off_cpu_sampling.max_events_per_second, 2000);
        apply_flags(
            &mut config,
            &RunArgs {
                off_cpu_mean: Some(Duration::from_millis(20)),
                ..RunArgs::default()
            },
        );
        assert_eq!(config.off_cpu_sampling.mean, Duration::from_millis(20));
        assert_eq!(
            config.off_cpu_settings().map(|s| s.max_events_per_second),
            Some(2000)
        );
        for (text, key) in [
            ("off-cpu-mean = \"0s\"\n", "off-cpu-mean"),
            ("off-cpu-min = \"soon\"\n", "off-cpu-min"),
            ("off-cpu-max-events = 0\n", "off-cpu-max-events"),
        ] {
            let err = apply_file(&mut RunConfig::default(), text, Path::new("x.toml"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("key `{key}`")), "{err}");
        }
        let err = apply_file(&mut config, "off-cpu = \"yes\"\n", Path::new("x.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("off-cpu"), "{err}");
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let mut config = RunConfig::default();
        apply_file(
            &mut config,
            "store = \"/srv/scorch\"\nwindow = \"5s\"\nretention-size = \"64MiB\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        apply_flags(
            &mut config,
            &RunArgs {
                window: Some(Duration::from_secs(2)),
                ..RunArgs::default()
            },
        );
        assert_eq!(config.store, PathBuf::from("/srv/scorch"));
        assert_eq!(config.window, Duration::from_secs(2));
        assert_eq!(config.retention.max_bytes, 64 << 20);
        assert_eq!(config.http_address.to_string(), "127.0.0.1:7071");
    }

    #[test]
    fn bad_files_name_the_file_and_key() {
        let mut config = RunConfig::default();
        let err = apply_file(
            &mut config,
            "window = \"soon\"\n",
            Path::new("/etc/scorch.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("config file /etc/scorch.toml: key `window`"),
            "{err}"
        );
        let err = apply_file(
            &mut config,
            "colour = \"red\"\n",
            Path::new("/etc/scorch.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `colour`"), "{err}");
        let err = apply_file(
            &mut config,
            "http-address = \"localhost\"\n",
            Path::new("a.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("http-address"), "{err}");
    }

    #[test]
    fn parses_sizes_and_ages() {
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("100MB").unwrap(), 100_000_000);
        assert!(parse_bytes("10").unwrap_err().contains("at least 1MiB"));
        assert!(parse_bytes("1 parsec").is_err());
        assert_eq!(
            parse_retention_age("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(
            parse_retention_age("90m").unwrap(),
            Duration::from_secs(5400)
        );
        assert!(parse_retention_age("0d").is_err());
    }
}
